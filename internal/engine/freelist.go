package engine

import (
	"runtime"
	"sync"
)

// freeList is a bounded stack of buffers taken while a queue pair needs
// them and given back when it is idle, so that thousands of idle queue
// pairs share the few buffers the work in flight at any moment needs.
//
// It is not a sync.Pool: a pool is emptied by the GC's second cycle
// without use and, under the race detector, drops a quarter of what is
// put at random, so a post would allocate a buffer now and then. The
// stack keeps every buffer given back (up to limit), as many as were out
// at once, so that the busiest moment's load, however many queue pairs
// it takes, runs again without allocating; the most recently given back
// (the warmest in cache) is taken first. The lock is held for a few
// instructions, once per batch or wait rather than per FPDU.
//
// What a burst left behind does not stay for ever, though: at each
// garbage collection the list lets go of half the buffers that none took
// since the previous one (see trim), so the memory of a burst of a
// thousand clients goes back to the heap within a few cycles of their
// leaving (Go collects at least every two minutes), while buffers in use
// between two collections are kept.
type freeList[T any] struct {
	mu   sync.Mutex
	free []*T
	out  int // buffers taken and not given back
	// low is the fewest free since the last trim: buffers none took. It
	// is at most len(free), which only a get lowers.
	low   int
	limit int
	make  func() *T
}

// newFreeList returns a free list of buffers made by mk that keeps up to
// limit of them.
func newFreeList[T any](limit int, mk func() *T) *freeList[T] {
	f := &freeList[T]{limit: limit, make: mk}
	freeLists.add(f)
	return f
}

// get returns a kept buffer, or a new one.
func (f *freeList[T]) get() *T {
	f.mu.Lock()
	f.out++
	if n := len(f.free); n > 0 {
		b := f.free[n-1]
		f.free[n-1] = nil
		f.free = f.free[:n-1]
		f.low = min(f.low, n-1)
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
	if len(f.free) < f.limit {
		f.free = append(f.free, b)
	}
	f.mu.Unlock()
}

// trim lets go of half the buffers none took since the last trim (half
// rounded up, so that the last one goes too), the coldest first: the
// bottom of the stack.
func (f *freeList[T]) trim() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if drop := (f.low + 1) / 2; drop > 0 {
		n := copy(f.free, f.free[drop:])
		clear(f.free[n:])
		f.free = f.free[:n]
	}
	f.low = len(f.free)
}

// trimmer is what the garbage collector's hook trims.
type trimmer interface{ trim() }

// freeLists are the process's free lists, trimmed after each garbage
// collection.
var freeLists trimmers

type trimmers struct {
	mu    sync.Mutex
	lists []trimmer
	arm   sync.Once // the hook, armed by the first list
}

func (t *trimmers) add(l trimmer) {
	t.mu.Lock()
	t.lists = append(t.lists, l)
	t.mu.Unlock()
	t.arm.Do(armGCHook)
}

func (t *trimmers) trimAll() {
	t.mu.Lock()
	lists := t.lists
	t.mu.Unlock()
	for _, l := range lists {
		l.trim()
	}
}

// gcSentinel is an object made to be collected: its cleanup runs once a
// garbage collection has found it unreachable, trims the free lists and
// makes the next. (Not a zero-size or tiny object: those may share an
// allocation that stays reachable.)
type gcSentinel struct{ _ [16]uint64 }

func armGCHook() {
	runtime.AddCleanup(new(gcSentinel), func(struct{}) {
		freeLists.trimAll()
		armGCHook()
	}, struct{}{})
}
