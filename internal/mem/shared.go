package mem

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Shared is the memory of a region made by RegisterShared: a sealed
// memfd mapped shared, which a peer process on this host maps too (by
// /proc/<PID>/fd/<FD>, checked against Ino), so that a shared-memory
// link hands it bytes of the region by reference and the peer copies
// them once, straight to their place. RegisterAnon's private memory
// uses it too, with FD -1, and is never listed.
type Shared struct {
	ID   uint32 // unique in the process
	PID  int
	FD   int
	Ino  uint64
	Size int
	mem  []byte
	dead atomic.Bool
}

// Dead reports whether the region is gone: a link that told a peer of
// the segment tells it to forget it.
func (s *Shared) Dead() bool { return s.dead.Load() }

var (
	sharedMu    sync.Mutex
	sharedSegs  atomic.Pointer[[]*Shared] // by address, replaced whole
	sharedFrees atomic.Uint64
	sharedIDs   atomic.Uint32
)

// SharedFrees counts the shared regions deregistered: a link looks for
// dead segments only when it has changed.
func SharedFrees() uint64 { return sharedFrees.Load() }

// FindShared returns the shared segment that holds all of b and b's
// offset in it, or nil. It takes no lock and allocates nothing.
func FindShared(b []byte) (*Shared, int) {
	p := sharedSegs.Load()
	if p == nil || len(b) == 0 {
		return nil, 0
	}
	segs := *p
	a := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	i, found := slices.BinarySearchFunc(segs, a, func(s *Shared, a uintptr) int { return cmp.Compare(s.base(), a) })
	if !found {
		if i == 0 {
			return nil, 0
		}
		i--
	}
	s := segs[i]
	off := int(a - s.base())
	if off+len(b) > len(s.mem) {
		return nil, 0
	}
	return s, off
}

// base is the address of the segment's first byte.
func (s *Shared) base() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(s.mem))) }

func addShared(s *Shared) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	var segs []*Shared
	if p := sharedSegs.Load(); p != nil {
		segs = slices.Clone(*p)
	}
	segs = append(segs, s)
	slices.SortFunc(segs, func(x, y *Shared) int {
		return cmp.Compare(x.base(), y.base())
	})
	sharedSegs.Store(&segs)
}

func removeShared(s *Shared) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	p := sharedSegs.Load()
	if p == nil {
		return
	}
	segs := slices.DeleteFunc(slices.Clone(*p), func(x *Shared) bool { return x == s })
	sharedSegs.Store(&segs)
	s.dead.Store(true)
	sharedFrees.Add(1)
}
