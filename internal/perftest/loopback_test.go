package perftest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// pair runs a gowarp perftest client against a gowarp perftest server on
// the loopback and returns both results.
func pair(t *testing.T, o Options) (client, server *Result) {
	t.Helper()
	return pairVia(t, o, nil)
}

// pairVia is pair with the client dialing via(addr), if via is not nil,
// for the server's address addr.
func pairVia(t *testing.T, o Options, via func(addr string) string) (client, server *Result) {
	t.Helper()
	cr, cerr, sr, serr := runPair(t, o, o, via)
	if cerr != nil || serr != nil {
		t.Fatalf("client: %v; server: %v", cerr, serr)
	}
	return cr, sr
}

// runPair runs a gowarp perftest server with so and its client with co
// (dialing via(addr) if via is not nil) on the loopback, and returns what
// each returned.
func runPair(t *testing.T, so, co Options, via func(addr string) string) (cr *Result, cerr error, sr *Result, serr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ln, err := gowarp.Open().Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if so.CloseWait == 0 {
		// Both sides are gowarp's: the client closes when the server
		// does, and the wait for a siw client would only slow the tests.
		so.CloseWait = -1
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sr, serr = Serve(ctx, gowarp.Open(), ln, so)
	}()
	co.Addr = ln.Addr().String()
	if via != nil {
		co.Addr = via(co.Addr)
	}
	if co.DataGap == 0 {
		co.DataGap = 10 * time.Millisecond
	}
	cr, cerr = Run(ctx, gowarp.Open(), co)
	<-done
	return cr, cerr, sr, serr
}

// TestLoopback runs every test, gowarp client against gowarp server, with
// CRC off and on, and checks what each side measured and printed.
func TestLoopback(t *testing.T) {
	for _, test := range Tests {
		for _, crc := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/crc=%v", test, crc), func(t *testing.T) {
				o := Options{Test: test, Iters: 200, Size: 4096, Connect: gowarp.ConnectOptions{CRC: crc, NoP2P: true}}
				if test == SendBW || test == SendLat {
					// A receive depth well below the count: the send_bw
					// client runs on the server's credits, and both sides
					// of send_lat on receives posted again.
					o.RxDepth = 9
				}
				if test.Latency() {
					o.Size = 64
				}
				c, s := pair(t, o)
				checkPair(t, test, o, c, s)
			})
		}
	}
}

// TestLoopbackSmall: messages of at most half the cycle buffer, which a
// bandwidth client moves through the server's buffer as perftest's does
// (a cache line or more at a time): the server's buffer spans it. It
// spanned two messages, and the second Read of 1 byte, at offset 64, met a
// Terminate (ib_read_bw -s 1 against gowarp's server, 2026-12-07).
func TestLoopbackSmall(t *testing.T) {
	for _, test := range Tests {
		for _, size := range []int{1, 100, 2048} {
			t.Run(fmt.Sprintf("%s/%d", test, size), func(t *testing.T) {
				o := Options{Test: test, Iters: 200, Size: size, RxDepth: 9, Connect: gowarp.ConnectOptions{NoP2P: true}}
				c, s := pair(t, o)
				checkPair(t, test, o, c, s)
			})
		}
	}
}

