//go:build linux

package gowarp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/netns"
)

// A session that follows its STag table to another node: node A (in
// namespace A, on link 0) and node B (in namespace A too, on link 1, an
// address of its own) serve the tenant "acme"; the client, in namespace
// B, has a session to node A and streams Sends, Writes and Reads at it
// (the Writes and Reads with the STag of a region of node A's table),
// while node A streams Sends back. Node A hands its sessions and the table
// to node B (SessionListener.Export, Table.ImportSessions); the client's
// session is redirected there, rejoins with its id, and carries on; node
// A then goes away (its listener closes, its link goes down). Both sides
// count every completion.

// migServer is the server side's traffic, carried from node A's session
// to node B's: Sends of size bytes whose first 8 carry 2k for the k-th
// (what stream expects of its peer), total of them, paced at rate a
// second; and the receives of the client's Sends, each once, in order.
type migServer struct {
	size, total, rate int
	begin             time.Time
	posted, done      int // Sends posted, completed (in order)
	wantRecv, recvd   int // the next value a received Send must carry; received
	recvsOnA          int
	regions           int // regions the server application registered
	// pause, closed, tells the application on node A to stop posting
	// (and so writing its buffers' bytes, which the export copies); it
	// closes paused once it has.
	pause, paused chan struct{}
}

// run drives s until its work is done or, on node A, until the session
// moves (its Wait fails with ErrSessionMoved).
func (m *migServer) run(ctx context.Context, s *gowarp.Session, pd *gowarp.PD, peerSends int) error {
	const depth, rdepth = 16, 64
	src, err := pd.Register(make([]byte, depth*m.size), gowarp.LocalWrite)
	if err != nil {
		return err
	}
	rbuf, err := pd.Register(make([]byte, rdepth*m.size), gowarp.LocalWrite)
	if err != nil {
		return err
	}
	m.regions += 2
	for i := range rdepth {
		if err := s.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: rbuf, Offset: i * m.size, Length: m.size}}}); err != nil {
			return err
		}
	}
	moving := false
	var wc [32]gowarp.SessionCompletion
	for m.done < m.total || m.recvd < peerSends {
		select {
		case <-m.pause:
			if !moving {
				moving = true
				close(m.paused)
			}
		default:
		}
		allowed := min(m.total, 1+int(time.Since(m.begin).Seconds()*float64(m.rate)))
		for !moving && m.posted < allowed && m.posted-m.done < depth {
			off := m.posted % depth * m.size
			binary.LittleEndian.PutUint64(src.Bytes()[off:], uint64(2*m.posted))
			err := s.PostSend(&gowarp.SendWR{ID: uint64(m.posted), Op: gowarp.OpSend, Flags: gowarp.Signaled,
				SGL: []gowarp.SGE{{MR: src, Offset: off, Length: m.size}}})
			if errors.Is(err, gowarp.ErrSessionMoved) {
				moving = true // node A's export began: node B posts it
				break
			}
			if err != nil {
				return fmt.Errorf("server post %d: %w", m.posted, err)
			}
			m.posted++
		}
		wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		err := s.Wait(wctx)
		cancel()
		if errors.Is(err, gowarp.ErrSessionMoved) {
			return err
		}
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("server: %d of %d Sends complete, %d received: %w", m.done, m.total, m.recvd, err)
		}
		for _, c := range wc[:s.Poll(wc[:])] {
			if c.Op == gowarp.CompRecv && errors.Is(c.Err, gowarp.ErrSessionMoved) {
				continue // a receive left on node A
			}
			if c.Err != nil {
				return fmt.Errorf("server work request %d (%v): %w", c.ID, c.Op, c.Err)
			}
			if c.Op == gowarp.CompRecv {
				off := int(c.ID) * m.size
				if v := binary.LittleEndian.Uint64(rbuf.Bytes()[off:]); c.Bytes != m.size || v != uint64(m.wantRecv) {
					return fmt.Errorf("server received Send %d of %d bytes, want %d (lost, repeated or out of order)", v, c.Bytes, m.wantRecv)
				}
				m.wantRecv += 2
				m.recvd++
				if err := s.PostRecv(&gowarp.RecvWR{ID: c.ID, SGL: []gowarp.SGE{{MR: rbuf, Offset: off, Length: m.size}}}); err != nil && !errors.Is(err, gowarp.ErrSessionMoved) {
					return err
				}
				continue
			}
			if c.Op != gowarp.CompSend || c.ID != uint64(m.done) {
				return fmt.Errorf("server completion %d (%v), want Send %d (lost, repeated or out of order)", c.ID, c.Op, m.done)
			}
			m.done++
		}
	}
	return nil
}

