//go:build linux

// Package netns builds test networks: two Linux network namespaces joined
// by a veth pair with private addresses, so tests can run gowarp across a
// real (virtual) Ethernet link with a real MTU, on one machine and with
// nothing leaving it. It needs root and iproute2; where either is missing
// New skips the test with a message saying so.
package netns

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// Pair is two namespaces, A and B, joined by a veth pair (New) or by
// several (NewLinks). LinkA, LinkB, AddrA and AddrB are the first link's.
type Pair struct {
	A, B         string     // namespace names
	LinkA, LinkB string     // the veth ends, in A and in B
	AddrA, AddrB netip.Addr // their addresses on the link
	MTU          int
	// Links are all the veth pairs joining A and B, each on a /24 of
	// its own, so each pair of addresses is reached over its link only.
	Links []Link
}

// Link is one veth pair between a Pair's namespaces.
type Link struct {
	LinkA, LinkB string     // the veth ends, in A and in B
	AddrA, AddrB netip.Addr // their addresses, on a /24 of the link's own
}

var seq atomic.Int32

// New creates the namespaces and the link with the given MTU, and removes
// them when the test ends.
func New(tb testing.TB, mtu int) *Pair {
	tb.Helper()
	return NewLinks(tb, mtu, 1)
}

// MaxLinks is the most links NewLinks makes between two namespaces.
const MaxLinks = 8

// NewLinks creates the namespaces joined by links veth pairs (1 to
// MaxLinks) with the given MTU: link k has addresses 10.213+k.n.1 in A
// and 10.213+k.n.2 in B, n numbering the test's pairs. Cutting one
// (ip link set … down) leaves the others up, as separate cables would.
func NewLinks(tb testing.TB, mtu, links int) *Pair {
	tb.Helper()
	if links < 1 || links > MaxLinks {
		tb.Fatalf("netns: %d links, want 1 to %d", links, MaxLinks)
	}
	if os.Geteuid() != 0 {
		tb.Skip("netns: needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("netns: needs iproute2's ip command")
	}
	n := seq.Add(1)
	id := fmt.Sprintf("gw%d-%d", os.Getpid()%100000, n)
	p := &Pair{A: id + "a", B: id + "b", MTU: mtu,
		AddrA: netip.AddrFrom4([4]byte{10, 213, byte(n), 1}), AddrB: netip.AddrFrom4([4]byte{10, 213, byte(n), 2})}
	run := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("netns", "add", p.A); err != nil {
		tb.Skipf("netns: cannot create a network namespace here: %v", err)
	}
	tb.Cleanup(func() { run("netns", "del", p.A) })
	if err := run("netns", "add", p.B); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { run("netns", "del", p.B) })
	steps := [][]string{
		{"-n", p.A, "link", "set", "lo", "up"},
		{"-n", p.B, "link", "set", "lo", "up"},
	}
	for k := range links {
		// The first link keeps the names and addresses New always gave.
		l := Link{LinkA: id + "x", LinkB: id + "y", AddrA: p.AddrA, AddrB: p.AddrB}
		if k > 0 {
			l = Link{LinkA: fmt.Sprintf("%sx%d", id, k), LinkB: fmt.Sprintf("%sy%d", id, k),
				AddrA: netip.AddrFrom4([4]byte{10, byte(213 + k), byte(n), 1}),
				AddrB: netip.AddrFrom4([4]byte{10, byte(213 + k), byte(n), 2})}
		}
		p.Links = append(p.Links, l)
		steps = append(steps,
			[]string{"link", "add", l.LinkA, "netns", p.A, "type", "veth", "peer", "name", l.LinkB, "netns", p.B},
			[]string{"-n", p.A, "link", "set", l.LinkA, "mtu", fmt.Sprint(mtu), "up"},
			[]string{"-n", p.B, "link", "set", l.LinkB, "mtu", fmt.Sprint(mtu), "up"},
			[]string{"-n", p.A, "addr", "add", l.AddrA.String() + "/24", "dev", l.LinkA},
			[]string{"-n", p.B, "addr", "add", l.AddrB.String() + "/24", "dev", l.LinkB},
		)
	}
	p.LinkA, p.LinkB = p.Links[0].LinkA, p.Links[0].LinkB
	for _, s := range steps {
		if err := run(s...); err != nil {
			tb.Fatal(err)
		}
	}
	return p
}

// Do runs f on an OS thread that has entered namespace ns. Sockets f
// creates belong to ns and stay there after Do returns; they may then be
// used from any goroutine.
func Do(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is not unlocked if it cannot be put back: it then
		// dies with this goroutine instead of serving others in ns.
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("netns: setns %s: %w", ns, err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}