// TestLoopbackAll: the bandwidth tests over every size, 2 B to 8 MiB,
// doubling (perftest's -a): a report for each, the last exchanged
// (write_bw, read_bw), or each measured by the server too (send_bw, whose
// client counts credits from zero at each size: a receive depth of 2
// makes it wait for them).
func TestLoopbackAll(t *testing.T) {
	for _, test := range []Test{WriteBW, ReadBW, SendBW} {
		t.Run(string(test), func(t *testing.T) {
			o := Options{Test: test, Iters: 5, All: true, RxDepth: 2, Connect: gowarp.ConnectOptions{NoP2P: true}}
			var clog strings.Builder
			co := o
			co.Log = &clog
			c, cerr, s, serr := runPair(t, o, co, nil)
			if cerr != nil || serr != nil {
				t.Fatalf("client: %v; server: %v", cerr, serr)
			}
			if test == SendBW {
				// Every size's credit Writes landed before the next
				// (creditsOver), and the log says each size's run.
				if strings.Contains(clog.String(), "credit Writes landed") || strings.Count(clog.String(), "running send_bw") != 23 {
					t.Errorf("the client's log:\n%s", clog.String())
				}
				for i := range 23 {
					if len(s.Sizes) != 23 || s.Sizes[i].Size != 2<<i || s.Sizes[i].Iters != 5 || s.Sizes[i].BWAvg <= 0 {
						t.Fatalf("the server's reports %+v, want 23 sizes measured", s.Sizes)
					}
				}
			}
			if len(c.Sizes) != 23 {
				t.Fatalf("%d sizes reported, want 23 (2 B to 8 MiB)", len(c.Sizes))
			}
			for i, r := range c.Sizes {
				if r.Size != 2<<i || r.Iters != 5 || r.BWAvg <= 0 {
					t.Errorf("size %d: report %+v", 2<<i, r)
				}
			}
			if c.Local != c.Sizes[22] || test != SendBW && s.Remote != c.Local {
				t.Errorf("the last report %+v: client's Local %+v, server received %+v", c.Sizes[22], c.Local, s.Remote)
			}
			var b strings.Builder
			o.Size = MaxSize
			c.WriteTable(&b, &o)
			if n := strings.Count(b.String(), "\n "); !strings.Contains(b.String(), " 8388608    5 ") || !strings.Contains(b.String(), " 2          5 ") {
				t.Errorf("the table (%d lines) lacks a size's line:\n%s", n, b.String())
			}
		})
	}
	// perftest's -a sets the size to its largest whatever -s said.
	for _, o := range []Options{{Test: WriteBW, All: true, Size: 100}, {Test: SendLat, All: true, Size: 2}} {
		if err := Fill(&o); err != nil || o.Size != MaxSize {
			t.Errorf("%s with All and a size: %v, size %d, want %d", o.Test, err, o.Size, MaxSize)
		}
	}
}

// TestLoopbackAllLatency: the latency tests over every size, 2 B to
// 8 MiB, doubling (perftest's -a): both sides of write_lat and send_lat
// and read_lat's client report each, and send_lat's receives are posted
// and its hands shaken before each size.
func TestLoopbackAllLatency(t *testing.T) {
	for _, test := range []Test{WriteLat, ReadLat, SendLat} {
		t.Run(string(test), func(t *testing.T) {
			o := Options{Test: test, Iters: 5, All: true, RxDepth: 2, Connect: gowarp.ConnectOptions{NoP2P: true}}
			c, s := pair(t, o)
			sides := map[string]*Result{"client": c, "server": s}
			if test == ReadLat {
				delete(sides, "server")
			}
			for who, r := range sides {
				if len(r.LatSizes) != 23 {
					t.Fatalf("the %s reported %d sizes, want 23 (2 B to 8 MiB)", who, len(r.LatSizes))
				}
				for i, l := range r.LatSizes {
					if l.Size != 2<<i || l.Iters != 5 || l.Min <= 0 || l.Typical < l.Min {
						t.Errorf("the %s's size %d: report %+v", who, 2<<i, l)
					}
				}
				var b strings.Builder
				oo := o
				oo.defaults()
				r.WriteTable(&b, &oo)
				if !strings.Contains(b.String(), "\n 8388608 5 ") || !strings.Contains(b.String(), "\n 2       5 ") {
					t.Errorf("the %s's table lacks a size's line:\n%s", who, b.String())
				}
			}
			if test == SendLat {
				// 3 dests, a dest before each size's traffic, a closing one.
				if n := len(c.Transcript); n != 2*(4+2+3+23+1) {
					t.Errorf("send_lat over all sizes exchanged %d control messages, want %d", n, 2*(4+2+3+23+1))
				}
			}
		})
	}
}

