package gowarp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// loopSession is a session of two paths over loopback, one device.
func loopSession(t testing.TB, cfg gowarp.SessionConfig) (cli, srv *gowarp.Session, pd *gowarp.PD) {
	t.Helper()
	return loopSessionWith(t, cfg, cfg)
}

// loopSessionWith is loopSession with each side's own configuration.
func loopSessionWith(t testing.TB, cfg, srvCfg gowarp.SessionConfig) (cli, srv *gowarp.Session, pd *gowarp.PD) {
	t.Helper()
	return loopSessionVia(t, cfg, srvCfg, nil)
}

// loopSessionVia is loopSessionWith with the client dialing via(addr)
// for each listener's address (a proxy's, say), if via is not nil.
func loopSessionVia(t testing.TB, cfg, srvCfg gowarp.SessionConfig, via func(string) string) (cli, srv *gowarp.Session, pd *gowarp.PD) {
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
		addr := ln.Addr().String()
		if via != nil {
			addr = via(addr)
		}
		paths = append(paths, addr)
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
		RemoteAddr: dst.Addr(), RKey: dst.STag()}
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

// TestFailoverPeerGone: when the peer closes its session, this side's
// ends with ErrSessionClosed (closed): told by the peer's Close message
// or, when the connection's end overtook it, by the listener refusing the
// rejoin of a session it closed. When the peer restarts and knows the
// session no more (lost: the connections are cut and the paths dialed
// again reach a listener that never knew it), it fails with
// ErrSessionLost. Either way its work completes with that error at once,
// not at the deadline.
func TestFailoverPeerGone(t *testing.T) {
	check := func(t *testing.T, cli *gowarp.Session, src *gowarp.MR, want error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for cli.Err() == nil && ctx.Err() == nil {
			_ = cli.PostSend(&gowarp.SendWR{ID: 7, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 64}}})
			time.Sleep(10 * time.Millisecond)
		}
		if err := cli.Err(); !errors.Is(err, want) {
			t.Fatalf("session after its peer closed: %v, want %v", err, want)
		}
		var wc [256]gowarp.SessionCompletion
		for _, c := range wc[:cli.Poll(wc[:])] {
			if c.Err != nil && !errors.Is(c.Err, want) {
				t.Errorf("completion %d: %v, want success or %v", c.ID, c.Err, want)
			}
		}
	}
	t.Run("closed", func(t *testing.T) {
		cli, srv, pd := loopSession(t, gowarp.SessionConfig{Deadline: time.Minute})
		src, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
		srv.Close()
		check(t, cli, src, gowarp.ErrSessionClosed)
	})
	t.Run("closed, its message lost", func(t *testing.T) {
		// The connections are cut before the peer closes: its Close
		// reaches no one, and the rejoin is refused as closed.
		cfg := gowarp.SessionConfig{Deadline: time.Minute}
		cli, srv, pd, proxies := proxiedSession(t, cfg)
		src, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
		for _, p := range proxies {
			p.cut(false, "")
		}
		srv.Close()
		for _, p := range proxies {
			p.cut(true, "")
		}
		check(t, cli, src, gowarp.ErrSessionClosed)
	})
	t.Run("lost", func(t *testing.T) {
		// The peer restarts: its connections are cut, and the paths
		// dialed again reach a listener that never knew the session.
		cfg := gowarp.SessionConfig{Deadline: time.Minute}
		cli, _, pd, proxies := proxiedSession(t, cfg)
		src, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
		dev2 := gowarp.Open()
		var lns []*gowarp.Listener
		for range proxies {
			ln, err := dev2.Listen("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			lns = append(lns, ln)
		}
		sl := dev2.AllocPD().ListenSession(cfg, lns...)
		t.Cleanup(func() { sl.Close() })
		for i, p := range proxies {
			p.cut(true, lns[i].Addr().String())
		}
		check(t, cli, src, gowarp.ErrSessionLost)
	})
}

// proxiedSession is loopSession with cfg on both sides, each of its
// paths relayed by a cutProxy of its own.
func proxiedSession(t testing.TB, cfg gowarp.SessionConfig) (cli, srv *gowarp.Session, pd *gowarp.PD, proxies []*cutProxy) {
	t.Helper()
	cli, srv, pd = loopSessionVia(t, cfg, cfg, func(addr string) string {
		p := newCutProxy(t, addr)
		proxies = append(proxies, p)
		return p.addr
	})
	return cli, srv, pd, proxies
}

// cutProxy relays TCP connections to a backend until cut: cut resets
// every connection relayed and relays new ones to another backend, or,
// with open false, refuses them until cut is called again with open true.
type cutProxy struct {
	addr    string
	mu      sync.Mutex
	open    bool
	backend string
	conns   []net.Conn
}

