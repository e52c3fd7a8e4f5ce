//go:build linux

package gowarp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/netns"
)

// Session fail-over across two namespaces joined by several links: the
// client's session dials one connection over each link (through the
// adapter the topology places it on), the server's accepts them; the
// tests cut links (ip link set … down) in the middle of streams of Sends
// and Writes both ways and count every completion on both sides.

// sessNet is a session between two namespaces over n.Links.
type sessNet struct {
	n        *netns.Pair
	cli, srv *gowarp.Session
	cpd, spd *gowarp.PD
	sl       *gowarp.SessionListener
}

func newSessNet(t testing.TB, links int, cfg gowarp.SessionConfig) *sessNet {
	t.Helper()
	n := netns.NewLinks(t, 1500, links)
	sdev, cdev := gowarp.Open(), gowarp.Open()
	sn := &sessNet{n: n, spd: sdev.AllocPD(), cpd: cdev.AllocPD()}
	var lns []*gowarp.Listener
	var paths []string
	var top gowarp.Topology
	for k, l := range n.Links {
		sa := nsAdapter(t, sdev, n.A, fmt.Sprint("s", k), l.AddrA)
		ca := nsAdapter(t, cdev, n.B, fmt.Sprint("c", k), l.AddrB)
		ln, err := sa.Listen(0)
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		paths = append(paths, ln.Addr().String())
		top = append(top, gowarp.DirectLink{Adapter: ca.Name(), Remote: netipPrefix(l.AddrA)})
	}
	if err := cdev.SetTopology(top); err != nil {
		t.Fatal(err)
	}
	sn.sl = sn.spd.ListenSession(cfg, lns...)
	t.Cleanup(func() { sn.sl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var err error
	if sn.cli, err = sn.cpd.DialSession(ctx, paths, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sn.cli.Close() })
	if sn.srv, err = sn.sl.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sn.srv.Close() })
	if sn.srv.ID() != sn.cli.ID() {
		t.Fatalf("session ids %x and %x", sn.cli.ID(), sn.srv.ID())
	}
	// Every path up on both sides before the streams start.
	waitFor(t, "every path up", func() bool {
		return sn.cli.Stats().Conns == links && sn.srv.Stats().Conns == links
	})
	for k, qp := range sn.cli.Conns() {
		if qp == nil || qp.Adapter() == nil || qp.Adapter().Name() != fmt.Sprint("c", k) {
			t.Fatalf("path %d's connection on adapter %v, want c%d", k, qp.Adapter(), k)
		}
	}
	return sn
}

// setLink sets link k of n down (as cutLink does for the first) or up.
func setLink(t testing.TB, n *netns.Pair, k int, up bool) {
	t.Helper()
	l := n.Links[k]
	if !up {
		f := strings.Fields(ipCmd(t, "-n", n.A, "-o", "link", "show", l.LinkA))
		i := slices.Index(f, "link/ether")
		if i < 0 || i+1 >= len(f) {
			t.Fatalf("no MAC address for %s in %q", l.LinkA, f)
		}
		ipCmd(t, "-n", n.B, "neigh", "replace", l.AddrA.String(), "lladdr", f[i+1], "dev", l.LinkB, "nud", "permanent")
		ipCmd(t, "-n", n.A, "link", "set", l.LinkA, "down")
		return
	}
	ipCmd(t, "-n", n.A, "link", "set", l.LinkA, "up")
}

// stream is one side's traffic on a session: it posts count work
// requests, as many as depth outstanding: even ones Sends of size bytes
// whose first 8 carry their index; of the odd ones i, Writes of i into the
// 8 bytes at i*8 of dst (i%4 == 1) and Reads of the word the Write before
// them wrote (i%4 == 3), which must find it there. It checks that each completes once,
// successfully, in order, and records when. It also receives the peer's
// stream of peerCount: each Send once, in order, with its bytes.
type stream struct {
	s           *gowarp.Session
	count, size int
	depth       int
	dst         *gowarp.MR
	peerCount   int
	rate        int // posts per second at most; 0: as fast as it goes
	mu          sync.Mutex
	done        []time.Time // by completion order
	sends, wrs  int
	reads       int
	recvd       int
}

func (st *stream) progress() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.done)
}

