package engine

import (
	"runtime"
	"testing"
	"time"
)

func freeLen[T any](f *freeList[T]) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.free)
}

// TestFreeListTrim: each trim lets go of half the buffers none took since
// the last (rounded up), the coldest first; a buffer taken between two
// trims stays, and what was let go is not kept again when it comes back.
func TestFreeListTrim(t *testing.T) {
	made := 0
	f := &freeList[[64]byte]{limit: 16, make: func() *[64]byte { made++; return new([64]byte) }}
	var bs []*[64]byte
	for range 10 {
		bs = append(bs, f.get())
	}
	for _, b := range bs {
		f.put(b)
	}
	hot := bs[len(bs)-1] // the last given back: on top
	if n := freeLen(f); n != 10 {
		t.Fatalf("%d free after a burst of 10, want 10", n)
	}
	f.trim() // all ten were taken since the list began
	if n := freeLen(f); n != 10 {
		t.Fatalf("first trim: %d free, want 10 (all were in use since the last)", n)
	}
	for i, want := range []int{5, 2, 1, 0} {
		if want == 0 && f.free[0] != hot {
			t.Fatal("the last kept is not the warmest (the last given back)")
		}
		f.trim() // none taken since the last
		if n := freeLen(f); n != want {
			t.Fatalf("trim %d: %d free, want %d", i+2, n, want)
		}
	}
	// A buffer in use between trims is kept.
	made = 0
	b := f.get()
	f.put(b)
	for range 5 {
		b = f.get()
		f.put(b)
		f.trim()
	}
	if n := freeLen(f); n != 1 || made != 1 {
		t.Fatalf("a buffer taken between trims: %d free, %d made; want 1 and 1", n, made)
	}
	// It keeps no more than its limit.
	var out []*[64]byte
	for range 20 {
		out = append(out, f.get())
	}
	for _, b := range out {
		f.put(b)
	}
	if n := freeLen(f); n != 16 {
		t.Fatalf("%d free after 20 given back, want the limit, 16", n)
	}
}

// TestFreeListTrimOnGC: the free lists are trimmed after garbage
// collections, with no clock: what a burst left goes within a few cycles.
func TestFreeListTrimOnGC(t *testing.T) {
	f := newFreeList(64, func() *[4096]byte { return new([4096]byte) })
	var bs []*[4096]byte
	for range 32 {
		bs = append(bs, f.get())
	}
	for _, b := range bs {
		f.put(b)
	}
	bs = nil
	deadline := time.Now().Add(10 * time.Second)
	for freeLen(f) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 32 buffers still kept after 10 s of collections", freeLen(f))
		}
		runtime.GC()
		time.Sleep(time.Millisecond) // cleanups run on their own goroutine
	}
}
