package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/mem"
)

// TestWaiterSkipsEmptyReads: a goroutine that waits inline through many
// messages (a server waiting for its requests) takes each where it is
// read and, the socket emptied, waits for the next without reading the
// socket again to find it empty: one system call less per message, about
// 1.5 µs of a small message's latency. Every message is still taken, in
// order, and the wait still ends when its completion comes.
func TestWaiterSkipsEmptyReads(t *testing.T) {
	r := tcpRig(t)
	dst, dbuf := r.reg(t, 8, mem.LocalWrite|mem.RemoteWrite)
	src, sbuf := r.reg(t, 8, mem.LocalWrite)
	recv, _ := r.reg(t, 64, mem.LocalWrite)
	if err := r.a.PostRecv(&RecvWR{ID: 7, SGL: []SGE{{MR: recv, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	link := r.a.link.(*fdLink)
	const n = 200
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		// a waits on its CQ for the Send that ends the run, receiving the
		// Writes before it on its own goroutine meanwhile.
		waited <- r.acq.Wait(ctx)
	}()
	for !r.a.rxInline.Load() { // the waiter holds the path
		time.Sleep(time.Millisecond)
	}
	before := link.empties.Load()
	for i := range n {
		sbuf[0] = byte(i)
		if err := r.b.PostSend(&SendWR{Op: OpWrite, SGL: []SGE{{MR: src, Length: 8}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())}); err != nil {
			t.Fatal(err)
		}
		// Each Write lands before the next leaves: a read of its own.
		for dst.Placed() < uint64(8*(i+1)) {
			time.Sleep(20 * time.Microsecond)
		}
		if dbuf[0] != byte(i) {
			t.Fatalf("write %d placed %d", i, dbuf[0])
		}
	}
	empties := link.empties.Load() - before
	if err := r.b.PostSend(&SendWR{Op: OpSend, SGL: []SGE{{MR: src, Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the wait: %v", err)
	}
	var wc [1]Completion
	if k := r.acq.Poll(wc[:]); k != 1 || wc[0].ID != 7 || wc[0].Status != Success {
		t.Fatalf("after the wait: %d completions, %+v", k, wc[0])
	}
	// Reading the socket again after each Write found it empty n times.
	if empties > n/10 {
		t.Fatalf("the waiter found the socket empty %d times in %d Writes", empties, n)
	}
	t.Logf("%d empty reads in %d Writes", empties, n)
}

// TestProgressFuncPingPong: two queue pairs ping-pong 8-byte Writes, each
// posting from its ProgressFunc's function: every Write lands in turn,
// and the readers, waiting between messages without returning, find the
// socket empty far less than once per message (once each with Progress).
func TestProgressFuncPingPong(t *testing.T) {
	r := tcpRig(t)
	const rounds = 500
	abuf, adata := r.reg(t, 8, mem.LocalWrite|mem.RemoteWrite)
	bbuf, bdata := r.reg(t, 8, mem.LocalWrite|mem.RemoteWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	play := func(q *QP, mine, theirs *mem.Region, data []byte, first bool) error {
		var want uint64
		sent := 0
		wr := SendWR{Op: OpWrite, SGL: []SGE{{MR: mine, Length: 8}}, RemoteAddr: theirs.Addr(), RKey: uint32(theirs.STag())}
		var ferr error
		post := func() bool {
			data[0] = byte(sent)
			if ferr = q.PostSend(&wr); ferr != nil {
				return false
			}
			sent++
			return true
		}
		calls := 0
		err := q.ProgressFunc(ctx, func() bool {
			calls++
			if calls == 1 && first {
				return post() // called before any wait
			}
			if mine.Placed() < want+8 {
				return true
			}
			want += 8
			if got := data[0]; got != byte(want/8-1) {
				ferr = fmt.Errorf("round %d: got %d", want/8, got)
				return false
			}
			if first && sent == rounds {
				return false // the last answer came
			}
			return post() && sent < rounds
		})
		if ferr != nil {
			return ferr
		}
		return err
	}
	la, lb := r.a.link.(*fdLink), r.b.link.(*fdLink)
	before := la.empties.Load() + lb.empties.Load()
	errc := make(chan error, 1)
	go func() { errc <- play(r.b, bbuf, abuf, bdata, false) }()
	if err := play(r.a, abuf, bbuf, adata, true); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// Waiting per message, each reader finds it empty once a message,
	// 2*rounds in all; here none but when readiness came for bytes
	// already read (1-4 on a quiet host, up to 111 with the CPUs busy;
	// 998 and 999 with the wait per message).
	n := la.empties.Load() + lb.empties.Load() - before
	t.Logf("%d empty reads in %d round trips", n, rounds)
	if n > rounds/2 {
		t.Fatalf("the readers found the socket empty %d times in %d round trips", n, rounds)
	}
}

// TestProgressFuncEnds: ProgressFunc returns nil when its function says
// so, at once if the first call does; the context's error when it is
// done; and the queue pair's error, not a hang, when the peer goes.
func TestProgressFuncEnds(t *testing.T) {
	r := tcpRig(t)
	calls := 0
	if err := r.a.ProgressFunc(context.Background(), func() bool { calls++; return false }); err != nil || calls != 1 {
		t.Fatalf("a function that says no at once: %v after %d calls", err, calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.a.ProgressFunc(ctx, func() bool { return true }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with the context done: %v", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.a.ProgressFunc(context.Background(), func() bool { return true }) }()
	time.Sleep(20 * time.Millisecond)
	r.b.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("the peer closed, and ProgressFunc returned nil")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the peer closed, and ProgressFunc went on waiting")
	}
}
