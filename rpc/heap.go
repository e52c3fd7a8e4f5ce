package rpc

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
)

// heap is a client's session heap: one allocation from which buffers are
// lent, first fit over a sorted free list. It is not registered as a
// whole: a call registers just the spans it lends. Its memory is made at
// the first Alloc: a client that passes everything by value (most do)
// holds none, where each had held 16 MiB of Go heap (the default size)
// from Dial on.
type heap struct {
	mu   sync.Mutex
	size int
	mem  []byte   // nil until the first alloc
	free []extent // sorted by offset, coalesced
}

type extent struct{ off, n int }

const heapAlign = 64

func (h *heap) init(size int) {
	h.size = size
	h.free = []extent{{0, size}}
}

// alloc lends n bytes: their offset and memory.
func (h *heap) alloc(n int) (int, []byte, bool) {
	if n > h.size {
		return 0, nil, false // and n+heapAlign-1 cannot overflow below
	}
	want := n
	n = (n + heapAlign - 1) &^ (heapAlign - 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mem == nil {
		h.mem = make([]byte, h.size)
	}
	for i, e := range h.free {
		if e.n >= n {
			if e.n == n {
				h.free = append(h.free[:i], h.free[i+1:]...)
			} else {
				h.free[i] = extent{e.off + n, e.n - n}
			}
			return e.off, h.mem[e.off : e.off+want : e.off+want], true
		}
	}
	return 0, nil, false
}

func (h *heap) release(off, n int) {
	n = (n + heapAlign - 1) &^ (heapAlign - 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	i := sort.Search(len(h.free), func(i int) bool { return h.free[i].off > off })
	h.free = append(h.free, extent{})
	copy(h.free[i+1:], h.free[i:])
	h.free[i] = extent{off, n}
	// Coalesce with the next, then the previous.
	if i+1 < len(h.free) && h.free[i].off+h.free[i].n == h.free[i+1].off {
		h.free[i].n += h.free[i+1].n
		h.free = append(h.free[:i+1], h.free[i+2:]...)
	}
	if i > 0 && h.free[i-1].off+h.free[i-1].n == h.free[i].off {
		h.free[i-1].n += h.free[i].n
		h.free = append(h.free[:i], h.free[i+1:]...)
	}
}

// Buffer is memory of a client's session heap, to be lent to calls by
// reference (Span). Write the argument into Bytes before the call; read
// what a server wrote into a writable span after it.
type Buffer struct {
	c     *Client
	off   int
	data  []byte
	freed atomic.Bool
}

// Alloc lends n bytes of the session heap, or fails with ErrHeapFull
// when no free run of the heap holds them.
func (c *Client) Alloc(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("rpc: alloc of %d bytes", n)
	}
	off, data, ok := c.heap.alloc(n)
	if !ok {
		return nil, fmt.Errorf("%w: %d bytes, none free for %d", ErrHeapFull, c.heap.size, n)
	}
	return &Buffer{c: c, off: off, data: data}, nil
}

// Bytes returns the buffer's memory.
func (b *Buffer) Bytes() []byte { return b.data }

// Free returns the buffer to the heap. Calls that lent it have revoked
// their windows before they returned, so no peer can reach it any more.
func (b *Buffer) Free() {
	if b.freed.Swap(true) {
		return
	}
	b.c.heap.release(b.off, len(b.data))
}

// Span is part of a Buffer lent to one call: read-only unless made
// Writable.
type Span struct {
	buf    *Buffer
	off, n int
	write  bool
}

// Span returns bytes [off, off+n) of the buffer, read-only. A range
// outside the buffer panics, as slicing past a slice's end does.
func (b *Buffer) Span(off, n int) Span {
	if off < 0 || n < 0 || off > len(b.data) || n > len(b.data)-off {
		panic(fmt.Sprintf("rpc: span of %d bytes at %d of a %d-byte buffer", n, off, len(b.data)))
	}
	return Span{buf: b, off: off, n: n}
}

// All returns the whole buffer as a read-only span.
func (b *Buffer) All() Span { return Span{buf: b, n: len(b.data)} }

// Writable returns the span with the server allowed to write it too.
func (s Span) Writable() Span { s.write = true; return s }

// Len returns the span's length.
func (s Span) Len() int { return s.n }
