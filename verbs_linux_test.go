package gowarp_test

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestAckedCompletion: in Acked mode a signaled Write completes only once
// the peer's TCP has acknowledged every byte: a receiver that stops reading
// holds it back, and it completes when the receiver reads again. In Handed
// mode the same Write completes as soon as the socket takes it.
func TestAckedCompletion(t *testing.T) {
	for _, mode := range []gowarp.CompletionMode{gowarp.Handed, gowarp.Acked} {
		t.Run(mode.String(), func(t *testing.T) {
			// A raw receiver with a small receive buffer that does not read.
			lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
				return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8192) })
			}}
			addr, conns := rawResponder(t, lc, 1, 1)
			dev := gowarp.Open()
			pd := dev.AllocPD()
			cq := dev.NewCQ(8)
			qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, Completion: mode})
			defer qp.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := qp.Connect(ctx, addr, gowarp.ConnectOptions{NoP2P: true}); err != nil {
				t.Fatal(err)
			}
			c := <-conns
			defer c.Close()
			// 256 KiB fits the sender's socket buffer (handed) but not the
			// receiver's window, so part of it stays unacknowledged.
			const n = 256 << 10
			src, _ := pd.Register(make([]byte, n), 0)
			if err := qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: n}}, RKey: 1}); err != nil {
				t.Fatal(err)
			}
			var wc [1]gowarp.Completion
			deadline := time.Now().Add(500 * time.Millisecond)
			for time.Now().Before(deadline) && cq.Poll(wc[:]) == 0 {
				time.Sleep(time.Millisecond)
			}
			got := wc[0].ID == 1
			if mode == gowarp.Handed && !got {
				t.Fatal("handed Write did not complete while the socket held its bytes")
			}
			if mode == gowarp.Acked && got {
				t.Fatal("acked Write completed while the receiver held bytes unacknowledged")
			}
			if mode == gowarp.Acked {
				go io.Copy(io.Discard, c) // the receiver reads again
				if w := wait(t, cq); w.ID != 1 || w.Err() != nil {
					t.Fatalf("acked completion %+v", w)
				}
			}
		})
	}
}
