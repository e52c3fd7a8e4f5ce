package engine

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/mem"
)

// chunkLink delivers the stream in reads of at most chunk bytes, and can
// cut the connection after a given number of bytes written.
type chunkLink struct {
	streamLink
	chunk int
	mu    sync.Mutex
	left  int // bytes that may still be written; <0: no limit
}

func (l *chunkLink) Readv(bufs [][]byte) (int, error) {
	for _, b := range bufs {
		if len(b) > 0 {
			return l.c.Read(b[:min(len(b), l.chunk)])
		}
	}
	return 0, nil
}

func (l *chunkLink) Writev(bufs [][]byte, _ []int, block bool) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, b := range bufs {
		if l.left >= 0 && len(b) > l.left {
			k, _ := l.c.Write(b[:l.left])
			l.left = 0
			l.c.Close()
			return n + k, net.ErrClosed
		}
		k, err := l.c.Write(b)
		n += k
		if l.left >= 0 {
			l.left -= k
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

type rig struct {
	table    *mem.Table
	a, b     *QP
	acq, bcq *CQ
}

// newRig connects two QPs over an in-memory pipe, skipping MPA.
func newRig(t *testing.T, chunk, cutAfter int, crc bool) *rig {
	t.Helper()
	r := &rig{table: mem.NewTable(), acq: NewCQ(1024), bcq: NewCQ(1024)}
	var err error
	if r.a, err = NewQP(Config{SendDepth: 64, RecvDepth: 64, SendCQ: r.acq, RecvCQ: r.acq, PD: 1, Table: r.table}); err != nil {
		t.Fatal(err)
	}
	if r.b, err = NewQP(Config{SendDepth: 64, RecvDepth: 64, SendCQ: r.bcq, RecvCQ: r.bcq, PD: 1, Table: r.table}); err != nil {
		t.Fatal(err)
	}
	ca, cb := net.Pipe()
	la := &chunkLink{streamLink: streamLink{c: ca}, chunk: chunk, left: cutAfter}
	lb := &chunkLink{streamLink: streamLink{c: cb}, chunk: chunk, left: -1}
	p := Params{CRC: crc, IRD: 4, ORD: 4, MaxFPDU: 200}
	if err := r.a.Start(la, p); err != nil {
		t.Fatal(err)
	}
	if err := r.b.Start(lb, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.a.Close(); r.b.Close() })
	return r
}

func (r *rig) reg(t *testing.T, n int, acc mem.Access) (*mem.Region, []byte) {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*13 + 5)
	}
	m, err := r.table.Register(1, [][]byte{b}, acc, mem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m, b
}

func next(t *testing.T, cq *CQ) Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]Completion
	for cq.Poll(wc[:]) == 0 {
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("no completion: %v", err)
		}
	}
	return wc[0]
}