func checkPair(t *testing.T, test Test, o Options, c, s *Result) {
	t.Helper()
	if c.PeerVersion != Version || s.PeerVersion != Version {
		t.Errorf("versions seen: client %q, server %q", c.PeerVersion, s.PeerVersion)
	}
	if !slices.Equal(c.RemoteDests, s.LocalDests) || !slices.Equal(s.RemoteDests, c.LocalDests) {
		t.Errorf("dests: client has %+v and %+v, server %+v and %+v", c.LocalDests, c.RemoteDests, s.LocalDests, s.RemoteDests)
	}
	// Both sides walked the same script: the transcripts agree.
	if len(c.Transcript) != len(s.Transcript) {
		t.Fatalf("client's transcript has %d messages, server's %d", len(c.Transcript), len(s.Transcript))
	}
	for i := range c.Transcript {
		if !bytes.Equal(c.Transcript[i].Data, s.Transcript[i].Data) || c.Transcript[i].FromClient != s.Transcript[i].FromClient {
			t.Errorf("message %d: client saw %+v, server %+v", i, c.Transcript[i], s.Transcript[i])
		}
	}
	n := uint64(o.Iters)
	size := uint64(o.Size)
	switch test {
	case WriteBW, ReadBW:
		if c.Local.Size != size || c.Local.Iters != n || c.Local.BWAvg <= 0 || c.Local.BWPeak < c.Local.BWAvg*(1-1e-9) {
			t.Errorf("client report %+v", c.Local)
		}
		if s.Remote != c.Local {
			t.Errorf("server received report %+v, client sent %+v", s.Remote, c.Local)
		}
		if c.Remote.Measured(o.Size) || !c.Remote.Plausible(o.Size) {
			t.Errorf("server's report %+v: want size and iterations with zero figures", c.Remote)
		}
	case SendBW:
		if c.Local.Iters != n || c.Local.BWAvg <= 0 {
			t.Errorf("client report %+v", c.Local)
		}
		if s.Local.Size != size || s.Local.Iters != n || s.Local.BWAvg <= 0 {
			t.Errorf("server report %+v", s.Local)
		}
	default:
		check := func(who string, l LatReport) {
			if l.Size != size || l.Iters != n || l.Min <= 0 || l.Min > l.Typical || l.Typical > l.Max ||
				l.Avg < l.Min || l.Avg > l.Max || l.P99 < l.Typical || l.P999 < l.P99 || l.Stdev < 0 {
				t.Errorf("%s's latency report %+v", who, l)
			}
		}
		check("client", c.Lat)
		if test != ReadLat {
			check("server", s.Lat)
		}
	}
	// The tables and JSON print.
	for _, r := range []*Result{c, s} {
		var b strings.Builder
		oo := o
		oo.defaults()
		r.WriteTable(&b, &oo)
		out := b.String()
		if !strings.Contains(out, test.Title()) || strings.Count(out, ResultLine) != 4 {
			t.Errorf("table:\n%s", out)
		}
		if _, err := json.Marshal(r.JSON(&oo)); err != nil {
			t.Error(err)
		}
	}
}

// TestControlReset: a server that resets the client's first control
// connection during the MPA exchange, then serves, gets a run: the client
// tries again. In CI siw's listener in the guest reset one, and the
// client gave up while ib_send_lat waited for it until the suite's
// timeout.
func TestControlReset(t *testing.T) {
	pairVia(t, Options{Test: SendLat, Iters: 20, Size: 64, Connect: gowarp.ConnectOptions{NoP2P: true}}, func(backend string) string {
		front, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { front.Close() })
		go func() {
			for n := 0; ; n++ {
				c, err := front.Accept()
				if err != nil {
					return
				}
				if n == 0 {
					// Read the MPA request, then reset.
					c.Read(make([]byte, 64))
					c.(*net.TCPConn).SetLinger(0)
					c.Close()
					continue
				}
				b, err := net.Dial("tcp", backend)
				if err != nil {
					c.Close()
					continue
				}
				go func() { io.Copy(b, c); b.Close() }()
				go func() { io.Copy(c, b); c.Close() }()
			}
		}()
		return front.Addr().String()
	})
}

