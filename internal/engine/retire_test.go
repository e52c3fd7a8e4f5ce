package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/mem"
)

// TestReadRetiredBeforeMarked: a Read answered while the write that sent
// it is still in its system call retires (from the receive path) before
// the transmit path has marked it sent; work posted meanwhile that grows
// the send queue's ring must still complete. The transmit path went on
// marking from the Read's old index, found the new ring's empty slot
// there and stopped for good: every later Send stayed uncompleted and
// both sides idle (gowarp cache bench's one-sided 4 KiB GETs stalled so in
// 2 runs of 3 at load 9).
func TestReadRetiredBeforeMarked(t *testing.T) {
	var once sync.Once
	var r *rig
	var src, sbuf, dst *mem.Region
	const sends = 9 // more than the ring's first 8 entries, with the Read retired
	hookErr := make(chan error, 1)
	testHookWritten = func(q *QP) {
		if r == nil || q != r.a {
			return
		}
		once.Do(func() {
			// The Read is written: wait for its completion, retired by
			// the receive path, then post the Sends while this write
			// still holds the transmit role.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var wc [1]Completion
			for r.acq.Poll(wc[:]) == 0 {
				if err := r.acq.Wait(ctx); err != nil {
					hookErr <- err
					return
				}
			}
			if wc[0].ID != 100 || wc[0].Status != Success {
				t.Errorf("first completion %+v, want the Read's", wc[0])
			}
			for i := range sends {
				wr := SendWR{ID: uint64(i), Op: OpSend, Flags: Signaled, SGL: []SGE{{MR: sbuf, Length: 16}}}
				if err := r.a.PostSend(&wr); err != nil {
					hookErr <- err
					return
				}
			}
			hookErr <- nil
		})
	}
	t.Cleanup(func() { testHookWritten = nil })
	r = newRig(t, 1<<16, -1, false)
	src, _ = r.reg(t, 4096, mem.RemoteRead)
	sbuf, _ = r.reg(t, 4096, 0)
	dst, _ = r.reg(t, 4096, mem.LocalWrite)
	rbuf, _ := r.reg(t, 16*sends, mem.LocalWrite)
	for i := range sends {
		if err := r.b.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{{MR: rbuf, Offset: 16 * i, Length: 16}}}); err != nil {
			t.Fatal(err)
		}
	}
	rd := SendWR{ID: 100, Op: OpRead, Flags: Signaled, SGL: []SGE{{MR: dst, Length: 4096}}, RemoteAddr: src.Addr(), RKey: uint32(src.STag())}
	if err := r.a.PostSend(&rd); err != nil {
		t.Fatal(err)
	}
	if err := <-hookErr; err != nil {
		t.Fatal(err)
	}
	for i := range sends {
		if c := next(t, r.acq); c.ID != uint64(i) || c.Status != Success {
			t.Fatalf("completion %+v, want Send %d", c, i)
		}
	}
}