// TestAnyFragmentation: the receive path accepts the stream however it is
// cut, down to one byte per read, with and without CRC, across FPDUs of
// every kind (multi-FPDU Writes, Sends and Read Responses at 200-byte FPDUs).
func TestAnyFragmentation(t *testing.T) {
	for _, crc := range []bool{false, true} {
		for _, chunk := range []int{1, 2, 3, 5, 7, 13, 64, 1000} {
			r := newRig(t, chunk, -1, crc)
			src, sbuf := r.reg(t, 3001, 0)
			dst, dbuf := r.reg(t, 3001, mem.RemoteWrite|mem.RemoteRead|mem.LocalWrite)
			back, bbuf := r.reg(t, 3001, mem.LocalWrite)
			recv, rbuf := r.reg(t, 3001, mem.LocalWrite)
			clear(dbuf)
			clear(bbuf)
			clear(rbuf)
			r.b.PostRecv(&RecvWR{ID: 9, SGL: []SGE{{MR: recv, Length: 3001}}})
			r.a.PostSend(&SendWR{ID: 1, Op: OpWrite, SGL: []SGE{{MR: src, Length: 3001}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())})
			r.a.PostSend(&SendWR{ID: 2, Op: OpRead, Flags: Signaled, SGL: []SGE{{MR: back, Length: 3001}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())})
			r.a.PostSend(&SendWR{ID: 3, Op: OpSend, Flags: Signaled, SGL: []SGE{{MR: src, Length: 3001}}})
			if c := next(t, r.acq); c.ID != 2 || c.Status != Success {
				t.Fatalf("chunk %d crc %v: %+v (%v)", chunk, crc, c, r.a.Err())
			}
			if c := next(t, r.acq); c.ID != 3 || c.Status != Success {
				t.Fatalf("chunk %d crc %v: %+v", chunk, crc, c)
			}
			if c := next(t, r.bcq); c.ID != 9 || c.Bytes != 3001 {
				t.Fatalf("chunk %d crc %v: recv %+v", chunk, crc, c)
			}
			if dst.Placed() != 3001 || !bytes.Equal(dbuf, sbuf) || !bytes.Equal(bbuf, sbuf) || !bytes.Equal(rbuf, sbuf) {
				t.Fatalf("chunk %d crc %v: data differs", chunk, crc)
			}
		}
	}
}

// TestCutAnywhere: the connection dies after every possible number of
// bytes of a mixed exchange. Both QPs end in error, every work request
// completes exactly once (successfully or flushed), nothing hangs.
func TestCutAnywhere(t *testing.T) {
	// The whole exchange is a little under 2 KiB with 200-byte FPDUs.
	for cut := 0; cut < 2100; cut += 7 {
		r := newRig(t, 64, cut, true)
		src, _ := r.reg(t, 1000, 0)
		dst, _ := r.reg(t, 1000, mem.RemoteWrite|mem.RemoteRead|mem.LocalWrite)
		back, _ := r.reg(t, 1000, mem.LocalWrite)
		recv, _ := r.reg(t, 1000, mem.LocalWrite)
		r.b.PostRecv(&RecvWR{ID: 100, SGL: []SGE{{MR: recv, Length: 1000}}})
		r.b.PostRecv(&RecvWR{ID: 101, SGL: []SGE{{MR: recv, Length: 1000}}})
		posted := 0
		for i, wr := range []SendWR{
			{ID: 1, Op: OpWrite, Flags: Signaled, SGL: []SGE{{MR: src, Length: 1000}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())},
			{ID: 2, Op: OpRead, Flags: Signaled, SGL: []SGE{{MR: back, Length: 500}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())},
			{ID: 3, Op: OpSend, Flags: Signaled, SGL: []SGE{{MR: src, Length: 300}}},
			{ID: 4, Op: OpSend, Flags: Signaled, SGL: []SGE{{MR: src, Length: 10}}},
		} {
			if err := r.a.PostSend(&wr); err != nil {
				if !errors.Is(err, ErrNotReady) {
					t.Fatalf("cut %d: post %d: %v", cut, i, err)
				}
				continue
			}
			posted++
		}
		// Tear b down from its side too if a survived (a complete exchange).
		seen := map[uint64]bool{}
		for range posted {
			c := next(t, r.acq)
			if seen[c.ID] {
				t.Fatalf("cut %d: WR %d completed twice", cut, c.ID)
			}
			seen[c.ID] = true
			if c.Status != Success && c.Status != WRFlushError {
				t.Fatalf("cut %d: WR %d status %v", cut, c.ID, c.Status)
			}
		}
		r.a.Close()
		r.b.Close()
		for range 2 {
			c := next(t, r.bcq)
			if c.Status != Success && c.Status != WRFlushError {
				t.Fatalf("cut %d: receive %d status %v", cut, c.ID, c.Status)
			}
		}
		if r.a.State() != StateError || r.b.State() != StateError {
			t.Fatalf("cut %d: states %v %v", cut, r.a.State(), r.b.State())
		}
	}
}