// TestLoopbackQPs: write_bw and read_bw on three queue pairs (perftest's
// -q): each side's dests, one for each, reach the other; the client's
// report counts every queue pair's messages; each queue pair has its own
// part of each side's buffer.
func TestLoopbackQPs(t *testing.T) {
	for _, test := range []Test{WriteBW, ReadBW} {
		t.Run(string(test), func(t *testing.T) {
			o := Options{Test: test, Iters: 50, Size: 8192, QPs: 3, Connect: gowarp.ConnectOptions{NoP2P: true}}
			c, s := pair(t, o)
			if len(c.LocalDests) != 3 || len(s.LocalDests) != 3 || !slices.Equal(c.RemoteDests, s.LocalDests) || !slices.Equal(s.RemoteDests, c.LocalDests) {
				t.Fatalf("dests: client %+v and %+v, server %+v and %+v", c.LocalDests, c.RemoteDests, s.LocalDests, s.RemoteDests)
			}
			for i, d := range s.LocalDests {
				if d.QPN != s.LocalDests[0].QPN+uint32(i) || i > 0 && d.VAddr <= s.LocalDests[i-1].VAddr {
					t.Errorf("server's dest %d: %+v", i, d)
				}
			}
			if c.Local.Iters != 150 || c.Local.BWAvg <= 0 || s.Remote != c.Local {
				t.Errorf("client's report %+v, the server got %+v; want 150 messages", c.Local, s.Remote)
			}
			var b strings.Builder
			oo := o
			oo.defaults()
			c.WriteTable(&b, &oo)
			if out := b.String(); !strings.Contains(out, "Number of qps   : 3") || strings.Count(out, "local address") != 3 || strings.Count(out, "remote address") != 3 {
				t.Errorf("table:\n%s", out)
			}
		})
	}
}

// TestLoopbackDuration: a write_bw client runs for a duration (perftest's
// -D), not a count, on two queue pairs, and reports what completed, with
// no peak; the server takes the duration and needs none.
func TestLoopbackDuration(t *testing.T) {
	o := Options{Test: WriteBW, Size: 4096, QPs: 2, Duration: time.Second, Connect: gowarp.ConnectOptions{NoP2P: true}}
	t0 := time.Now()
	c, _ := pair(t, o)
	took := time.Since(t0)
	if took < time.Second || c.Local.Iters == 0 || c.Local.BWAvg <= 0 || c.Local.BWPeak != 0 {
		t.Errorf("took %v; report %+v: want a second or more, messages, no peak", took, c.Local)
	}
	// Each message is 4096 bytes a second's worth (the margin of 1 s is 0).
	if want := float64(c.Local.Iters) * 4096 / mib; math.Abs(c.Local.BWAvg-want) > want*0.01 {
		t.Errorf("average %v MB/s for %d messages in 1 s, want %v", c.Local.BWAvg, c.Local.Iters, want)
	}
}

// TestLoopbackDurationSendBW: send_bw for a duration (perftest's -D, both
// sides): the client Sends within its credit until its end, the server
// reposts every receive and grants credit until its own, counted from the
// first Send, and each reports what it measured in its window, no peak.
func TestLoopbackDurationSendBW(t *testing.T) {
	o := Options{Test: SendBW, Size: 4096, Duration: time.Second, Connect: gowarp.ConnectOptions{NoP2P: true}}
	c, s := pair(t, o)
	for who, r := range map[string]*Result{"client": c, "server": s} {
		if r.Local.Iters == 0 || r.Local.BWAvg <= 0 || r.Local.BWPeak != 0 {
			t.Errorf("the %s's report %+v: want messages, an average, no peak", who, r.Local)
		}
		// A second's worth, as TestLoopbackDuration.
		if want := float64(r.Local.Iters) * 4096 / mib; math.Abs(r.Local.BWAvg-want) > want*0.01 {
			t.Errorf("the %s's average %v MB/s for %d messages in 1 s, want %v", who, r.Local.BWAvg, r.Local.Iters, want)
		}
	}
	// Many more than one receive depth went through: the credits moved.
	if oo := o; Fill(&oo) == nil && c.Local.Iters <= uint64(oo.RxDepth) {
		t.Errorf("the client sent %d messages in 1 s, not beyond its first credit (%d receives)", c.Local.Iters, oo.RxDepth)
	}
	t.Logf("client %d messages, server %d", c.Local.Iters, s.Local.Iters)
}

