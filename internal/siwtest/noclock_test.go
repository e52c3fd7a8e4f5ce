package siwtest

import "testing"

// TestPerftestNoClock: the warning perftest printed in a run whose send_bw
// server reported 0.00 MB/s (siw suite, 2026-12-01) is recognised, and
// an ordinary report is not.
func TestPerftestNoClock(t *testing.T) {
	if !perftestNoClock.MatchString("junk\nCorrelation coefficient r^2: 0.000620191 < 0.9\n") {
		t.Error("perftest's warning not recognised")
	}
	if perftestNoClock.MatchString(" 4096       2000             1.00               0.90   		   0.000230\n") {
		t.Error("a report taken for the warning")
	}
}
