package siwtest

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/guest"
)

// guestAlive reports whether the guest's network still carries a
// connection to the host, from a job (jobs need no network): a TCP
// connect to the guest-forward address on the user network, which QEMU
// answers itself (the forward's helper may find no host server; the
// connect has succeeded by then), and to a listener of this process on a
// tap network.
func (s *suite) guestAlive() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	port := s.v.serve
	if s.v.Net == guest.NetTap {
		ln, err := net.Listen("tcp", net.JoinHostPort(s.v.listenIP, "0"))
		if err != nil {
			s.top.Logf("guestAlive: %v", err)
			return false
		}
		defer ln.Close()
		port = ln.Addr().(*net.TCPAddr).Port
	}
	check := guestConnect(port, 10)
	rc, out, err := s.v.run(ctx, check, 30*time.Second)
	if err != nil || rc != 0 {
		s.top.Logf("the guest cannot reach the host: %s: rc %d, %v: %s", check, rc, err, strings.TrimSpace(out))
		return false
	}
	return true
}

// restartGuest powers the guest off and boots it again, for a scenario to
// run once more on a guest whose network had stopped: under TCG the
// guest's network has stopped for good in the middle of a run now and
// then (the guest's ARP entry for the host address left INCOMPLETE, no
// new connection either way, siw and the kernel logging nothing), and
// every scenario after it failed. The old run directory is kept.
func (s *suite) restartGuest(t *testing.T) {
	// What the guest's network looked like: the NIC's counters before
	// and after 3 s of trying to connect to the host (transmit frozen,
	// when it was seen), its neighbours, its sockets.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, state, _ := s.v.run(ctx, "grep eth0 /proc/net/dev; "+guestConnect(s.v.serve, 3)+"; grep eth0 /proc/net/dev; ip neigh; ss -tn", 30*time.Second)
	t.Logf("the guest's network stopped (no connection from the guest to the host after a failed run); its run directory is kept: %s. Booting the guest again. Its network:\n%s", s.v.dir, state)
	s.v.stop()
	s.restarts++
	s.v = startVM(s.top, s.im)
}
