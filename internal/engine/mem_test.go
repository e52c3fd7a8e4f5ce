//go:build linux

package engine

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/mem"
)

// newTCPRig connects two QPs over a loopback TCP connection with the
// descriptor-level link, skipping MPA.
func newTCPRig(t *testing.T, p Params) *rig {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ca, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cb, err := ln.Accept()
	if err != nil {
		ca.Close()
		t.Fatal(err)
	}
	r := &rig{table: mem.NewTable(), acq: NewCQ(64), bcq: NewCQ(64)}
	if r.a, err = NewQP(Config{SendDepth: 16, RecvDepth: 16, SendCQ: r.acq, RecvCQ: r.acq, PD: 1, Table: r.table}); err != nil {
		t.Fatal(err)
	}
	if r.b, err = NewQP(Config{SendDepth: 16, RecvDepth: 16, SendCQ: r.bcq, RecvCQ: r.bcq, PD: 1, Table: r.table}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.a.Close(); r.b.Close(); ca.Close(); cb.Close() })
	if err := r.a.Start(NewLink(ca), p); err != nil {
		t.Fatal(err)
	}
	if err := r.b.Start(NewLink(cb), p); err != nil {
		t.Fatal(err)
	}
	return r
}

// waitTxIdle waits until nobody holds q's transmit role and its transmit
// goroutine has ended (a hang guard bounds it), and reports whether the
// batch arrays were given back.
func waitTxIdle(t *testing.T, q *QP) (holdsBufs bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		q.mu.Lock()
		if !q.txBusy && !q.txRun { // the holder let go under q.mu, after giving them back
			bufs := cap(q.tx.iov) > 0 || cap(q.tx.recs) > 0 || cap(q.tx.holds) > 0 || cap(q.tx.arena) > 0
			q.mu.Unlock()
			return bufs
		}
		q.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the transmit role is still held")
		}
	}
}

// TestIdleQPHoldsNoBuffers: a queue pair that has sent and received
// Writes, Reads and Sends (many FPDUs each, with and without CRC) and has
// nothing left to send runs no transmit goroutine and holds no transmit
// batch arrays (vectors, records,
// holds, arena), no receive staging buffer and no write iovec arrays, and
// its read iovec array is no larger than its reads have needed (issue 7,
// item 5).
func TestIdleQPHoldsNoBuffers(t *testing.T) {
	for _, crc := range []bool{false, true} {
		r := newTCPRig(t, Params{CRC: crc, IRD: 4, ORD: 4, MaxFPDU: 1000})
		const size = 64 << 10
		src, _ := r.reg(t, size, 0)
		// Each side's own memory: the peer's Write and Send land in it.
		var dsts [2]*mem.Region
		for i, q := range []*QP{r.a, r.b} {
			dsts[i], _ = r.reg(t, size, mem.RemoteWrite|mem.RemoteRead|mem.LocalWrite)
			recv, _ := r.reg(t, size, mem.LocalWrite)
			if err := q.PostRecv(&RecvWR{ID: 9, SGL: []SGE{{MR: recv, Length: size}}}); err != nil {
				t.Fatal(err)
			}
		}
		for i, q := range []*QP{r.a, r.b} {
			dst := dsts[1-i]
			back, _ := r.reg(t, size, mem.LocalWrite)
			for _, wr := range []SendWR{
				{ID: 1, Op: OpWrite, Flags: Signaled, SGL: []SGE{{MR: src, Length: size / 2}, {MR: src, Offset: size / 2, Length: size / 2}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())},
				{ID: 2, Op: OpRead, Flags: Signaled, SGL: []SGE{{MR: back, Length: size}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())},
				{ID: 3, Op: OpSend, Flags: Signaled, SGL: []SGE{{MR: src, Length: size}}},
			} {
				if err := q.PostSend(&wr); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, cq := range []*CQ{r.acq, r.bcq} {
			seen := map[uint64]bool{}
			for range 4 { // the three posted, and the peer's Send
				c := next(t, cq)
				if c.Status != Success || seen[c.ID] {
					t.Fatalf("crc %v: completion %+v", crc, c)
				}
				seen[c.ID] = true
			}
		}
		for _, q := range []*QP{r.a, r.b} {
			if waitTxIdle(t, q) {
				t.Errorf("crc %v: an idle queue pair holds its transmit batch arrays", crc)
			}
			// Its receive goroutine, waiting for the peer with nothing
			// staged, gives the staging buffer back (a hang guard
			// bounds the wait for it to get there).
			for deadline := time.Now().Add(10 * time.Second); q.rxStaged.Load(); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("crc %v: an idle queue pair holds its receive staging buffer", crc)
				}
			}
		}
		// The link's arrays, once its goroutines have stopped: none but
		// its own small ones (writeVecsSmall, 384 bytes on 64-bit).
		r.a.Close()
		r.b.Close()
		for _, q := range []*QP{r.a, r.b} {
			l := q.link.(*fdLink)
			if cap(l.wiov) != 0 || cap(l.wmsg) != 0 {
				t.Errorf("crc %v: an idle link holds write arrays of %d and %d entries", crc, cap(l.wiov), cap(l.wmsg))
			}
			if cap(l.riov) > 2*MaxSGE+2 {
				t.Errorf("crc %v: the read iovec array has %d entries, more than a read uses", crc, cap(l.riov))
			}
		}
	}
}

