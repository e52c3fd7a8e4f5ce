package siwtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/guest"
)

// guestAlive reports whether the guest's network still reaches the host:
// on the user network a TCP connect to the guest-forward address, which
// QEMU answers itself (the forward's helper may find no host server; the
// connect has succeeded by then); on a tap network a ping, which the
// host's kernel answers. It runs as a job, which needs no network.
func (s *suite) guestAlive() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	check := fmt.Sprintf("timeout 10 bash -c 'exec 3<>/dev/tcp/%s/%d'", hostFromGuest, s.v.serve)
	if s.v.Net == guest.NetTap {
		check = fmt.Sprintf("ping -c 1 -W 5 %s", hostFromGuest)
	}
	rc, _, err := s.v.run(ctx, check, 30*time.Second)
	return err == nil && rc == 0
}

// restartGuest powers the guest off and boots it again, for a scenario to
// run once more on a guest whose network had stopped: under TCG the
// guest's network has stopped for good in the middle of a run now and
// then (the guest's ARP entry for the host address left INCOMPLETE, no
// new connection either way, siw and the kernel logging nothing), and
// every scenario after it failed. The old run directory is kept.
func (s *suite) restartGuest(t *testing.T) {
	// What the guest's network looked like: the NIC's counters 3 s
	// apart (transmit frozen, when it was seen), its neighbours, its
	// sockets.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, state, _ := s.v.run(ctx, "grep eth0 /proc/net/dev; sleep 3; grep eth0 /proc/net/dev; ip neigh; ss -tn", 30*time.Second)
	t.Logf("the guest's network stopped (no connection from the guest to the host after a failed run); its run directory is kept: %s. Booting the guest again. Its network:\n%s", s.v.dir, state)
	s.v.stop()
	s.restarts++
	s.v = startVM(s.top, s.im)
}
