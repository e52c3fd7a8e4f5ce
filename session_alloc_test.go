package gowarp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// loopSession is a session of two paths over loopback, one device.
func loopSession(t testing.TB, cfg gowarp.SessionConfig) (cli, srv *gowarp.Session, pd *gowarp.PD) {
	t.Helper()
	return loopSessionWith(t, cfg, cfg)
}

// loopSessionCfg is loopSession with each side's own configuration.
func loopSessionCfg(t testing.TB, cliCfg, srvCfg gowarp.SessionConfig) (cli, srv *gowarp.Session) {
	t.Helper()
	cli, srv, _ = loopSessionWith(t, cliCfg, srvCfg)
	return cli, srv
}

func loopSessionWith(t testing.TB, cfg, srvCfg gowarp.SessionConfig) (cli, srv *gowarp.Session, pd *gowarp.PD) {
	t.Helper()
	dev := gowarp.Open()
	pd = dev.AllocPD()
	var lns []*gowarp.Listener
	var paths []string
	for range 2 {
		ln, err := dev.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		paths = append(paths, ln.Addr().String())
	}
	sl := pd.ListenSession(srvCfg, lns...)
	t.Cleanup(func() { sl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := pd.DialSession(ctx, paths, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	if srv, err = sl.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return cli, srv, pd
}

// TestFailoverHotPathAllocs: in steady state a session's Send and Write,
// their acknowledgements, the receive's delivery and repost, and the
// polls allocate nothing, on either side.
func TestFailoverHotPathAllocs(t *testing.T) {
	cli, srv, pd := loopSession(t, gowarp.SessionConfig{})
	src, _ := pd.Register(make([]byte, 4096), gowarp.LocalWrite)
	dst, _ := pd.Register(make([]byte, 4096), gowarp.RemoteWrite|gowarp.LocalWrite)
	rbuf, _ := pd.Register(make([]byte, 4096), gowarp.LocalWrite)
	ctx := context.Background()
	send := gowarp.SendWR{ID: 1, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 256}}}
	write := gowarp.SendWR{ID: 2, Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 256}},
		RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())}
	recv := gowarp.RecvWR{ID: 3, SGL: []gowarp.SGE{{MR: rbuf, Length: 4096}}}
	var wc [4]gowarp.SessionCompletion
	take := func(s *gowarp.Session, n int) {
		for got := 0; got < n; {
			if err := s.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			for _, c := range wc[:s.Poll(wc[:])] {
				if c.Err != nil {
					t.Fatal(c.Err)
				}
				got++
			}
		}
	}
	round := func() {
		if err := srv.PostRecv(&recv); err != nil {
			t.Fatal(err)
		}
		if err := cli.PostSend(&write); err != nil {
			t.Fatal(err)
		}
		if err := cli.PostSend(&send); err != nil {
			t.Fatal(err)
		}
		take(srv, 1)
		take(cli, 2)
	}
	for range 200 { // rings and free lists grown
		round()
	}
	if n := testing.AllocsPerRun(200, round); n > 0 {
		t.Errorf("%v allocations per session round (Write, Send, receive, acks), want 0", n)
	}
}

// TestFailoverPeerGone: when the peer closes its session, the paths
// dialed again are refused (the peer knows the session no more), and the
// session fails with ErrSessionLost: its work completes with it, at once,
// not at the deadline.
func TestFailoverPeerGone(t *testing.T) {
	cli, srv, pd := loopSession(t, gowarp.SessionConfig{Deadline: time.Minute})
	src, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
	srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for cli.Err() == nil && ctx.Err() == nil {
		_ = cli.PostSend(&gowarp.SendWR{ID: 7, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 64}}})
		time.Sleep(10 * time.Millisecond)
	}
	if err := cli.Err(); !errors.Is(err, gowarp.ErrSessionLost) {
		t.Fatalf("session after its peer closed: %v, want ErrSessionLost", err)
	}
	var wc [256]gowarp.SessionCompletion
	for _, c := range wc[:cli.Poll(wc[:])] {
		if c.Err != nil && !errors.Is(c.Err, gowarp.ErrSessionLost) {
			t.Errorf("completion %d: %v, want success or ErrSessionLost", c.ID, c.Err)
		}
	}
}