func (st *stream) run(pd *gowarp.PD) error {
	src, err := pd.Register(make([]byte, st.depth*st.size), gowarp.LocalWrite)
	if err != nil {
		return err
	}
	words, err := pd.Register(make([]byte, st.count*8), gowarp.LocalWrite)
	if err != nil {
		return err
	}
	back, err := pd.Register(make([]byte, st.count*8), gowarp.LocalWrite)
	if err != nil {
		return err
	}
	const rdepth = 64
	rbuf, err := pd.Register(make([]byte, rdepth*st.size), gowarp.LocalWrite)
	if err != nil {
		return err
	}
	for i := range rdepth {
		if err := st.s.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: rbuf, Offset: i * st.size, Length: st.size}}}); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wc [32]gowarp.SessionCompletion
	next := 0     // the index the next send-side completion must have
	wantRecv := 0 // the index the next Send received must carry
	begin := time.Now()
	for posted := 0; next < st.count || wantRecv < st.peerCount; {
		allowed := st.count
		if st.rate > 0 {
			allowed = min(st.count, 1+int(time.Since(begin).Seconds()*float64(st.rate)))
		}
		for posted < allowed && posted-next < st.depth {
			wr := gowarp.SendWR{ID: uint64(posted), Flags: gowarp.Signaled}
			if posted%2 == 0 {
				off := posted % st.depth * st.size
				binary.LittleEndian.PutUint64(src.Bytes()[off:], uint64(posted))
				wr.Op, wr.SGL = gowarp.OpSend, []gowarp.SGE{{MR: src, Offset: off, Length: st.size}}
			} else if posted%4 == 1 {
				binary.LittleEndian.PutUint64(words.Bytes()[posted*8:], uint64(posted))
				wr.Op, wr.SGL = gowarp.OpWrite, []gowarp.SGE{{MR: words, Offset: posted * 8, Length: 8}}
				wr.RemoteAddr, wr.RKey = st.dst.Addr()+uint64(posted*8), st.dst.STag()
			} else {
				wr.Op, wr.SGL = gowarp.OpRead, []gowarp.SGE{{MR: back, Offset: posted * 8, Length: 8}}
				wr.RemoteAddr, wr.RKey = st.dst.Addr()+uint64((posted-2)*8), st.dst.STag()
			}
			if err := st.s.PostSend(&wr); err != nil {
				return fmt.Errorf("post %d: %w", posted, err)
			}
			posted++
		}
		wctx, wcancel := ctx, context.CancelFunc(func() {})
		if posted < st.count && posted-next < st.depth {
			// Paced: look again soon even if nothing completes.
			wctx, wcancel = context.WithTimeout(ctx, time.Millisecond)
		}
		err := st.s.Wait(wctx)
		wcancel()
		if err != nil && (wctx == ctx || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded)) {
			return fmt.Errorf("%d of %d complete, %d received, then: %w", next, st.count, st.recvd, err)
		}
		n := st.s.Poll(wc[:])
		now := time.Now()
		for _, c := range wc[:n] {
			if c.Err != nil {
				return fmt.Errorf("work request %d (%v): %w", c.ID, c.Op, c.Err)
			}
			if c.Op == gowarp.CompRecv {
				off := int(c.ID) * st.size
				if v := binary.LittleEndian.Uint64(rbuf.Bytes()[off:]); c.Bytes != st.size || v != uint64(wantRecv) {
					return fmt.Errorf("received Send %d of %d bytes, want %d (lost, repeated or out of order)", v, c.Bytes, wantRecv)
				}
				wantRecv += 2
				st.recvd++
				if err := st.s.PostRecv(&gowarp.RecvWR{ID: c.ID, SGL: []gowarp.SGE{{MR: rbuf, Offset: off, Length: st.size}}}); err != nil {
					return err
				}
				continue
			}
			if c.ID != uint64(next) {
				return fmt.Errorf("completion of %d, want %d (lost, repeated or out of order)", c.ID, next)
			}
			want := gowarp.CompSend
			switch next % 4 {
			case 1:
				want = gowarp.CompWrite
				st.wrs++
			case 3:
				want = gowarp.CompRead
				st.reads++
				if v := binary.LittleEndian.Uint64(back.Bytes()[next*8:]); v != uint64(next-2) {
					return fmt.Errorf("Read %d found %d, want the word Write %d wrote", next, v, next-2)
				}
			default:
				st.sends++
			}
			if c.Op != want {
				return fmt.Errorf("completion %d is a %v, want %v", c.ID, c.Op, want)
			}
			next++
			st.mu.Lock()
			st.done = append(st.done, now)
			st.mu.Unlock()
		}
	}
	return nil
}

