//go:build linux

package gowarp_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/netns"
)

// Failure detection on links that die silently: no FIN, no reset, just
// nothing more from the peer. The tests set a link timeout of a couple of
// seconds and assert only that the failure comes, with the right error,
// within failBound: never how fast.

const (
	testLinkTimeout = 2 * time.Second
	// failBound is far beyond the link timeout, and far below the quarter
	// of an hour TCP retransmits for without one.
	failBound = 60 * time.Second
)

// cutLink makes the link between n's namespaces die silently, as a
// cable pulled between two switches: A's end is set down, so B's loses
// its carrier and what either sends is dropped without a word. B keeps
// A's MAC address as a permanent neighbour first: else, on this direct
// link, B's failed ARP would end its connects with "no route to host"
// within seconds, which a link beyond a router never says.
func cutLink(t testing.TB, n *netns.Pair) {
	t.Helper()
	ip := func(args ...string) string {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	f := strings.Fields(ip("-n", n.A, "-o", "link", "show", n.LinkA))
	i := slices.Index(f, "link/ether")
	if i < 0 || i+1 >= len(f) {
		t.Fatalf("no MAC address for %s in %q", n.LinkA, f)
	}
	ip("-n", n.B, "neigh", "replace", n.AddrA.String(), "lladdr", f[i+1], "dev", n.LinkB, "nud", "permanent")
	ip("-n", n.A, "link", "set", n.LinkA, "down")
}

// waitFatal waits for the device's EventQPFatal of each of qps and checks
// that it, and the queue pair's Err, match ErrLinkTimeout (and so
// ErrLinkLost).
func waitFatal(t testing.TB, dev *gowarp.Device, qps ...*gowarp.QP) {
	t.Helper()
	want := map[*gowarp.QP]bool{}
	for _, qp := range qps {
		want[qp] = true
	}
	start := time.Now()
	bound := time.After(failBound)
	for len(want) > 0 {
		select {
		case e := <-dev.Events():
			if !want[e.QP] {
				continue
			}
			if e.Type != gowarp.EventQPFatal {
				if e.Type == gowarp.EventPeerClosed {
					// Nothing can cross the dead link: say at once what
					// ended the queue pair, rather than wait out failBound.
					delete(want, e.QP)
					t.Errorf("queue pair ended with %v (%v) %v after the cut, want EventQPFatal with ErrLinkTimeout", e.Type, e.Err, time.Since(start).Round(time.Millisecond))
				}
				continue
			}
			delete(want, e.QP)
			t.Logf("failed %v after the wait began: %v", time.Since(start).Round(time.Millisecond), e.Err)
			if !errors.Is(e.Err, gowarp.ErrLinkTimeout) || !errors.Is(e.Err, gowarp.ErrLinkLost) {
				t.Errorf("fatal event's error %v, want one matching ErrLinkTimeout and ErrLinkLost", e.Err)
			}
			if err := e.QP.Err(); !errors.Is(err, gowarp.ErrLinkTimeout) {
				t.Errorf("Err %v, want ErrLinkTimeout", err)
			}
			if s := e.QP.State(); s != gowarp.StateError {
				t.Errorf("state %v after the fatal event, want %v", s, gowarp.StateError)
			}
		case <-bound:
			for qp := range want {
				t.Fatalf("queue pair still %v (Err %v) %v after its link died; link timeout %v", qp.State(), qp.Err(), failBound, testLinkTimeout)
			}
		}
	}
}

// completions waits for n completions on cq, for at most failBound.
func completions(t testing.TB, cq *gowarp.CQ, n int) []gowarp.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), failBound)
	defer cancel()
	got := make([]gowarp.Completion, 0, n)
	var wc [64]gowarp.Completion
	for len(got) < n {
		k := cq.Poll(wc[:min(n-len(got), len(wc))])
		got = append(got, wc[:k]...)
		if k > 0 {
			continue
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("%d of %d completions, then: %v", len(got), n, err)
		}
	}
	return got
}

// TestLinkTimeoutWritesOutstanding: a queue pair streaming Writes whose
// link dies silently (the far end's veth set down) fails with
// ErrLinkTimeout once its bytes go unacknowledged for the link timeout;
// every Write completes, those the socket had not taken flushed, and the
// peer, idle behind the dead link, fails by keepalive.
func TestLinkTimeoutWritesOutstanding(t *testing.T) {
	p, n := vethPair(t, gowarp.ConnectOptions{LinkTimeout: testLinkTimeout})
	const size, count = 1 << 20, 64 // 64 MiB: far more than the socket buffers hold
	src, _ := p.reg(t, size, gowarp.LocalWrite)
	dst, _ := p.reg(t, size, gowarp.RemoteWrite)
	post := func(id int) error {
		return p.a.PostSend(&gowarp.SendWR{ID: uint64(id), Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: dst.Addr(), RKey: dst.STag()})
	}
	for id := range 8 {
		if err := post(id); err != nil {
			t.Fatal(err)
		}
	}
	if c := wait(t, p.acq); c.Err() != nil { // the link works
		t.Fatalf("first Write: %v", c.Err())
	}
	cutLink(t, n) // p.b's end is down, p.a's has no carrier
	posted := 8
	for ; posted < count; posted++ {
		if err := post(posted); err != nil {
			if !errors.Is(err, gowarp.ErrNotReady) {
				t.Fatal(err)
			}
			break // failed already
		}
	}
	waitFatal(t, p.dev, p.a, p.b)
	flushed := 0
	for _, c := range completions(t, p.acq, posted-1) {
		switch err := c.Err(); {
		case err == nil:
			if flushed > 0 {
				t.Errorf("Write %d succeeded after a flushed one", c.ID)
			}
		case errors.Is(err, gowarp.WRFlushError):
			flushed++
		default:
			t.Errorf("Write %d: %v, want success or WRFlushError", c.ID, err)
		}
	}
	if flushed == 0 {
		t.Errorf("no Write of %d flushed: all %d MiB left before the link died?", posted, posted*size>>20)
	}
	t.Logf("%d Writes of 1 MiB posted, %d flushed", posted, flushed)
}

// TestLinkTimeoutIdle: two idle queue pairs, receives posted, whose link
// dies silently both fail with ErrLinkTimeout by keepalive, and their
// receives are flushed.
func TestLinkTimeoutIdle(t *testing.T) {
	p, n := vethPair(t, gowarp.ConnectOptions{LinkTimeout: testLinkTimeout})
	mr, _ := p.reg(t, 4096, gowarp.LocalWrite)
	for _, qp := range []*gowarp.QP{p.a, p.b} {
		if err := qp.PostRecv(&gowarp.RecvWR{ID: 9, SGL: []gowarp.SGE{{MR: mr, Length: 4096}}}); err != nil {
			t.Fatal(err)
		}
	}
	cutLink(t, n)
	waitFatal(t, p.dev, p.a, p.b)
	for _, cq := range []*gowarp.CQ{p.acq, p.bcq} {
		if c := completions(t, cq, 1)[0]; c.ID != 9 || !errors.Is(c.Err(), gowarp.WRFlushError) {
			t.Errorf("receive %d: %v, want 9 flushed", c.ID, c.Err())
		}
	}
}

