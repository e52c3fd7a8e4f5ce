package perftest

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

func TestLatReport(t *testing.T) {
	// Posts 20, 40, 60, 80 µs apart: samples of 10, 20, 30, 40 µs one way.
	// perftest drops the two largest, so 10 and 20 remain.
	tp := []int64{0, 20e3, 60e3, 120e3, 200e3}
	r := latReport(2, tp, 2)
	want := LatReport{Size: 2, Iters: 5, Min: 10, Max: 30, Typical: 15, Avg: 15, Stdev: 5, P99: 30, P999: 30}
	if r != want {
		t.Errorf("latReport = %+v, want %+v", r, want)
	}
	// The line has perftest's layout (compare a line siw printed:
	// " 8       5          238.78         306.03       242.91   \t       242.91      \t4.00   \t\t306.03  \t\t306.03 ").
	r = LatReport{Size: 8, Iters: 5, Min: 238.78, Max: 306.03, Typical: 242.91, Avg: 242.91, Stdev: 4, P99: 306.03, P999: 306.03}
	if got, want := r.Line(), " 8       5          238.78         306.03       242.91   \t       242.91      \t4.00   \t\t306.03  \t\t306.03 "; got != want {
		t.Errorf("Line() = %q\n          want %q", got, want)
	}
	// Odd counts take the middle sample; a read_lat factor of 1.
	tp = []int64{0, 1e3, 3e3, 6e3, 10e3, 15e3, 21e3, 28e3} // 1 … 7 µs, 5 kept
	r = latReport(2, tp, 1)
	if r.Typical != 3 || r.Min != 1 || r.Max != 6 || math.Abs(r.Avg-3) > 1e-9 {
		t.Errorf("odd count: %+v", r)
	}
	if r := latReport(2, []int64{0}, 2); r.Iters != 1 || r.Typical != 0 {
		t.Errorf("one sample: %+v", r)
	}
}

// TestServeBadClient: a client that sends a malformed first message, or
// goes away mid-exchange, ends Serve with a clear error, without a hang.
func TestServeBadClient(t *testing.T) {
	for _, c := range []struct {
		name string
		msgs [][]byte
		want string
	}{
		{"short version", [][]byte{[]byte("6.0")}, "version"},
		{"old version", [][]byte{AppendVersion(nil, "5.0")}, "older than 5.70"},
		{"bad cycle buffer", [][]byte{AppendVersion(nil, Version), {0, 0}}, "cycle buffer"},
		{"gone after the version", [][]byte{AppendVersion(nil, Version)}, "cycle buffer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, dev, ln := listen(t)
			errc := make(chan error, 1)
			go func() {
				_, err := Serve(ctx, dev, ln, Options{Test: WriteLat})
				errc <- err
			}()
			pd := dev.AllocPD()
			cq := dev.NewCQ(16)
			qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
			if err != nil {
				t.Fatal(err)
			}
			rbuf, _ := pd.Register(make([]byte, 4096), gowarp.LocalWrite)
			qp.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: rbuf, Length: 4096}}})
			qp.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: rbuf, Length: 4096}}})
			if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{NoP2P: true}); err != nil {
				t.Fatal(err)
			}
			for i, m := range c.msgs {
				if i > 0 {
					// As perftest's client does, wait for the server's answer
					// to the message before: sent at once, the next Send can
					// come before the server's receive for it is posted, and
					// the server fails for that instead (1 run in 30).
					waitRecv(ctx, t, cq)
				}
				mr, _ := pd.Register(m, 0)
				if err := qp.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Length: len(m)}}}); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(100 * time.Millisecond)
			qp.Close()
			select {
			case err := <-errc:
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("Serve: %v, want an error about %q", err, c.want)
				}
			case <-ctx.Done():
				t.Fatal("Serve did not return")
			}
		})
	}
}

// waitRecv waits for a receive completion on cq.
func waitRecv(ctx context.Context, t *testing.T, cq *gowarp.CQ) {
	t.Helper()
	var wc [4]gowarp.Completion
	for {
		n := cq.Poll(wc[:])
		for _, c := range wc[:n] {
			if c.Op != gowarp.CompRecv {
				continue
			}
			if c.Status != gowarp.Success {
				t.Fatalf("receive of the server's answer: %v", c.Status)
			}
			return
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("no answer from the server: %v", err)
		}
	}
}

// TestLatSampled: a run of a duration's figures and line are perftest's
// (siw's ib_write_lat -D 3 printed this line for 8905 round trips in 3 s).
func TestLatSampled(t *testing.T) {
	r := latSampled(2, 8905, 3*time.Second, 2)
	if math.Abs(r.Avg-168.44) > 0.01 || math.Abs(r.TPS-2968.33) > 0.01 {
		t.Errorf("latSampled = %+v, want 168.44 µs and 2968.33 a second", r)
	}
	r.Avg, r.TPS = 168.74, 2963.20
	if got, want := r.Line(), " 2             8905            168.74         2963.20"; got != want {
		t.Errorf("Line() = %q\n          want %q", got, want)
	}
}