// TestFailoverSendsWrites: streams of Sends and Writes both ways over a
// session of two links, the link the client sends on cut four times (the
// other one brought back up before each cut): every work request
// completes once, in order, on the side that posted it; every Send is
// received once, in order, with its bytes; every Write's word is in place.
// Its figures: completions counted, and the time from each cut to the
// first completion on the other link.
func TestFailoverSendsWrites(t *testing.T) {
	for _, tc := range []struct {
		name string
		cuts int
		loss int // percent of the packets each end of each link drops
	}{
		{"cuts", 4, 0},
		{"loss", 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testFailover(t, tc.cuts, tc.loss)
		})
	}
}

func testFailover(t *testing.T, cuts, loss int) {
	sn := newSessNet(t, 2, testSessionConfig())
	// Random loss on both ends of every link, from an nftables rule in
	// each namespace (the kernel here has no sch_netem).
	var losses []*netns.Loss
	if loss > 0 {
		for _, l := range sn.n.Links {
			losses = append(losses, netns.AddLoss(t, sn.n.A, l.LinkA, loss), netns.AddLoss(t, sn.n.B, l.LinkB, loss))
		}
	}
	// Paced to last about 10 s: time for the cuts, and the links' rejoins.
	const count, size = 40000, 512
	dstS, _ := sn.spd.Register(make([]byte, count*8), gowarp.RemoteWrite|gowarp.RemoteRead)
	dstC, _ := sn.cpd.Register(make([]byte, count/4*8), gowarp.RemoteWrite|gowarp.RemoteRead)
	up := &stream{s: sn.cli, count: count, size: size, depth: 64, dst: dstS, peerCount: count / 4, rate: count / 10}
	down := &stream{s: sn.srv, count: count / 4, size: size, depth: 32, dst: dstC, peerCount: count, rate: count / 40}
	errc := make(chan error, 2)
	go func() { errc <- up.run(sn.cpd) }()
	go func() { errc <- down.run(sn.spd) }()
	progress := up.progress
	var cutAt []time.Time
	var lastFail []time.Time
	failed := make(chan error, 1)
	go func() {
		// The streams fail the test on their own; the cuts stop once
		// they end.
		for range 2 {
			if err := <-errc; err != nil {
				failed <- err
				return
			}
		}
		failed <- nil
	}()
	stopped := false
	for i := 0; i < cuts && !stopped; i++ {
		target := progress() + 200
		waitFor(t, "progress before a cut", func() bool { return progress() >= target || progress() == count })
		if progress() == count {
			t.Fatalf("the streams ended after %d of %d cuts: make them longer", i, cuts)
		}
		st := sn.cli.Stats()
		k := st.TxPath
		if k < 0 {
			t.Fatalf("cut %d: the client sends on no path (%+v)", i, st)
		}
		setLink(t, sn.n, k, false)
		cut := time.Now()
		// A fail-over after the cut; or, if the session had moved off the
		// link just before (a heartbeat late under load), the cut
		// connection's end.
		waitFor(t, "fail-over", func() bool {
			st := sn.cli.Stats()
			return st.LastFailover.After(cut) || st.TxPath != k && st.TxPath >= 0 && st.Conns < 2
		})
		if f := sn.cli.Stats().LastFailover; f.After(cut) {
			cutAt, lastFail = append(cutAt, cut), append(lastFail, f)
		}
		setLink(t, sn.n, k, true)
		waitFor(t, "the cut path back", func() bool { return sn.cli.Stats().Conns == 2 && sn.srv.Stats().Conns == 2 })
		select {
		case err := <-failed:
			stopped = true
			if err != nil {
				t.Fatal(err)
			}
		default:
		}
	}
	if !stopped {
		select {
		case err := <-failed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("streams not done 2 minutes after the last cut")
		}
	}
	if up.sends+up.wrs+up.reads != count || down.sends+down.wrs+down.reads != count/4 || down.recvd != count/2 || up.recvd != count/8 {
		t.Fatalf("completions: client %d Sends + %d Writes + %d Reads of %d, server %d + %d + %d of %d; received %d and %d",
			up.sends, up.wrs, up.reads, count, down.sends, down.wrs, down.reads, count/4, down.recvd, up.recvd)
	}
	for i, w := range []struct {
		mr *gowarp.MR
		n  int
	}{{dstS, count}, {dstC, count / 4}} {
		for j := 1; j < w.n; j += 4 {
			if v := binary.LittleEndian.Uint64(w.mr.Bytes()[j*8:]); v != uint64(j) {
				t.Fatalf("side %d: Write %d's word is %d", i, j, v)
			}
		}
	}
	lossNote := ""
	if loss > 0 {
		// The loss must really have happened, or the case proves nothing.
		var sent, dropped uint64
		for _, l := range losses {
			s, d, err := l.Counts()
			if err != nil {
				t.Fatal(err)
			}
			sent, dropped = sent+s, dropped+d
		}
		if sent < 1000 || dropped == 0 {
			t.Fatalf("the loss rules saw %d packets and dropped %d: no loss to speak of", sent, dropped)
		}
		lossNote = fmt.Sprintf("; loss rules dropped %d of %d packets (%.2f%%)", dropped, sent, 100*float64(dropped)/float64(sent))
	}
	cs, ss := sn.cli.Stats(), sn.srv.Stats()
	if cs.Failovers < uint64(len(cutAt)) || len(cutAt) == 0 {
		t.Errorf("%d cuts of the client's sending link failed it over, %d fail-overs", len(cutAt), cs.Failovers)
	}
	// The figure: from each cut to the first completion after the
	// fail-over, which the other link carried.
	var gaps []time.Duration
	up.mu.Lock()
	for i, at := range cutAt {
		j := sort.Search(len(up.done), func(j int) bool { return !up.done[j].Before(lastFail[i]) })
		if j < len(up.done) {
			gaps = append(gaps, up.done[j].Sub(at))
		}
	}
	up.mu.Unlock()
	slices.Sort(gaps)
	med := time.Duration(0)
	if len(gaps) > 0 {
		med = gaps[len(gaps)/2]
	}
	t.Logf("%d cuts (%d of the sending link); client: %d Sends + %d Writes + %d Reads completed once each, in order, %d Sends received, %d fail-overs, %d resent, %d duplicates dropped; "+
		"server: %d Sends received, %d + %d + %d completed, %d fail-overs, %d resent, %d duplicates dropped; "+
		"Writes placed again: %d bytes at the server; cut to first completion on the new link: %v (median %v)%s",
		cuts, len(cutAt), up.sends, up.wrs, up.reads, up.recvd, cs.Failovers, cs.Resent, cs.Duplicates,
		down.recvd, down.sends, down.wrs, down.reads, ss.Failovers, ss.Resent, ss.Duplicates,
		dstS.Placed()-uint64(count/4*8), gaps, med, lossNote)
}

