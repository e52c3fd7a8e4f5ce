//go:build linux && race

package engine

import (
	"net"
	"runtime"
	"sync"
	"unsafe"
)

// The race detector cannot see that the bytes of a TCP connection order
// what its writer did before a write before what its reader does after
// reading them: that a peer placed a Write before it sent the response
// to the Read that follows, which a test in the same process relies on
// when it looks at the peer's memory after the Read completes. The two
// ends of one connection in one process (the tests') tell it with a
// release before each write and an acquire after each read on an
// address they share, found by the connection's two addresses.

var (
	linkRaceMu    sync.Mutex
	linkRaceAddrs = map[[2]string]*byte{}
)

// linkRaceAddr returns the address standing for c's byte stream, the
// same at both of its ends.
func linkRaceAddr(c net.Conn) unsafe.Pointer {
	a, b := c.LocalAddr().String(), c.RemoteAddr().String()
	if b < a {
		a, b = b, a
	}
	linkRaceMu.Lock()
	defer linkRaceMu.Unlock()
	p := linkRaceAddrs[[2]string{a, b}]
	if p == nil {
		p = new(byte)
		linkRaceAddrs[[2]string{a, b}] = p
	}
	return unsafe.Pointer(p)
}

func linkRelease(p unsafe.Pointer) { runtime.RaceReleaseMerge(p) }
func linkAcquire(p unsafe.Pointer) { runtime.RaceAcquire(p) }

// wireCopy copies registered memory into a flattened write (see
// flatten), as the kernel copies what sendmsg sends: out of the race
// detector's sight. Like a NIC's reads for a Read Response or a Write,
// it may meet the application's own writes to that memory, which RDMA
// leaves to the application to order (the cache's readers check
// versions); seen as the program's, the copy made the cache's
// TestIndexConcurrentUpdates fail under -race about one run in three.
//
//go:norace
func wireCopy(dst, src []byte) int {
	n := min(len(dst), len(src))
	for i := 0; i < n; i++ {
		dst[i] = src[i]
	}
	return n
}
