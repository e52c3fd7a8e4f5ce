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

// TestPerftestLatNoClock: the result line of a send_lat server whose clock
// estimate failed (siw suite, 2026-12-02: "Correlation coefficient r^2:
// 0.809061 < 0.9") still gives its size and count, and a real report is
// not taken for it.
func TestPerftestLatNoClock(t *testing.T) {
	m := latLineNoClock.FindStringSubmatch(" #bytes #iterations    t_min[usec]\n 2       50          inf            inf          inf      \t       inf         \t-nan   \t\tinf     \t\tinf    \n")
	if m == nil || m[1] != "2" || m[2] != "50" {
		t.Errorf("inf report not recognised: %q", m)
	}
	if latLineNoClock.MatchString(" 2       50          107.92         9850.37      1993.61  \t       2240.68\n") {
		t.Error("a real report taken for an inf one")
	}
	if latLine.MatchString(" 2       50          inf            inf          inf\n") {
		t.Error("latLine matches an inf report")
	}
}

// TestLatLineAny: the all-sizes check takes a size whose figures perftest
// printed as inf, as siw's ib_write_lat -a did once at 512 KiB.
func TestLatLineAny(t *testing.T) {
	out := " 262144  5          30621.35        34172.65      32164.68  \t       32164.68     \t1543.00\n" +
		" 524288  5          inf            inf          inf      \t       inf         \t-nan   \t\tinf     \t\tinf    \n" +
		" 1048576 5          67536.68        97776.94      68020.81  \t       68020.81     \t484.00\n"
	if n := len(latLineAny.FindAllStringSubmatch(out, -1)); n != 3 {
		t.Errorf("latLineAny found %d lines, want 3", n)
	}
	if n := len(latLine.FindAllStringSubmatch(out, -1)); n != 2 {
		t.Errorf("latLine found %d lines, want 2", n)
	}
}