// TestFailoverDeadline: a session whose every link is cut ends its
// outstanding work, within its deadline, with ErrSessionTimeout, and its
// Wait says so; nothing hangs.
func TestFailoverDeadline(t *testing.T) {
	cfg := testSessionConfig()
	cfg.Deadline = 2 * time.Second
	sn := newSessNet(t, 2, cfg)
	src, _ := sn.cpd.Register(make([]byte, 64), gowarp.LocalWrite)
	for k := range sn.n.Links {
		setLink(t, sn.n, k, false)
	}
	for i := range 8 {
		if err := sn.cli.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpSend, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Length: 64}}}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wc [16]gowarp.SessionCompletion
	for got := 0; got < 8; {
		if err := sn.cli.Wait(ctx); err != nil {
			t.Fatalf("%d of 8 ended, then Wait: %v", got, err)
		}
		for _, c := range wc[:sn.cli.Poll(wc[:])] {
			if c.ID != uint64(got) || !errors.Is(c.Err, gowarp.ErrSessionTimeout) {
				t.Errorf("completion %d: %v, want %d with ErrSessionTimeout", c.ID, c.Err, got)
			}
			got++
		}
	}
	if err := sn.cli.Wait(ctx); !errors.Is(err, gowarp.ErrSessionTimeout) {
		t.Errorf("Wait after the deadline: %v, want ErrSessionTimeout", err)
	}
	if err := sn.cli.PostSend(&gowarp.SendWR{Op: gowarp.OpSend}); !errors.Is(err, gowarp.ErrSessionTimeout) {
		t.Errorf("PostSend after the deadline: %v, want ErrSessionTimeout", err)
	}
}

func netipPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }
