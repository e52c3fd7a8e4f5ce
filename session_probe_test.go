//go:build linux

package gowarp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestSessionProbes: a session probes a connection only when the peer has
// been quiet on it for a quarter of the heartbeat timeout (the dialing
// side) or half of it (the accepting side). Idle, the dialing side sends
// at most one probe per path per quarter, and some (a dead path must
// still be found), the accepting side none, and neither looks at its
// connections between probes; a path the peer streams on is not probed
// at all.
// Before, each side probed every path at every heartbeat, busy or not:
// 500 idle sessions between two processes took about half a CPU on
// each side.
func TestSessionProbes(t *testing.T) {
	cfg := testSessionConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 20*time.Millisecond, 800*time.Millisecond // probes after 200 ms quiet
	cli, srv, pd := loopSessionWith(t, cfg, cfg)
	waitFor(t, "both paths up on both sides", func() bool {
		return cli.Stats().Conns == 2 && srv.Stats().Conns == 2
	})
	total := func(s *gowarp.Session) (n uint64) {
		for _, p := range gowarp.SessionProbes(s) {
			n += p
		}
		return n
	}
	c0, s0 := total(cli), total(srv)
	b0, bs0 := gowarp.SessionBeats(cli), gowarp.SessionBeats(srv)
	time.Sleep(time.Second)
	dc, ds := total(cli)-c0, total(srv)-s0
	bc, bs := gowarp.SessionBeats(cli)-b0, gowarp.SessionBeats(srv)-bs0
	t.Logf("idle for 1 s: %d and %d probes, %d and %d heartbeats", dc, ds, bc, bs)
	// Two paths, a probe each per 200 ms at most, and one more at the
	// edges; the dialing side's.
	if dc > 12 {
		t.Errorf("idle for 1 s: the client probed %d times, want at most 12", dc)
	}
	if dc == 0 {
		t.Error("idle for 1 s: the client did not probe")
	}
	// The accepting side probes after 400 ms quiet, which the client's
	// probes end; one may slip through on a loaded host.
	if ds > 2 {
		t.Errorf("idle for 1 s: the server probed %d times, want none: the client probes", ds)
	}
	// Idle, a session looks at its connections when a probe is due:
	// every 200 ms on each path (their phases apart on a loaded host, 10
	// a second), not every 20 ms (50 a second).
	if bc > 20 || bs > 20 {
		t.Errorf("idle for 1 s: %d and %d heartbeats, want at most 20 a side", bc, bs)
	}
	// The accepting side moves its next look at every probe it answers,
	// so it does not look between them: it looked 4 times a second
	// before, at the looks it had set before the probes came.
	if bs > 2 {
		t.Errorf("idle for 1 s: the accepting side looked %d times, want at most 2: the dialing side's probes move its looks", bs)
	}

	// Streams both ways at 1000 posts a second for 2 s: each side hears
	// the other's Sends and Writes on the path the other sends on.
	dstC, _ := pd.Register(make([]byte, 2000*8), gowarp.LocalWrite|gowarp.RemoteWrite|gowarp.RemoteRead)
	dstS, _ := pd.Register(make([]byte, 2000*8), gowarp.LocalWrite|gowarp.RemoteWrite|gowarp.RemoteRead)
	up := &stream{s: cli, count: 2000, size: 64, depth: 16, dst: dstS, peerCount: 2000, rate: 1000}
	down := &stream{s: srv, count: 2000, size: 64, depth: 16, dst: dstC, peerCount: 2000, rate: 1000}
	errs := make(chan error, 2)
	go func() { errs <- up.run(pd) }()
	go func() { errs <- down.run(pd) }()
	time.Sleep(500 * time.Millisecond)
	cp, sp := cli.Stats().TxPath, srv.Stats().TxPath
	c1, s1 := gowarp.SessionProbes(cli), gowarp.SessionProbes(srv)
	time.Sleep(time.Second)
	c2, s2 := gowarp.SessionProbes(cli), gowarp.SessionProbes(srv)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if cp < 0 || sp < 0 || cli.Stats().Failovers+srv.Stats().Failovers > 0 {
		t.Fatalf("paths %d and %d, %d and %d fail-overs: the streams did not stay on one path each", cp, sp, cli.Stats().Failovers, srv.Stats().Failovers)
	}
	// One probe is a stall of the peer's stream longer than 200 ms (a
	// loaded host); idle, there would be five.
	if d := c2[sp] - c1[sp]; d > 1 {
		t.Errorf("the client probed path %d, which the server streams on, %d times in 1 s", sp, d)
	}
	if d := s2[cp] - s1[cp]; d > 1 {
		t.Errorf("the server probed path %d, which the client streams on, %d times in 1 s", cp, d)
	}
}

// TestSessionLooksAligned: idle sessions look at their connections on
// the heartbeat interval's grid, whenever they were made, so that the
// runtime wakes once for a batch of them. Each woke at its own instant
// before: 500 idle sessions cost 10–12 % of a CPU a side, 4–6 % aligned.
func TestSessionLooksAligned(t *testing.T) {
	cfg := testSessionConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 20*time.Millisecond, 800*time.Millisecond
	var ss []*gowarp.Session
	for range 3 {
		cli, srv, _ := loopSessionWith(t, cfg, cfg)
		ss = append(ss, cli, srv)
		time.Sleep(7 * time.Millisecond) // phases apart
	}
	onGrid := func(s *gowarp.Session) bool {
		lo, hi, iv := gowarp.SessionNextLook(s)
		return hi/iv*iv >= lo
	}
	waitFor(t, "every idle session's next look on the grid", func() bool {
		for _, s := range ss {
			if !onGrid(s) {
				return false
			}
		}
		return true
	})
}

