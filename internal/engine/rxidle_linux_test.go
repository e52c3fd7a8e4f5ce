package engine

import (
	"context"
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
	time.Sleep(10 * time.Millisecond) // the waiter holds the path
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