// TestLinkTimeoutConnect: a Connect whose SYNs go unanswered (the
// listener's link is down) fails with ErrLinkTimeout after the link
// timeout, though its context has no deadline.
func TestLinkTimeoutConnect(t *testing.T) {
	n := netns.New(t, 1500)
	p := newIdlePair(t, 16)
	defer p.a.Close()
	var ln *gowarp.Listener
	if err := netns.Do(n.A, func() (err error) {
		ln, err = p.dev.Listen(netip.AddrPortFrom(n.AddrA, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cutLink(t, n)
	errc := make(chan error, 1)
	go func() {
		errc <- netns.Do(n.B, func() error {
			return p.a.Connect(context.Background(), ln.Addr().String(), gowarp.ConnectOptions{LinkTimeout: testLinkTimeout})
		})
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, gowarp.ErrLinkTimeout) {
			t.Errorf("Connect over a dead link: %v, want ErrLinkTimeout", err)
		}
	case <-time.After(failBound):
		p.a.Close()
		t.Fatalf("Connect over a dead link still waiting after %v", failBound)
	}
}

// TestLinkTimeoutMPA: a connection whose link dies before the MPA reply
// comes fails ConnectConn with ErrLinkTimeout after the link timeout
// (the request goes unacknowledged), well before its context's deadline.
func TestLinkTimeoutMPA(t *testing.T) {
	n := netns.New(t, 1500)
	var ln net.Listener
	if err := netns.Do(n.A, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(n.AddrA, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var c net.Conn
	if err := netns.Do(n.B, func() (err error) {
		c, err = net.Dial("tcp", ln.Addr().String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept() // a responder that will never answer
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cutLink(t, n)
	p := newIdlePair(t, 16)
	defer p.a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.a.ConnectConn(ctx, c, gowarp.ConnectOptions{LinkTimeout: testLinkTimeout}) }()
	select {
	case err := <-errc:
		if !errors.Is(err, gowarp.ErrLinkTimeout) {
			t.Errorf("ConnectConn over a dead link: %v, want ErrLinkTimeout", err)
		}
	case <-time.After(failBound):
		p.a.Close()
		t.Fatalf("ConnectConn over a dead link still waiting after %v", failBound)
	}
}

// TestLinkTimeoutWindowClosed: a peer whose kernel still answers but whose
// application reads nothing (a stopped process: SIGSTOP, a debugger)
// closes its receive window; a queue pair with Writes waiting behind it
// fails with ErrLinkTimeout once the window has stayed shut for the link
// timeout (Linux 5.11 on: before, answered zero-window probes kept it
// open for good), and its Writes are flushed.
func TestLinkTimeoutWindowClosed(t *testing.T) {
	if !kernelAtLeast(5, 11) {
		t.Skip("TCP_USER_TIMEOUT bounds a closed window only from Linux 5.11 on")
	}
	addr, conns := rawResponder(t, net.ListenConfig{}, 16, 16)
	p := newIdlePair(t, 256)
	defer p.a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.a.Connect(ctx, addr, gowarp.ConnectOptions{LinkTimeout: testLinkTimeout}); err != nil {
		t.Fatal(err)
	}
	defer (<-conns).Close() // read nothing from it
	const size, count = 1 << 20, 64
	src, _ := p.reg(t, size, gowarp.LocalWrite)
	for id := range count {
		if err := p.a.PostSend(&gowarp.SendWR{ID: uint64(id), Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: 1 << 20, RKey: 0x100}); err != nil {
			t.Fatal(err)
		}
	}
	waitFatal(t, p.dev, p.a)
	flushed := 0
	for _, c := range completions(t, p.acq, count) {
		if errors.Is(c.Err(), gowarp.WRFlushError) {
			flushed++
		}
	}
	if flushed == 0 {
		t.Errorf("no Write of %d flushed", count)
	}
}

// kernelAtLeast reports whether the running Linux is version major.minor
// or later.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var ma, mi int
	rel := unix.ByteSliceToString(u.Release[:])
	for i, part := 0, 0; i < len(rel) && part < 2; i++ {
		switch c := rel[i]; {
		case c >= '0' && c <= '9':
			if part == 0 {
				ma = ma*10 + int(c-'0')
			} else {
				mi = mi*10 + int(c-'0')
			}
		case c == '.':
			part++
		default:
			part = 2
		}
	}
	return ma > major || ma == major && mi >= minor
}