func newCutProxy(t testing.TB, backend string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &cutProxy{addr: ln.Addr().String(), open: true, backend: backend}
	t.Cleanup(func() { p.cut(false, "") })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if !p.open {
				p.mu.Unlock()
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
				continue
			}
			b, err := net.Dial("tcp", p.backend)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			go func() { io.Copy(b, c); b.Close() }()
			go func() { io.Copy(c, b); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) cut(open bool, backend string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	p.conns, p.open = nil, open
	if backend != "" {
		p.backend = backend
	}
}

// TestSessionRedialNoGarbage: a path that stays down is dialed again
// twice a second for as long as the session lives, and each try built
// its receive buffers anew on the heap (2.4 MB with the defaults: 4.9 MB
// a second of garbage per session, 2.4 GB a second for 500 sessions with
// a link down). A failed try left them to the next; they are now mapped
// outside the heap, and a failed try unmaps its untouched pages.
func TestSessionRedialNoGarbage(t *testing.T) {
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := gone.Addr().String()
	gone.Close() // a port that refuses
	n := 0
	cli, _, _ := loopSessionVia(t, gowarp.SessionConfig{}, gowarp.SessionConfig{}, func(addr string) string {
		if n++; n == 2 {
			return dead // the second path
		}
		return addr
	})
	time.Sleep(1200 * time.Millisecond) // the pause between tries grows to 500 ms
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	time.Sleep(1500 * time.Millisecond) // three tries or so
	runtime.ReadMemStats(&m1)
	if got := m1.TotalAlloc - m0.TotalAlloc; got > 1<<20 {
		t.Errorf("%d bytes allocated in 1.5 s by a session with one path down", got)
	}
	if err := cli.Err(); err != nil {
		t.Fatalf("session: %v", err)
	}
}

// TestSessionRejoinAfterFailedRedials: a path whose redials fail for a
// while joins again once its peer answers, and then carries messages
// whole both ways on its own.
func TestSessionRejoinAfterFailedRedials(t *testing.T) {
	cfg := gowarp.SessionConfig{HeartbeatInterval: 20 * time.Millisecond, HeartbeatTimeout: 300 * time.Millisecond,
		MaxMessage: 4096, Deadline: 30 * time.Second}
	cli, srv, pd, proxies := proxiedSession(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	joins := cli.Stats().Joins
	proxies[1].cut(false, "")          // path 1 is reset, and its redials refused
	time.Sleep(700 * time.Millisecond) // tries 20, 40, 80, 160 and 320 ms apart fail
	if cli.Stats().Joins != joins {
		t.Fatal("path 1 joined again through a proxy that refuses")
	}
	proxies[1].cut(true, "")
	for cli.Stats().Joins == joins || cli.Conns()[1] == nil {
		if ctx.Err() != nil {
			t.Fatal("path 1 did not join again")
		}
		time.Sleep(5 * time.Millisecond)
	}
	proxies[0].cut(false, "") // from now on path 1 alone carries
	const n, size = 64, 1000
	take := func(s *gowarp.Session, op gowarp.CompletionOp, check func(c gowarp.SessionCompletion)) {
		t.Helper()
		takeSession(ctx, t, s, n, op, check)
	}
	exchange := func(from, to *gowarp.Session, seed byte) {
		t.Helper()
		src, _ := pd.Register(make([]byte, n*size), gowarp.LocalWrite)
		dst, _ := pd.Register(make([]byte, n*4096), gowarp.LocalWrite)
		for i := range n {
			if err := to.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: dst, Offset: i * 4096, Length: 4096}}}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			p := src.Bytes()[i*size : (i+1)*size]
			for j := range p {
				p[j] = seed + byte(i) + byte(j)
			}
			if err := from.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Offset: i * size, Length: size}}}); err != nil {
				t.Fatal(err)
			}
		}
		take(from, gowarp.CompSend, func(gowarp.SessionCompletion) {})
		take(to, gowarp.CompRecv, func(c gowarp.SessionCompletion) {
			p := dst.Bytes()[int(c.ID)*4096:][:size]
			if c.Bytes != size || !bytes.Equal(p, src.Bytes()[int(c.ID)*size:][:size]) {
				t.Fatalf("message %d: %d bytes, not those sent", c.ID, c.Bytes)
			}
		})
	}
	exchange(cli, srv, 1)
	exchange(srv, cli, 100)
	if tx := cli.Stats().TxPath; tx != 1 {
		t.Errorf("client sends on path %d, want 1", tx)
	}
}

