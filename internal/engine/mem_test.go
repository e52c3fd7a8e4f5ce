package engine

import (
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

// waitTxIdle waits until nobody holds q's transmit role (a hang guard
// bounds it) and reports whether the batch arrays were given back.
func waitTxIdle(t *testing.T, q *QP) (holdsBufs bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		q.mu.Lock()
		if !q.txBusy { // the holder let go under q.mu, after giving them back
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
// nothing left to send holds no transmit batch arrays (vectors, records,
// holds, arena) and no write iovec arrays, and its read iovec array is no
// larger than its reads have needed (issue 7, item 5).
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
		}
		// The link's arrays, once its goroutines have stopped.
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
