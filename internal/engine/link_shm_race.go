//go:build linux && race

package engine

import (
	"runtime"
	"sync"
	"unsafe"
)

// The race detector cannot see that a ring's head, moved in memory
// outside Go's heap, orders the writer's reads of registered memory
// before the reader's writes into the peer's, as the completions that
// follow rely on; the links of one file in one process (the tests') tell
// it with a release and an acquire on an address they share.

var (
	shmRaceMu    sync.Mutex
	shmRaceAddrs = map[[16]byte]*[2]byte{}
)

// shmRaceAddr returns the address standing for ring i of the file id.
func shmRaceAddr(id [16]byte, i int) unsafe.Pointer {
	shmRaceMu.Lock()
	defer shmRaceMu.Unlock()
	p := shmRaceAddrs[id]
	if p == nil {
		p = new([2]byte)
		shmRaceAddrs[id] = p
	}
	return unsafe.Pointer(&p[i])
}

func shmRelease(p unsafe.Pointer) { runtime.RaceReleaseMerge(p) }
func shmAcquire(p unsafe.Pointer) { runtime.RaceAcquire(p) }
