package engine

import "sync"

// freeList is a bounded stack of buffers taken while a queue pair needs
// them and given back when it is idle, so that thousands of idle queue
// pairs share the few buffers the work in flight at any moment needs.
//
// It is not a sync.Pool: a pool is emptied by the GC's second cycle
// without use and, under the race detector, drops a quarter of what is
// put at random, so a post would allocate a buffer now and then. A stack
// of a bounded size keeps the buffers of the busiest moment up to that
// number and lets the GC have the rest; the most recently given back (the
// warmest in cache) is taken first. The lock is held for a few
// instructions, once per batch or wait rather than per FPDU.
type freeList[T any] struct {
	mu   sync.Mutex
	free []*T
	make func() *T
}

// newFreeList returns a free list that keeps at most max buffers, made
// by mk.
func newFreeList[T any](max int, mk func() *T) *freeList[T] {
	return &freeList[T]{free: make([]*T, 0, max), make: mk}
}

// get returns a kept buffer, or a new one.
func (f *freeList[T]) get() *T {
	f.mu.Lock()
	if n := len(f.free); n > 0 {
		b := f.free[n-1]
		f.free[n-1] = nil
		f.free = f.free[:n-1]
		f.mu.Unlock()
		return b
	}
	f.mu.Unlock()
	return f.make()
}

// put gives b back; the caller no longer uses it.
func (f *freeList[T]) put(b *T) {
	f.mu.Lock()
	if len(f.free) < cap(f.free) {
		f.free = append(f.free, b)
	}
	f.mu.Unlock()
}
