package perftest

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/gowarp/gowarp"
)

// TestServerAgainstCapture plays siw's perftest client from the captures
// against gowarp's server, for the tests whose server is passive during
// the traffic (write_bw, read_bw, read_lat), and checks each of the
// server's answers against what siw's perftest server sent: byte for byte
// except what is the server's own (its queue pair, PSN, key, address and
// GID, and its report figures).
func TestServerAgainstCapture(t *testing.T) {
	for _, test := range []Test{WriteBW, ReadBW, ReadLat} {
		t.Run(string(test), func(t *testing.T) {
			cp := loadCapture(t, test)
			ctx, dev, ln := listen(t)
			size, iters := capSize, capIters
			if test.Latency() {
				size = 8
			}
			var wg sync.WaitGroup
			var sr *Result
			var serr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				sr, serr = Serve(ctx, dev, ln, Options{Test: test, Size: size, Iters: iters})
			}()
			cerr := replayClient(ctx, t, dev, ln.Addr().String(), test, cp)
			wg.Wait()
			if cerr != nil || serr != nil {
				t.Fatalf("replayed client: %v; server: %v", cerr, serr)
			}
			if test == WriteBW || test == ReadBW {
				// The server took the client's report as perftest's does.
				var m [5][]byte
				copy(m[:], cp.client[10:15])
				want, _ := parseReport(m)
				if sr.Remote != want {
					t.Errorf("server took report %+v, the client sent %+v", sr.Remote, want)
				}
			}
		})
	}
}

// replayClient connects to a gowarp perftest server, sends siw's client's
// control messages in order, connects the data queue pair where the
// script has it, and checks every answer against siw's server's.
func replayClient(ctx context.Context, t *testing.T, dev *gowarp.Device, addr string, test Test, cp captured) error {
	pd := dev.AllocPD()
	r := &Result{}
	c, err := newControl(dev, pd, r, false)
	if err != nil {
		return err
	}
	defer c.close()
	if err := c.qp.Connect(ctx, addr, gowarp.ConnectOptions{NoP2P: true, IRD: gowarp.NoReads, ORD: gowarp.NoReads}); err != nil {
		return err
	}
	var data *gowarp.QP
	var dataCQ *gowarp.CQ
	var peer Dest // the server's, from its last dest
	i := 0
	for _, st := range Script(test) {
		if st == ActTraffic && (test == WriteBW || test == ReadBW) {
			// One message of the traffic, as a client's is the server's
			// sign that it runs one way (checkDuplex).
			if err := replayTraffic(ctx, pd, data, dataCQ, test, peer); err != nil {
				return err
			}
			continue
		}
		if st == ActData {
			dataCQ = dev.NewCQ(8)
			if data, err = pd.NewQP(gowarp.QPConfig{SendCQ: dataCQ, RecvCQ: dataCQ}); err != nil {
				return err
			}
			defer data.Close()
			co := gowarp.ConnectOptions{NoP2P: true, IRD: gowarp.NoReads, ORD: gowarp.NoReads}
			if test == ReadBW || test == ReadLat {
				co.IRD, co.ORD = MaxOutReads, MaxOutReads
			}
			if err := data.Connect(ctx, addr, co); err != nil {
				return err
			}
			continue
		}
		if !st.Message() {
			continue
		}
		got, err := c.xchg(ctx, cp.client[i])
		if err != nil {
			return fmt.Errorf("message %d (%v): %w", i, st, err)
		}
		want := cp.server[i]
		switch {
		case st == StepDest:
			g, _ := ParseDest(got)
			peer = g
			w, _ := ParseDest(want)
			if len(got) != DestLen || g.LID != w.LID || g.OutReads != w.OutReads || g.SRQN != w.SRQN || g.GIDIndex != w.GIDIndex || g.RKey == 0 || g.VAddr == 0 {
				t.Errorf("message %d: server's dest %+v; siw's server sent %+v", i, g, w)
			}
		case st == StepReport:
			if len(got) != 8 {
				t.Errorf("message %d: report field of %d bytes", i, len(got))
			}
		case !bytes.Equal(got, want):
			t.Errorf("message %d (%v): server sent % x, siw's server % x", i, st, got, want)
		}
		i++
	}
	if i != len(cp.client) {
		return fmt.Errorf("the script sent %d messages, the capture has %d", i, len(cp.client))
	}
	return nil
}

// replayTraffic Writes or Reads one small message to or from the server's
// buffer that peer names, and waits for it to complete.
func replayTraffic(ctx context.Context, pd *gowarp.PD, qp *gowarp.QP, cq *gowarp.CQ, test Test, peer Dest) error {
	mr, err := pd.Register(make([]byte, 64), gowarp.LocalWrite)
	if err != nil {
		return err
	}
	defer mr.Deregister()
	wr := gowarp.SendWR{Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: mr, Length: 64}},
		RemoteAddr: peer.VAddr, RKey: gowarp.STag(peer.RKey)}
	if test == ReadBW {
		wr.Op = gowarp.OpRead
	}
	if err := qp.PostSend(&wr); err != nil {
		return err
	}
	var wc [1]gowarp.Completion
	for {
		if err := cq.Wait(ctx); err != nil {
			return err
		}
		if cq.Poll(wc[:]) == 1 {
			return wc[0].Err()
		}
	}
}
