package engine

import (
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// TestLargeReadsCounted: a Read of quietRead bytes or more counts in
// largeReads, which stops the busy poll, from its request until its
// response ends or the queue pair flushes it; smaller Reads do not count.
func TestLargeReadsCounted(t *testing.T) {
	t.Run("answered", func(t *testing.T) {
		r := newRig(t, 1<<20, -1, false)
		dst, _ := r.reg(t, quietRead, mem.RemoteRead)
		back, _ := r.reg(t, quietRead, mem.LocalWrite)
		for _, n := range []int{quietRead, quietRead - 1, 1} {
			r.a.PostSend(&SendWR{ID: uint64(n), Op: OpRead, Flags: Signaled, SGL: []SGE{{MR: back, Length: n}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())})
			if c := next(t, r.acq); c.Status != Success {
				t.Fatalf("Read of %d: %+v (%v)", n, c, r.a.Err())
			}
			if k, kb := r.a.largeReads.Load(), r.b.largeReads.Load(); k != 0 || kb != 0 {
				t.Fatalf("after a Read of %d answered: %d large Reads counted at the requester, %d at the responder, want 0", n, k, kb)
			}
		}
	})
	t.Run("flushed", func(t *testing.T) {
		table := mem.NewTable()
		cq := NewCQ(16)
		a, err := NewQP(Config{SendDepth: 8, RecvDepth: 8, SendCQ: cq, RecvCQ: cq, PD: 1, Table: table})
		if err != nil {
			t.Fatal(err)
		}
		ca, cb := net.Pipe() // no one answers on cb
		defer cb.Close()
		go func() { // take the requests, answer none
			b := make([]byte, 4096)
			for {
				if _, err := cb.Read(b); err != nil {
					return
				}
			}
		}()
		if err := a.Start(&streamLink{c: ca}, Params{IRD: 4, ORD: 4}); err != nil {
			t.Fatal(err)
		}
		back, err := table.Register(1, [][]byte{make([]byte, 2*quietRead)}, mem.LocalWrite, mem.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range []int{quietRead, 100, 2 * quietRead} {
			if err := a.PostSend(&SendWR{ID: uint64(i), Op: OpRead, Flags: Signaled, SGL: []SGE{{MR: back, Length: n}}, RemoteAddr: 0, RKey: 0x100}); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for a.largeReads.Load() != 2 {
			if time.Now().After(deadline) {
				t.Fatalf("%d large Reads counted of 3 outstanding Reads, 2 large; want 2", a.largeReads.Load())
			}
			time.Sleep(time.Millisecond)
		}
		a.Close()
		for range 3 {
			if c := next(t, cq); c.Status != WRFlushError {
				t.Fatalf("after Close: %+v, want flushed", c)
			}
		}
		if k := a.largeReads.Load(); k != 0 {
			t.Fatalf("after the flush: %d large Reads counted, want 0", k)
		}
	})
}

// TestLargeReadsCountedResponder: an inbound Read Request of quietRead
// bytes or more counts from its arrival until its response is framed; a
// requester that does not take the response keeps it counted, and the
// flush of Close ends the count.
func TestLargeReadsCountedResponder(t *testing.T) {
	e := newCoreEnv(t) // its regions and FPDU encoder; e.big is 128 KiB
	cq := NewCQ(16)
	b, err := NewQP(Config{SendDepth: 8, RecvDepth: 8, SendCQ: cq, RecvCQ: cq, PD: 1, Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	ca, cb := net.Pipe() // the requester: it writes a request, reads nothing
	defer ca.Close()
	if err := b.Start(&streamLink{c: cb}, Params{IRD: 4, ORD: 4, MaxFPDU: 200}); err != nil {
		t.Fatal(err)
	}
	req := e.readReq(1, wire.ReadRequest{SinkSTag: 0x99, Size: uint32(e.big.Len()), SourceSTag: uint32(e.big.STag()), SourceTO: coreBase})
	if _, err := ca.Write(req); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.largeReads.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d large Reads counted with a 128 KiB response unsent, want 1", b.largeReads.Load())
		}
		time.Sleep(time.Millisecond)
	}
	b.Close()
	if k := b.largeReads.Load(); k != 0 {
		t.Fatalf("after Close: %d large Reads counted, want 0", k)
	}
}
