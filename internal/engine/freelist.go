package engine

import "sync"

// freeList is a bounded stack of buffers taken while a queue pair needs
// them and given back when it is idle, so that thousands of idle queue
// pairs share the few buffers the work in flight at any moment needs.
//
// It is not a sync.Pool: a pool is emptied by the GC's second cycle
// without use and, under the race detector, drops a quarter of what is
// put at random, so a post would allocate a buffer now and then. The
// stack keeps as many buffers as were ever out at once (up to limit), so
// that the busiest moment's load, however many queue pairs it takes, runs
// again without allocating; the most recently given back (the warmest in
// cache) is taken first. The lock is held for a few instructions, once
// per batch or wait rather than per FPDU.
type freeList[T any] struct {
	mu    sync.Mutex
	free  []*T
	out   int // buffers taken and not given back
	peak  int // the most ever out at once: how many the list keeps
	limit int
	make  func() *T
}

// newFreeList returns a free list of buffers made by mk that keeps up to
// limit of them.
func newFreeList[T any](limit int, mk func() *T) *freeList[T] {
	return &freeList[T]{limit: limit, make: mk}
}

// get returns a kept buffer, or a new one.
func (f *freeList[T]) get() *T {
	f.mu.Lock()
	f.out++
	f.peak = max(f.peak, f.out)
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
	f.out--
	if len(f.free) < min(f.peak, f.limit) {
		f.free = append(f.free, b)
	}
	f.mu.Unlock()
}
