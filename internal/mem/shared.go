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
// them once, straight to their place.
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
	i, j := 0, len(segs)
	for i < j { // the first segment that starts after a
		h := int(uint(i+j) >> 1)
		if uintptr(unsafe.Pointer(unsafe.SliceData(segs[h].mem))) <= a {
			i = h + 1
		} else {
			j = h
		}
	}
	if i == 0 {
		return nil, 0
	}
	s := segs[i-1]
	off := int(a - uintptr(unsafe.Pointer(unsafe.SliceData(s.mem))))
	if off+len(b) > len(s.mem) {
		return nil, 0
	}
	return s, off
}

func addShared(s *Shared) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	var segs []*Shared
	if p := sharedSegs.Load(); p != nil {
		segs = slices.Clone(*p)
	}
	segs = append(segs, s)
	slices.SortFunc(segs, func(x, y *Shared) int {
		return cmp.Compare(uintptr(unsafe.Pointer(unsafe.SliceData(x.mem))), uintptr(unsafe.Pointer(unsafe.SliceData(y.mem))))
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

// IsShared reports whether the region's memory is shared (RegisterShared).
func (r *Region) IsShared() bool { return r.shared != nil }

// SharedID returns the segment id of a shared region, 0 for others.
func (r *Region) SharedID() uint32 {
	if r.shared == nil {
		return 0
	}
	return r.shared.ID
}
