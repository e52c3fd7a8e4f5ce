package mem

import "unsafe"

// Word returns the 8 bytes at offset off of the region as a *uint64 for
// sync/atomic, or nil when they are not 8-aligned in memory or lie across
// two of the region's buffers. Remote atomics (RFC 7306) and local ones
// (MR.AtomicAdd, MR.CompareAndSwap) go through it, so they are atomic
// against each other.
func (r *Region) Word(off uint64) *uint64 {
	if off+8 < off || off+8 > r.length {
		return nil
	}
	var one [1][]byte
	s := r.Slices(one[:0], off, 8)
	if len(s) != 1 || len(s[0]) != 8 {
		return nil
	}
	return wordOf(s[0])
}

// wordOf returns b's first 8 bytes as a *uint64, or nil if they are not
// 8-aligned in memory.
func wordOf(b []byte) *uint64 {
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%8 != 0 {
		return nil
	}
	return (*uint64)(p)
}

// WriteWord is Word for an atomic that may change the word, under a
// write hold (TryHoldWrite): the word's page is copied first for the
// snapshots that still share it, as WriteSlices does, so that no snapshot
// sees an atomic that came after it.
func (r *Region) WriteWord(off uint64) *uint64 {
	if off+8 < off || off+8 > r.length {
		return nil
	}
	if r.wuse.Load()&wCOW != 0 {
		r.unshare(off, 8)
	}
	return r.Word(off)
}