// TestSessionIdleDetection: an idle session that looks at its connections
// only when a probe or a timeout is due still ends a connection whose peer
// went silent HeartbeatTimeout after it last heard from it, not later,
// whichever side went silent: it notes when it hears, not when it next
// looks. The silent side's goroutine is held still, as a hung process
// would be; its queue pairs go on taking bytes in.
func TestSessionIdleDetection(t *testing.T) {
	cfg := testSessionConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 20*time.Millisecond, 2*time.Second
	cli, srv, _ := loopSessionWith(t, cfg, cfg)
	for _, tc := range []struct {
		name            string
		silent, watcher *gowarp.Session
	}{{"the client silent", cli, srv}, {"the server silent", srv, cli}} {
		waitFor(t, "both paths up on both sides", func() bool {
			return cli.Stats().Conns == 2 && srv.Stats().Conns == 2
		})
		time.Sleep(1500 * time.Millisecond) // idle: looks far apart
		before := tc.watcher.Stats().Failovers
		release := gowarp.StallSession(tc.silent)
		start := time.Now() // the silent side heard nothing since
		waitFor(t, tc.name+": the other side's connection ended", func() bool { return tc.watcher.Stats().Failovers > before })
		d := tc.watcher.Stats().LastFailover.Sub(start)
		release()
		t.Logf("%s: found %v after", tc.name, d)
		// The watcher last heard from it at most a probe interval
		// before; a loaded host's timers may be a little late.
		if d > cfg.HeartbeatTimeout+400*time.Millisecond {
			t.Errorf("%s: the connection ended %v after, want at most %v", tc.name, d, cfg.HeartbeatTimeout)
		}
	}
}

// TestSessionBadSGE: a session checks a work request's SGEs when it is
// posted, and keeps their regions while it may still send it. A bad SGE
// is the post's ErrLocalAccess. Before, the session took it, and the
// post of it on the wire failed each connection in turn: 2,700
// fail-overs in 2 s, until the deadline failed the session. A region
// under an outstanding Send cannot be deregistered; once the Send
// completes, it can.
func TestSessionBadSGE(t *testing.T) {
	cli, srv, pd := loopSession(t, gowarp.SessionConfig{})
	mr, err := pd.Register(make([]byte, 64), 0)
	if err != nil {
		t.Fatal(err)
	}
	sink, _ := pd.Register(make([]byte, 64), 0) // no LocalWrite
	for _, tc := range []struct {
		name string
		wr   gowarp.SendWR
	}{
		{"outside the region", gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Offset: 100, Length: 8}}}},
		{"no region", gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{Length: 8}}, RKey: 1}},
		{"negative length", gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Length: -1}}}},
		{"a Read into a region without LocalWrite", gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: sink, Length: 8}}, RKey: 1}},
	} {
		if err := cli.PostSend(&tc.wr); !errors.Is(err, gowarp.ErrLocalAccess) {
			t.Errorf("%s: %v, want ErrLocalAccess", tc.name, err)
		}
	}
	// What a queue pair refuses otherwise, the session refuses alike.
	for _, tc := range []struct {
		name string
		wr   gowarp.SendWR
		want error
	}{
		{"an unknown flag", gowarp.SendWR{Op: gowarp.OpSend, Flags: 1 << 6, SGL: []gowarp.SGE{{MR: mr, Length: 8}}}, gowarp.ErrBadOp},
		{"an atomic", gowarp.SendWR{Op: gowarp.OpFetchAdd, SGL: []gowarp.SGE{{MR: mr, Length: 8}}, RKey: 1}, gowarp.ErrBadOp},
		{"a Send of MaxSGE SGEs", gowarp.SendWR{Op: gowarp.OpSend, SGL: make([]gowarp.SGE, gowarp.MaxSGE)}, gowarp.ErrTooManySGE},
	} {
		if err := cli.PostSend(&tc.wr); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if st := cli.Stats(); st.Failovers != 0 || st.Conns != 2 {
		t.Fatalf("after the refused posts: %+v", st)
	}

	// A Send's region stays registered until the Send completes: the
	// server's goroutine is held still, so no acknowledgement comes and
	// the Send stays outstanding (the queue pair's own pin ended when the
	// socket took it).
	if err := srv.PostRecv(&gowarp.RecvWR{ID: 7, SGL: []gowarp.SGE{{MR: sink, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	release := gowarp.StallSession(srv)
	if err := cli.PostSend(&gowarp.SendWR{ID: 5, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: mr, Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // sent, not acknowledged
	if err := mr.Deregister(); !errors.Is(err, gowarp.ErrRegionBusy) {
		t.Errorf("Deregister under an outstanding Send: %v, want ErrRegionBusy", err)
	}
	release()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]gowarp.SessionCompletion
	for cli.Poll(wc[:]) == 0 {
		if err := cli.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if wc[0].ID != 5 || wc[0].Err != nil {
		t.Fatalf("completion %+v", wc[0])
	}
	if err := mr.Deregister(); err != nil {
		t.Fatalf("Deregister after the Send completed: %v", err)
	}

	// A session that ends ends its pins: a Send still outstanding at
	// Close completes with ErrSessionClosed, and its region can go.
	other, _ := pd.Register(make([]byte, 64), 0)
	release = gowarp.StallSession(srv)
	defer release()
	if err := cli.PostSend(&gowarp.SendWR{ID: 6, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: other, Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := other.Deregister(); !errors.Is(err, gowarp.ErrRegionBusy) {
		t.Errorf("Deregister under an outstanding Send: %v, want ErrRegionBusy", err)
	}
	cli.Close()
	if err := other.Deregister(); err != nil {
		t.Errorf("Deregister after the session closed: %v", err)
	}
}