// TestMigrateSessionUnderLoad: the table and the session move from node A
// to node B in the middle of both streams; every work request completes
// once, in order, successfully, on the side that posted it; every Send is
// received once, in order (on node A, then on node B); the client's Reads
// after the move, with its old STag, find the words its Writes wrote; and
// every Write's word, before the move or after, is in node B's region at
// the end. Its figure: the pause the client saw. In /redirect node A's
// listener sends the client on; in /resolve node A gives no address and
// closes its listener as soon as the export is done, and the client finds
// node B through its SessionConfig.Resolve.
func TestMigrateSessionUnderLoad(t *testing.T) {
	for _, resolve := range []bool{false, true} {
		name := "redirect"
		if resolve {
			name = "resolve"
		}
		t.Run(name, func(t *testing.T) { testMigrateSession(t, resolve) })
	}
}

func testMigrateSession(t *testing.T, resolve bool) {
	n := netns.NewLinks(t, 1500, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := testSessionConfig()
	cfg.Connect.Tenant = "acme"

	// Node A: the tenant's table, the region the client writes and
	// reads, and a session listener on link 0.
	devA, devB := gowarp.Open(), gowarp.Open()
	tblA, err := devA.Table(gowarp.TenantIdentity("acme"))
	if err != nil {
		t.Fatal(err)
	}
	pdA := tblA.AllocPD()
	const count, size, sends = 24000, 512, 4000
	dst, err := pdA.Register(make([]byte, count*8), gowarp.RemoteWrite|gowarp.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	lnA, err := nsAdapter(t, devA, n.A, "a0", n.Links[0].AddrA).Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	slA := pdA.ListenSession(cfg, lnA)
	defer slA.Close()
	// Node B: the same tenant's (empty) table, a listener on link 1 from
	// the start (a client that comes before the import waits for its
	// answer), and one for the export stream.
	tblB, err := devB.Table(gowarp.TenantIdentity("acme"))
	if err != nil {
		t.Fatal(err)
	}
	lnB, err := nsAdapter(t, devB, n.A, "b1", n.Links[1].AddrA).Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	var streamLn net.Listener
	if err := netns.Do(n.A, func() (err error) {
		streamLn, err = net.Listen("tcp", net.JoinHostPort(n.Links[1].AddrA.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer streamLn.Close()

	// The client, in namespace B, a path to node A over link 0; link 1
	// (node B's) is placed on its adapter by the topology.
	cdev := gowarp.Open()
	c0 := nsAdapter(t, cdev, n.B, "c0", n.Links[0].AddrB)
	c1 := nsAdapter(t, cdev, n.B, "c1", n.Links[1].AddrB)
	if err := cdev.SetTopology(gowarp.Topology{{Adapter: c0.Name(), Remote: netipPrefix(n.Links[0].AddrA)},
		{Adapter: c1.Name(), Remote: netipPrefix(n.Links[1].AddrA)}}); err != nil {
		t.Fatal(err)
	}
	cpd := cdev.AllocPD()
	ccfg := cfg
	var redirect []string
	if resolve {
		ccfg.Resolve = func(context.Context, uint64) ([]string, error) { return []string{lnB.Addr().String()}, nil }
	} else {
		redirect = []string{lnB.Addr().String()}
	}
	cli, err := cpd.DialSession(ctx, []string{lnA.Addr().String()}, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	sA, err := slA.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sA.Close()

	// The streams: the client's as in the fail-over tests, paced over
	// about 4 s; the server's Sends paced over the same.
	up := &stream{s: cli, count: count, size: size, depth: 64, dst: dst, peerCount: 2 * sends, rate: count / 4}
	srv := &migServer{size: size, total: sends, rate: sends / 4, begin: time.Now(), regions: 1,
		pause: make(chan struct{}), paused: make(chan struct{})}
	upErr := make(chan error, 1)
	go func() { upErr <- up.run(cpd) }()
	srvA := make(chan error, 1)
	go func() { srvA <- srv.run(ctx, sA, pdA, count/2) }()
	waitFor(t, "the client's progress before the move", func() bool { return up.progress() >= count/4 })

	// Node B imports what node A exports, then listens for the sessions.
	type importResult struct {
		si  *gowarp.SessionImport
		sl  *gowarp.SessionListener
		s   *gowarp.Session
		at  time.Time
		err error
	}
	importDone := make(chan importResult, 1)
	go func() {
		var r importResult
		defer func() { importDone <- r }()
		conn, err := streamLn.Accept()
		if err != nil {
			r.err = err
			return
		}
		defer conn.Close()
		if r.si, r.err = tblB.ImportSessions(ctx, conn, gowarp.ImportOptions{}); r.err != nil {
			return
		}
		if r.sl, r.err = r.si.Listen(cfg, lnB); r.err != nil {
			return
		}
		r.at = time.Now()
		r.s, r.err = r.sl.Accept(ctx)
	}()
	var conn net.Conn
	if err := netns.Do(n.A, func() (err error) { conn, err = net.Dial("tcp", streamLn.Addr().String()); return err }); err != nil {
		t.Fatal(err)
	}
	// Node A's application stops posting, then exports (Export itself
	// refuses its posts from then on, but the bytes of a buffer it fills
	// are the application's to leave alone while the table is copied).
	moveAt := time.Now()
	close(srv.pause)
	select {
	case <-srv.paused:
	case err := <-srvA:
		t.Fatalf("node A's server stream ended before it paused: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("node A's server did not pause in 30 s")
	}
	est, err := slA.Export(ctx, conn, redirect)
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resolve {
		slA.Close() // node A goes away at once: no one there to ask
	}
	if err := <-srvA; !errors.Is(err, gowarp.ErrSessionMoved) {
		t.Fatalf("node A's server stream ended with %v, want ErrSessionMoved", err)
	}
	srv.recvsOnA, srv.pause = srv.recvd, nil
	im := <-importDone
	if im.err != nil {
		t.Fatal(im.err)
	}
	defer im.sl.Close()
	defer im.s.Close()
	if im.s.ID() != cli.ID() || !slices.Equal(im.si.Sessions(), []uint64{cli.ID()}) || est.Sessions != 1 {
		t.Fatalf("node B has sessions %x (accepted %x), the client %x; %d exported", im.si.Sessions(), im.s.ID(), cli.ID(), est.Sessions)
	}
	// Only the application's regions moved, none of the sessions' own
	// buffers: the region the client uses, and node A's server buffers.
	if got := len(im.si.MRs); got != srv.regions {
		t.Fatalf("%d regions imported, want the %d the application registered", got, srv.regions)
	}
	srvB := make(chan error, 1)
	go func() { srvB <- srv.run(ctx, im.s, im.si.SessionPD(), count/2) }()

	// The client is sent on to node B; then node A goes away.
	waitFor(t, "the client rejoined on node B", func() bool {
		st := cli.Stats()
		return st.Redirects+st.Resolved > 0 && st.Conns == 1 && im.s.Stats().Conns == 1
	})
	if st := cli.Stats(); resolve && (st.Resolved != 1 || st.Redirects != 0) || !resolve && (st.Redirects != 1 || st.Resolved != 0) {
		t.Fatalf("the client was redirected %d times and resolved %d, want once by the %s", st.Redirects, st.Resolved, map[bool]string{false: "redirect", true: "resolver"}[resolve])
	}
	if p := cli.Paths(); !slices.Equal(p, []string{lnB.Addr().String()}) {
		t.Fatalf("the client's paths are %q, want node B's %s", p, lnB.Addr())
	}
	slA.Close()
	setLink(t, n, 0, false)

	for range 2 {
		select {
		case err := <-upErr:
			if err != nil {
				t.Fatalf("%v; client %+v; node B %+v", err, cli.Stats(), im.s.Stats())
			}
			upErr = nil
		case err := <-srvB:
			if err != nil {
				t.Fatalf("%v; client %+v; node B %+v", err, cli.Stats(), im.s.Stats())
			}
			srvB = nil
		case <-time.After(time.Minute):
			t.Fatal("streams not done a minute after the move")
		}
	}
	if up.sends+up.wrs+up.reads != count || up.recvd != sends || srv.done != sends || srv.recvd != count/2 {
		t.Fatalf("completions: client %d Sends + %d Writes + %d Reads of %d, %d Sends received of %d; server %d Sends of %d, %d received of %d",
			up.sends, up.wrs, up.reads, count, up.recvd, sends, srv.done, sends, srv.recvd, count/2)
	}
	mrB := im.si.MR(dst.STag())
	if mrB == nil || mrB.Addr() != dst.Addr() {
		t.Fatalf("node B has no region under the client's STag %v", dst.STag())
	}
	for j := 1; j < count; j += 4 {
		if v := binary.LittleEndian.Uint64(mrB.Bytes()[j*8:]); v != uint64(j) {
			t.Fatalf("Write %d's word on node B is %d", j, v)
		}
	}
	// The pause the client saw: from its last completion before the
	// export began to its first after node B took the session in; and,
	// for comparison, the longest wait between two of its completions in
	// the whole run and where it began.
	up.mu.Lock()
	var pause, gap, gapAt time.Duration
	for i := 1; i < len(up.done); i++ {
		if d := up.done[i].Sub(up.done[i-1]); d > gap {
			gap, gapAt = d, up.done[i-1].Sub(moveAt)
		}
		if up.done[i-1].Before(moveAt) && !up.done[i].Before(moveAt) {
			for _, at := range up.done[i:] {
				if at.After(im.at) {
					pause = at.Sub(up.done[i-1])
					break
				}
			}
		}
	}
	up.mu.Unlock()
	cs, bs := cli.Stats(), im.s.Stats()
	t.Logf("client: %d Sends + %d Writes + %d Reads completed once each, in order, %d Sends received (%d resent, %d duplicates dropped); "+
		"server: %d Sends completed, %d received (%d on node A, %d on node B; node B dropped %d duplicates); "+
		"export: %d session, drain %v, stop %v, table %d regions %d bytes in %v; import done %v after the export began; "+
		"the client's pause %v (longest gap between its completions %v, beginning %v from the export's start)",
		up.sends, up.wrs, up.reads, up.recvd, cs.Resent, cs.Duplicates,
		srv.done, srv.recvd, srv.recvsOnA, srv.recvd-srv.recvsOnA, bs.Duplicates,
		est.Sessions, est.Drain, est.Stop, est.Table.Regions, est.Table.Bytes, est.Table.Copy, im.at.Sub(moveAt), pause, gap, gapAt)
}

// TestMigrateSessionBadStream: an export needs somewhere to send its
// peers; a session hand-off stream cut short or corrupt imports nothing;
// an intact one imports the table behind it.
func TestMigrateSessionBadStream(t *testing.T) {
	ctx := context.Background()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	mr, err := pd.Register([]byte("a region of the listener's"), gowarp.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	sl := pd.ListenSession(gowarp.SessionConfig{})
	defer sl.Close()
	var b bytes.Buffer
	for _, bad := range [][]string{{""}, {"has space:1"}} {
		if _, err := sl.Export(ctx, &b, bad); !errors.Is(err, gowarp.ErrBadConfig) || b.Len() != 0 || dev.DefaultTable().Frozen() {
			t.Errorf("Export redirecting to %q: %v, %d bytes written, frozen %v", bad, err, b.Len(), dev.DefaultTable().Frozen())
		}
	}
	st, err := sl.Export(ctx, &b, []string{"10.0.0.2:7000"})
	if err != nil || st.Sessions != 0 || st.Table.Regions != 1 {
		t.Fatalf("export: %+v, %v", st, err)
	}
	stream := b.Bytes()
	for i := range 40 { // the hand-off (24 bytes with no session) and the table's header
		other := gowarp.Open()
		cut := bytes.NewReader(stream[:i])
		flip := bytes.Clone(stream)
		flip[i] ^= 0x20
		for _, r := range []*bytes.Reader{cut, bytes.NewReader(flip)} {
			if _, err := other.DefaultTable().ImportSessions(ctx, r, gowarp.ImportOptions{}); !errors.Is(err, gowarp.ErrBadExport) || other.DefaultTable().Len() != 0 {
				t.Fatalf("stream cut or flipped at %d: %v, %d regions", i, err, other.DefaultTable().Len())
			}
		}
	}
	other := gowarp.Open()
	si, err := other.DefaultTable().ImportSessions(ctx, bytes.NewReader(stream), gowarp.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(si.Sessions()) != 0 || si.SessionPD() != si.PD(mr.STag()) || si.MR(mr.STag()) == nil {
		t.Fatalf("imported sessions %v, PD %v (the region's %v)", si.Sessions(), si.SessionPD(), si.PD(mr.STag()))
	}
	sl2, err := si.Listen(gowarp.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sl2.Close()
	if _, err := si.Listen(gowarp.SessionConfig{}); !errors.Is(err, gowarp.ErrBadConfig) {
		t.Errorf("a second Listen: %v, want ErrBadConfig", err)
	}
}