// TestSessionBuffersOffHeap: a connection's receive buffers (2.3 MB with
// the defaults) are mapped outside the Go heap. On the heap they were
// zeroed, so touched, by the next owner of their memory once a session
// closed: 300 sessions a side, closed and opened again twice, grew RSS
// from 55 to 764 MB; and the runtime counted them whole against
// GOMEMLIMIT.
func TestSessionBuffersOffHeap(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the buffers are mapped outside the heap on Linux only")
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cli, srv, _ := loopSession(t, gowarp.SessionConfig{})
	waitFor(t, "both paths up on both sides", func() bool {
		return cli.Stats().Conns == 2 && srv.Stats().Conns == 2
	})
	runtime.ReadMemStats(&m1)
	// Four connections' buffers, 9.2 MB of heap when they were there.
	if got := m1.TotalAlloc - m0.TotalAlloc; got > 2<<20 {
		t.Errorf("a session pair of two paths allocated %d bytes of heap", got)
	}
}

// TestSessionHeldMessagesOutliveTheirConnection: messages taken in on a
// connection that then ends wait in its buffers until the application
// posts receives; the buffers, outside the heap, go only once the last
// of them is delivered, and what is delivered is what was sent.
func TestSessionHeldMessagesOutliveTheirConnection(t *testing.T) {
	cfg := testSessionConfig()
	cli, srv, pd := loopSession(t, cfg)
	waitFor(t, "both paths up on both sides", func() bool {
		return cli.Stats().Conns == 2 && srv.Stats().Conns == 2
	})
	const n, size = 3, 1000
	src, _ := pd.Register(make([]byte, n*size), gowarp.LocalWrite)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i*7 + i/size)
	}
	for i := range n {
		if err := cli.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Offset: i * size, Length: size}}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the server took the Sends in, with no receive posted", func() bool {
		rcvd, _ := gowarp.SessionTakenIn(srv)
		return rcvd == n
	})
	before := cli.Stats().Failovers
	gowarp.CloseSessionPath(srv, cli.Stats().TxPath)
	waitFor(t, "the client failed over", func() bool { return cli.Stats().Failovers > before })
	time.Sleep(100 * time.Millisecond) // the server's session handles the end
	dst, _ := pd.Register(make([]byte, n*size), gowarp.LocalWrite)
	for i := range n {
		if err := srv.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: dst, Offset: i * size, Length: size}}}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	takeSession(ctx, t, srv, n, gowarp.CompRecv, func(c gowarp.SessionCompletion) {
		if c.Bytes != size {
			t.Fatalf("completion %+v", c)
		}
	})
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("the messages delivered are not those sent")
	}
	if _, dlvd := gowarp.SessionTakenIn(srv); dlvd != n {
		t.Fatalf("delivered %d, want %d", dlvd, n)
	}
}

// takeSession takes n successful completions of op from s, calling check
// for each.
func takeSession(ctx context.Context, t *testing.T, s *gowarp.Session, n int, op gowarp.CompletionOp, check func(c gowarp.SessionCompletion)) {
	t.Helper()
	var wc [16]gowarp.SessionCompletion
	for got := 0; got < n; {
		k := s.Poll(wc[:])
		if k == 0 {
			if err := s.Wait(ctx); err != nil {
				t.Fatalf("%d of %d: %v", got, n, err)
			}
			continue
		}
		for _, c := range wc[:k] {
			if c.Err != nil || c.Op != op {
				t.Fatalf("completion %+v, want %v", c, op)
			}
			check(c)
			got++
		}
	}
}

// TestSessionCloseFreesHeldBuffers: a session closed with messages taken
// in and never delivered (no receive posted) frees the buffers they wait
// in, as it frees the others: every region the sessions registered is
// gone once both have closed.
func TestSessionCloseFreesHeldBuffers(t *testing.T) {
	cfg := testSessionConfig()
	cli, srv, pd := loopSession(t, cfg)
	waitFor(t, "both paths up on both sides", func() bool {
		return cli.Stats().Conns == 2 && srv.Stats().Conns == 2
	})
	src, _ := pd.Register(make([]byte, 3000), gowarp.LocalWrite)
	for i := range 3 {
		if err := cli.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: src, Offset: i * 1000, Length: 1000}}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the server took the Sends in, with no receive posted", func() bool {
		rcvd, _ := gowarp.SessionTakenIn(srv)
		return rcvd == 3
	})
	srv.Close()
	cli.Close()
	waitFor(t, "the sessions' regions deregistered", func() bool { return pd.Table().Len() == 1 }) // src
}