// TestCQOnlyQP: a CQ knows its one queue pair, so that a waiter can
// receive on it inline, also once a second queue pair has come and gone.
func TestCQOnlyQP(t *testing.T) {
	cq := NewCQ(4)
	a, b := &QP{}, &QP{}
	cq.attach(a)
	cq.attach(b)
	if q := cq.onlyLocked(); q != nil {
		t.Fatalf("two queue pairs, only %p", q)
	}
	cq.detach(a)
	if q := cq.onlyLocked(); q != b {
		t.Fatalf("after one left, only %p, want %p", q, b)
	}
}

// TestCQPollEmpty: a poll of an empty queue returns at once without the
// queue's lock, which a push may be holding (a spinning poller contended
// with the receive path for it, and paid three atomic operations per
// empty look); a queue with completions, or an overrun to report, is
// polled under the lock as before.
func TestCQPollEmpty(t *testing.T) {
	cq := NewCQ(1)
	var out [2]Completion
	cq.mu.Lock()
	done := make(chan int)
	go func() { done <- cq.Poll(out[:]) }()
	select {
	case n := <-done:
		if n != 0 {
			t.Fatalf("empty poll: %d", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an empty poll waited for the queue's lock")
	}
	cq.mu.Unlock()
	if !cq.push(&Completion{ID: 1}, true) || cq.push(&Completion{ID: 2}, true) {
		t.Fatal("depth 1: want one push taken and one overrun")
	}
	if n := cq.Poll(out[:]); n != 1 || out[0].ID != 1 {
		t.Fatalf("poll: %d, %+v", n, out[0])
	}
	// Drained but overrun: Wait must still report it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cq.Wait(ctx); !errors.Is(err, ErrCQOverrun) {
		t.Fatalf("Wait after the overrun: %v", err)
	}
}

// TestCQGrows: a queue's ring starts small and grows as completions wait,
// up to the depth asked, which alone bounds it: the completions come out
// in order across every growth, from any place the ring had wrapped to,
// and the one past the depth is an overrun.
func TestCQGrows(t *testing.T) {
	for _, depth := range []int{1, 63, 64, 65, 300, 1 << 30} {
		cq := NewCQ(depth)
		if cq.Cap() != depth {
			t.Fatalf("depth %d: Cap %d", depth, cq.Cap())
		}
		if len(cq.ring) > cqFirst {
			t.Fatalf("depth %d: a ring of %d entries at first", depth, len(cq.ring))
		}
		var out [7]Completion
		pushed, polled := uint64(0), uint64(0)
		push := func() bool {
			pushed++
			return cq.push(&Completion{ID: pushed}, true)
		}
		take := func(k int) {
			n := cq.Poll(out[:k])
			for _, c := range out[:n] {
				polled++
				if c.ID != polled {
					t.Fatalf("depth %d: completion %d came out %d-th", depth, c.ID, polled)
				}
			}
		}
		// Wrap the first ring: fill most of it, take some, fill again.
		for range min(depth, cqFirst) - 1 {
			push()
		}
		take(5)
		// Then fill to the depth (at most 1,000), taking a few on the way.
		want := min(depth, 1000)
		for i := 0; cq.Len() < want; i++ {
			if !push() {
				t.Fatalf("depth %d: overrun with %d waiting", depth, cq.Len())
			}
			if i%97 == 0 && cq.Len() < want-7 {
				take(7)
			}
		}
		if depth <= 1000 {
			if push() {
				t.Fatalf("depth %d: no overrun with the queue full", depth)
			}
			pushed-- // lost
			if len(cq.ring) != depth {
				t.Errorf("depth %d: ring of %d at its fullest", depth, len(cq.ring))
			}
		}
		for cq.Len() > 0 {
			take(7)
		}
		if polled != pushed {
			t.Fatalf("depth %d: %d completions out of %d", depth, polled, pushed)
		}
	}
}
