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

// Pair is two namespaces, A and B, joined by a veth pair.
type Pair struct {
	A, B         string     // namespace names
	LinkA, LinkB string     // the veth ends, in A and in B
	AddrA, AddrB netip.Addr // their addresses on the link
	MTU          int
}

var seq atomic.Int32

// New creates the namespaces and the link with the given MTU, and removes
// them when the test ends.
func New(tb testing.TB, mtu int) *Pair {
	tb.Helper()
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
	va, vb := id+"x", id+"y"
	p.LinkA, p.LinkB = va, vb
	steps := [][]string{
		{"link", "add", va, "netns", p.A, "type", "veth", "peer", "name", vb, "netns", p.B},
		{"-n", p.A, "link", "set", va, "mtu", fmt.Sprint(mtu), "up"},
		{"-n", p.B, "link", "set", vb, "mtu", fmt.Sprint(mtu), "up"},
		{"-n", p.A, "link", "set", "lo", "up"},
		{"-n", p.B, "link", "set", "lo", "up"},
		{"-n", p.A, "addr", "add", p.AddrA.String() + "/24", "dev", va},
		{"-n", p.B, "addr", "add", p.AddrB.String() + "/24", "dev", vb},
	}
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