// TestRingsGrow: a queue pair's work rings start small and grow as work
// fills them, up to the depth asked for and no further, keeping every
// request in order, also Reads whose responses are outstanding (the ORQ
// points at their entries) while the ring moves.
func TestRingsGrow(t *testing.T) {
	r := newRig(t, 1000, -1, false) // depths 64, ORD 4
	for _, q := range []*QP{r.a, r.b} {
		q.mu.Lock()
		ns, nr := len(q.sq), len(q.rq)
		q.mu.Unlock()
		if ns != ringStart || nr != ringStart {
			t.Fatalf("a new queue pair's rings have %d and %d entries, want %d", ns, nr, ringStart)
		}
	}
	const depth, size = 64, 300
	src, sbuf := r.reg(t, depth*size, mem.RemoteRead)
	back, bbuf := r.reg(t, depth*size, mem.LocalWrite)
	clear(bbuf)
	recv, rbuf := r.reg(t, depth*size, mem.LocalWrite)
	clear(rbuf)
	for i := range depth {
		if err := r.b.PostRecv(&RecvWR{ID: uint64(1000 + i), SGL: []SGE{{MR: recv, Offset: i * size, Length: size}}}); err != nil {
			t.Fatalf("receive %d: %v", i, err)
		}
	}
	if err := r.b.PostRecv(&RecvWR{SGL: []SGE{{MR: recv, Length: size}}}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("receive beyond the depth: %v, want ErrQueueFull", err)
	}
	// Reads of two SGEs each (two Read Requests, two ORQ entries) and
	// Sends, alternately, all posted at once: the ring grows three times
	// while the first Reads wait for their responses.
	wrs := make([]SendWR, depth)
	for i := range wrs {
		if i%2 == 0 {
			wrs[i] = SendWR{ID: uint64(i), Op: OpRead, Flags: Signaled, RemoteAddr: src.Addr() + uint64(i*size), RKey: uint32(src.STag()),
				SGL: []SGE{{MR: back, Offset: i * size, Length: size / 2}, {MR: back, Offset: i*size + size/2, Length: size - size/2}}}
		} else {
			wrs[i] = SendWR{ID: uint64(i), Op: OpSend, Flags: Signaled, SGL: []SGE{{MR: src, Offset: i * size, Length: size}}}
		}
	}
	for i := 0; i < depth; i += ringStart {
		// In steps: a step finds the Reads of the last in the ORQ.
		if n, err := r.a.PostSendList(wrs[i : i+ringStart]); n != ringStart || err != nil {
			t.Fatalf("posted %d of %d: %v", i+n, depth, err)
		}
	}
	for i := range depth {
		if c := next(t, r.acq); c.ID != uint64(i) || c.Status != Success {
			t.Fatalf("completion %d: %+v", i, c)
		}
	}
	for i := range depth / 2 {
		c := next(t, r.bcq)
		if c.ID != uint64(1000+i) || c.Status != Success || c.Bytes != size {
			t.Fatalf("receive %d: %+v", i, c)
		}
	}
	for i := range depth {
		k := i * size
		if i%2 == 0 && !bytes.Equal(bbuf[k:k+size], sbuf[k:k+size]) {
			t.Fatalf("Read %d: data differs", i)
		}
		if i%2 == 1 && !bytes.Equal(rbuf[(i/2)*size:(i/2+1)*size], sbuf[k:k+size]) {
			t.Fatalf("Send %d: data differs", i)
		}
	}
	r.a.mu.Lock()
	ns := len(r.a.sq)
	r.a.mu.Unlock()
	r.b.mu.Lock()
	nr := len(r.b.rq)
	r.b.mu.Unlock()
	if ns > depth || nr != depth {
		t.Fatalf("rings of %d and %d entries after %d requests, want at most %d and %d", ns, nr, depth, depth, depth)
	}
}

// TestGrowSQKeepsORQ: growing the send queue's ring moves its entries to
// their places in the new ring, wrapped or not, and the ORQ's pointers
// follow their Reads.
func TestGrowSQKeepsORQ(t *testing.T) {
	q := &QP{cfg: Config{SendDepth: 20}, sq: make([]sqEntry, 8), orq: make([]orqEntry, 4)}
	q.sqHead, q.sqTail = 5, 13 // full, and wrapped
	for i := q.sqHead; i < q.sqTail; i++ {
		q.sq[i%8].wr.ID = i
	}
	q.orqHead, q.orqTail = 2, 6 // wrapped
	reads := []uint64{6, 6, 9, 12}
	for k, i := range reads {
		q.orq[(2+k)%4].sq = &q.sq[i%8]
	}
	for _, want := range []int{16, 20} {
		q.growSQLocked()
		if len(q.sq) != want {
			t.Fatalf("ring of %d entries, want %d", len(q.sq), want)
		}
		for i := q.sqHead; i < q.sqTail; i++ {
			if id := q.sq[i%uint64(len(q.sq))].wr.ID; id != i {
				t.Fatalf("ring of %d: entry %d holds %d", len(q.sq), i, id)
			}
		}
		for k, i := range reads {
			if o := q.orq[(2+k)%4].sq; o != &q.sq[i%uint64(len(q.sq))] {
				t.Fatalf("ring of %d: ORQ entry %d points at the entry of %d, want %d", len(q.sq), k, o.wr.ID, i)
			}
		}
	}
}
