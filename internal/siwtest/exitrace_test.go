package siwtest

import "testing"

// TestRpingExitRace: the suite passes rping's shutdown race (seen on
// 2026-12-07) and nothing else.
func TestRpingExitRace(t *testing.T) {
	race := "server ping data: rdma-ping-4: ...\n\n-- stderr --\nserver DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\nrdma_get_cm_event: Bad file descriptor\n"
	for _, c := range []struct {
		rc   int
		out  string
		want bool
	}{
		{255, race, true},
		{1, race, false},
		{0, race, false},
		{255, "rdma_get_cm_event: Bad file descriptor\n", false}, // no disconnect: not after a run
		{255, "server DISCONNECT EVENT...\ncq completion failed status 5\n", false},
	} {
		if got := rpingExitRace(c.rc, c.out); got != c.want {
			t.Errorf("rpingExitRace(%d, %q) = %v, want %v", c.rc, c.out, got, c.want)
		}
	}
}