// TestLoopbackGbits: --report_gbits makes the client's figures Gb/s, and
// the tables and JSON say so (the server's prints the client's figures
// under its own unit, as perftest's).
func TestLoopbackGbits(t *testing.T) {
	o := Options{Test: ReadBW, Iters: 100, Size: 65536, Gbits: true, Connect: gowarp.ConnectOptions{NoP2P: true}}
	c, s := pair(t, o)
	oo := o
	oo.defaults()
	for _, r := range []*Result{c, s} {
		var b strings.Builder
		r.WriteTable(&b, &oo)
		if out := b.String(); !strings.Contains(out, ResultHeaderG) || strings.Contains(out, "MB/sec") {
			t.Errorf("table:\n%s", out)
		}
		j, _ := json.Marshal(r.JSON(&oo))
		if !strings.Contains(string(j), `"bw_avg_Gbps"`) || strings.Contains(string(j), "MBps") {
			t.Errorf("JSON %s", j)
		}
	}
	if c.Local.BWAvg <= 0 || c.Local.BWPeak < c.Local.BWAvg*(1-1e-9) {
		t.Errorf("report %+v", c.Local)
	}
}

// TestOptionsRefused: options perftest's tests do not take together get an
// error before anything connects.
func TestOptionsRefused(t *testing.T) {
	for _, o := range []Options{
		{Test: SendBW, QPs: 2},
		{Test: WriteLat, QPs: 2},
		{Test: WriteBW, QPs: -1},
		{Test: WriteBW, QPs: MaxQPs + 1},
		{Test: SendBW, Duration: time.Second, All: true},
		{Test: WriteBW, Duration: 1500 * time.Millisecond},
		{Test: WriteBW, Duration: -time.Second},
		{Test: WriteBW, Duration: time.Second, All: true},
		{Test: SendBW, Duplex: true},
		{Test: WriteLat, Duplex: true},
		{Test: WriteBW, Duplex: true, All: true, Duration: time.Second}, // -D with -a, as perftest
		{Test: WriteBW, Output: "latency"},
		{Test: ReadLat, Output: "bandwidth"},
		{Test: SendBW, Output: "Bandwidth"},
	} {
		if err := Fill(&o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// TestLoopbackDuplex: write_bw and read_bw both ways at once (perftest's
// -b), on two queue pairs: each side measures its own traffic, receives
// the other's report, and prints the two added, the same line on both.
func TestLoopbackDuplex(t *testing.T) {
	for _, test := range []Test{WriteBW, ReadBW} {
		for _, secs := range []time.Duration{0, time.Second} {
			t.Run(fmt.Sprintf("%s/D%v", test, secs), func(t *testing.T) { duplexPair(t, test, secs) })
		}
	}
}

// TestLoopbackDuplexAll: -b with --all: every size both ways, each side
// receiving the other's report of each size and printing the two added,
// a line a size.
func TestLoopbackDuplexAll(t *testing.T) {
	for _, test := range []Test{WriteBW, ReadBW} {
		t.Run(string(test), func(t *testing.T) {
			o := Options{Test: test, Iters: 5, All: true, Duplex: true, Connect: gowarp.ConnectOptions{NoP2P: true}}
			c, s := pair(t, o)
			if len(c.Sizes) != 23 || len(s.Sizes) != 23 || len(c.RemoteSizes) != 23 || len(s.RemoteSizes) != 23 {
				t.Fatalf("sizes: client %d and %d, server %d and %d; want 23 of each", len(c.Sizes), len(c.RemoteSizes), len(s.Sizes), len(s.RemoteSizes))
			}
			oo := o
			oo.defaults()
			var cb strings.Builder
			c.WriteTable(&cb, &oo)
			for i := range c.Sizes {
				if c.Sizes[i].Size != 2<<i || c.Sizes[i].Iters != 5 || c.RemoteSizes[i] != s.Sizes[i] || s.RemoteSizes[i] != c.Sizes[i] {
					t.Fatalf("size %d: client %+v and %+v, server %+v and %+v", 2<<i, c.Sizes[i], c.RemoteSizes[i], s.Sizes[i], s.RemoteSizes[i])
				}
				if sum := addReports(c.Sizes[i], c.RemoteSizes[i]); !strings.Contains(cb.String(), sum.Line(false)) {
					t.Errorf("the client's table lacks size %d's line %q:\n%s", 2<<i, sum.Line(false), cb.String())
				}
			}
			if sizes, _ := s.JSON(&oo)["sizes"].([]map[string]any); len(sizes) != 23 || fmt.Sprint(sizes[22]["size"]) != fmt.Sprint(MaxSize) {
				t.Errorf("the server's -json has sizes %v, want 23 up to %d", sizes, MaxSize)
			}
		})
	}
}

// duplexPair runs a bidirectional test of 100 messages a queue pair, or
// for a duration (perftest's -b -D: each side sends for it and counts
// what completed in its sampled window).
func duplexPair(t *testing.T, test Test, d time.Duration) {
	o := Options{Test: test, Iters: 100, Size: 16384, QPs: 2, Duplex: true, Duration: d, Connect: gowarp.ConnectOptions{NoP2P: true}}
	c, s := pair(t, o)
	want := func(n uint64) bool { return n == 200 }
	if d != 0 {
		want = func(n uint64) bool { return n > 0 }
	}
	if !want(c.Local.Iters) || !want(s.Local.Iters) || c.Local.BWAvg <= 0 || s.Local.BWAvg <= 0 {
		t.Fatalf("reports: client %+v, server %+v; want 200 messages (or a duration's) measured on each side", c.Local, s.Local)
	}
	if c.Remote != s.Local || s.Remote != c.Local {
		t.Errorf("the reports crossed wrong: client has %+v and %+v, server %+v and %+v", c.Local, c.Remote, s.Local, s.Remote)
	}
	oo := o
	oo.defaults()
	var cb, sb strings.Builder
	c.WriteTable(&cb, &oo)
	s.WriteTable(&sb, &oo)
	// Each side's line adds the two ways' figures to its own count, as
	// perftest's print_full_bw_report (the counts differ in a duration).
	sum, ssum := c.Duplex(), s.Duplex()
	if sum.BWAvg != c.Local.BWAvg+s.Local.BWAvg || ssum.BWAvg != sum.BWAvg || sum.Iters != c.Local.Iters || ssum.Iters != s.Local.Iters ||
		!strings.Contains(cb.String(), sum.Line(false)) || !strings.Contains(sb.String(), ssum.Line(false)) ||
		!strings.Contains(cb.String(), "Bidirectional BW Test") {
		t.Errorf("sums %+v, %+v; tables:\n%s\n%s", sum, ssum, cb.String(), sb.String())
	}
}

// TestLoopbackDurationLatency: the latency tests for a duration (perftest's
// -D, both sides): each side ping-pongs until its own end, then reports
// its count in the sampled second, the average latency and the rate.
func TestLoopbackDurationLatency(t *testing.T) {
	for _, test := range []Test{WriteLat, ReadLat, SendLat} {
		t.Run(string(test), func(t *testing.T) {
			o := Options{Test: test, Size: 64, RxDepth: 4, Duration: time.Second, Connect: gowarp.ConnectOptions{NoP2P: true}}
			c, s := pair(t, o)
			sides := map[string]*Result{"client": c, "server": s}
			if test == ReadLat {
				delete(sides, "server")
			}
			for who, r := range sides {
				l := r.Lat
				if !l.Sampled || l.Iters == 0 || l.Avg <= 0 || math.Abs(l.TPS-float64(l.Iters)) > 1e-6*l.TPS {
					t.Errorf("the %s's report %+v: want a count, its average and its rate over 1 s", who, l)
				}
				var b strings.Builder
				oo := o
				oo.defaults()
				r.WriteTable(&b, &oo)
				if !strings.Contains(b.String(), LatResultHeaderSampled) || !strings.Contains(b.String(), l.Line()) {
					t.Errorf("the %s's table:\n%s", who, b.String())
				}
			}
		})
	}
}

// TestDurationWriteLatLaterPeer: a write_lat server whose duration ends
// after its client's finds the connection up until its own end, as siw's
// needs (the client waited for the server's close; it had closed at its
// own end, and a siw server that then posted its reply never saw it
// complete). Before, the server here failed: its peer went early.
func TestDurationWriteLatLaterPeer(t *testing.T) {
	so := Options{Test: WriteLat, Size: 64, Duration: 2 * time.Second, Connect: gowarp.ConnectOptions{NoP2P: true}}
	co := so
	co.Duration = time.Second
	cr, cerr, sr, serr := runPair(t, so, co, nil)
	if cerr != nil || serr != nil {
		t.Fatalf("client: %v; server: %v", cerr, serr)
	}
	if cr.Lat.Iters == 0 || sr.Lat.Iters == 0 {
		t.Errorf("the client counted %d round trips, the server %d: want some each", cr.Lat.Iters, sr.Lat.Iters)
	}
}

// TestQPsMismatch: sides given different -q say so. A gowarp server with
// fewer queue pairs than its client names the extra connections (it had
// seen only the client's close); a client with more names the one the
// server did not take.
func TestQPsMismatch(t *testing.T) {
	so := Options{Test: WriteBW, Iters: 20, QPs: 1, Connect: gowarp.ConnectOptions{NoP2P: true}}
	co := so
	co.QPs, co.DataTries = 2, 3
	_, cerr, _, serr := runPair(t, so, co, nil)
	if cerr == nil || !strings.Contains(cerr.Error(), "queue pair 2 of 2") || !strings.Contains(cerr.Error(), "the server took 1: give both sides the same -q") {
		t.Errorf("client: %v; want the second queue pair's failure and the hint", cerr)
	}
	if serr == nil || !strings.Contains(serr.Error(), "data connection(s) beyond -q 1: give both sides the same -q") {
		t.Errorf("server: %v; want the extra connections named", serr)
	}
}

// TestDuplexMismatch: a write_bw or read_bw server given -b and a client without it,
// and the reverse, had both run to the end, printing figures of traffic
// neither ran (their exchanges are alike). The server now sees it and
// says so; the client fails with it.
func TestDuplexMismatch(t *testing.T) {
	for _, test := range []Test{WriteBW, ReadBW} {
		for _, serverDuplex := range []bool{true, false} {
			so := Options{Test: test, Iters: 20, Size: 4096, Duplex: serverDuplex, Connect: gowarp.ConnectOptions{NoP2P: true}}
			co := so
			co.Duplex = !serverDuplex
			_, cerr, _, serr := runPair(t, so, co, nil)
			if serr == nil || !strings.Contains(serr.Error(), "give both sides -b or neither") {
				t.Errorf("%s, server -b %v, client -b %v: server %v; want the mismatch named", test, so.Duplex, co.Duplex, serr)
			}
			if cerr == nil {
				t.Errorf("%s, server -b %v, client -b %v: the client did not fail", test, so.Duplex, co.Duplex)
			}
		}
	}
}

// TestAllMismatch: one side with --all and the other without ran the
// first size and then failed on a closed connection (or, read_lat, a
// bounds Terminate) without saying why; the side with --all names it.
func TestAllMismatch(t *testing.T) {
	for _, test := range []Test{WriteLat, SendLat, ReadLat} {
		for _, serverAll := range []bool{true, false} {
			if test == ReadLat && serverAll {
				continue // its server measures nothing and takes any size
			}
			so := Options{Test: test, Iters: 5, RxDepth: 4, All: serverAll, Connect: gowarp.ConnectOptions{NoP2P: true}}
			co := so
			co.All = !serverAll
			// The side without --all waits for its peer's close (2–3 s)
			// before it goes; then the other learns it.
			_, cerr, _, serr := runPair(t, so, co, nil)
			err := cerr
			if serverAll {
				err = serr
			}
			if err == nil || !strings.Contains(err.Error(), "give both sides --all, perftest's -a, or neither") {
				t.Errorf("%s, server --all %v: the side with --all said %v; want the mismatch named", test, serverAll, err)
			}
		}
	}
}

// TestWriteOutput: --output's numbers, one for each line the table
// would show: the average or the message rate of a bandwidth report (a
// server's the client's, a bidirectional run's the sum, every size's
// with --all), a latency test's average (read_lat's client after a rule,
// its server nothing).
func TestWriteOutput(t *testing.T) {
	a := Report{Size: 8, Iters: 5, BWPeak: 9, BWAvg: 1.25, MsgRateMpps: 0.5}
	b := Report{Size: 8, Iters: 5, BWPeak: 9, BWAvg: 2, MsgRateMpps: 0.25}
	for _, c := range []struct {
		name string
		r    Result
		o    Options
		want string
	}{
		{"client bandwidth", Result{Test: WriteBW, Local: a, Remote: b}, Options{Test: WriteBW, Output: "bandwidth"}, "1.250000\n"},
		{"client message rate", Result{Test: WriteBW, Local: a}, Options{Test: WriteBW, Output: "message_rate"}, "0.500000\n"},
		{"server", Result{Test: ReadBW, Server: true, Local: b, Remote: a}, Options{Test: ReadBW, Output: "bandwidth"}, "1.250000\n"},
		{"send_bw server", Result{Test: SendBW, Server: true, Local: b}, Options{Test: SendBW, Output: "bandwidth"}, "2.000000\n"},
		{"duplex", Result{Test: WriteBW, Local: a, Remote: b}, Options{Test: WriteBW, Duplex: true, Output: "bandwidth"}, "3.250000\n"},
		{"duplex all", Result{Test: WriteBW, Sizes: []Report{a, b}, RemoteSizes: []Report{b, b}}, Options{Test: WriteBW, Duplex: true, All: true, Output: "message_rate"}, "0.750000\n0.500000\n"},
		{"all", Result{Test: WriteBW, Sizes: []Report{a, b}}, Options{Test: WriteBW, All: true, Output: "bandwidth"}, "1.250000\n2.000000\n"},
		{"write_lat", Result{Test: WriteLat, Lat: LatReport{Avg: 3.5, Typical: 3}}, Options{Test: WriteLat, Output: "latency"}, "3.500000\n"},
		{"send_lat all", Result{Test: SendLat, LatSizes: []LatReport{{Avg: 1}, {Avg: 2}}}, Options{Test: SendLat, All: true, Output: "latency"}, "1.000000\n2.000000\n"},
		{"read_lat", Result{Test: ReadLat, Lat: LatReport{Avg: 7}}, Options{Test: ReadLat, Output: "latency"}, ResultLine + "\n7.000000\n"},
		{"read_lat server", Result{Test: ReadLat, Server: true}, Options{Test: ReadLat, Output: "latency"}, ""},
	} {
		var w strings.Builder
		c.r.WriteOutput(&w, &c.o)
		if w.String() != c.want {
			t.Errorf("%s: %q, want %q", c.name, w.String(), c.want)
		}
	}
}

// TestAllHint: the --all hint is for a peer that went at the second size
// or refused a larger size's access, not for one killed later (a -b
// --all server whose client was killed at 4 MiB had blamed --all).
func TestAllHint(t *testing.T) {
	all := &Options{All: true}
	for _, c := range []struct {
		o    *Options
		size int
		err  error
		hint bool
	}{
		{all, 4, gowarp.ErrPeerClosed, true},
		{all, 4, gowarp.ErrLinkLost, true},
		{all, 4 << 20, gowarp.ErrLinkLost, false},
		{all, 2, gowarp.ErrPeerClosed, false},
		{all, 16384, gowarp.ErrPeerTerminated, true},
		{&Options{}, 4, gowarp.ErrPeerClosed, false},
	} {
		err := allHint(c.o, c.size, c.err)
		if hint := strings.Contains(err.Error(), "give both sides --all"); hint != c.hint || !errors.Is(err, c.err) {
			t.Errorf("all %v, %d B, %v: %v; want the hint %v", c.o.All, c.size, c.err, err, c.hint)
		}
	}
}

// TestDuplexLineGbits: a bidirectional run in Gb/s prints six decimals
// when this side's own average is below 0.1, whatever the sum, as
// perftest's print_full_bw_report decides before adding the peer's.
func TestDuplexLineGbits(t *testing.T) {
	r := &Result{Test: WriteBW, Local: Report{Size: 65536, Iters: 200, BWPeak: 2, BWAvg: 0.05, MsgRateMpps: 0.0001},
		Remote: Report{Size: 65536, Iters: 200, BWPeak: 2.090479, BWAvg: 0.311633, MsgRateMpps: 0.00059}}
	o := Options{Test: WriteBW, Duplex: true, Gbits: true}
	var b strings.Builder
	r.WriteTable(&b, &o)
	if want := " 65536      200           4.090479            0.361633            0.000690"; !strings.Contains(b.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, b.String())
	}
	r.Local.BWAvg = 0.5
	b.Reset()
	r.WriteTable(&b, &o)
	if want := " 65536      200              4.09               0.81"; !strings.Contains(b.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, b.String())
	}
}
