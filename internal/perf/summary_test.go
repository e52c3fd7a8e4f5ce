package perf

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	bw := func(t Test, size int, mbps float64) Result { return Result{Test: t, Size: size, MBps: mbps} }
	lat := func(t Test, p50 float64) Result { return Result{Test: t, Size: 8, LatP50: p50} }
	rounds := [][]Result{
		{bw(WriteBW, 64, 200), bw(TCPBW, 64, 100), lat(WriteLat, 11), lat(ReadLat, 44), lat(TCPLat, 10), bw(SendBW, 4096, 50)},
		// Reversed, and the host twice as fast: the ratios hold.
		{lat(TCPLat, 5), lat(ReadLat, 20), lat(WriteLat, 6), bw(TCPBW, 64, 200), bw(WriteBW, 64, 300), bw(SendBW, 4096, 70)},
		{bw(WriteBW, 64, 250), bw(TCPBW, 64, 100), lat(WriteLat, 12), lat(ReadLat, 42), lat(TCPLat, 10), bw(SendBW, 4096, 60)},
		// A round whose TCP runs failed: its results count, not as ratios.
		{bw(WriteBW, 64, 1000), lat(WriteLat, 1), lat(ReadLat, 1), bw(SendBW, 4096, 80)},
	}
	want := []Summary{
		{Test: WriteBW, Size: 64, Rounds: 4, Median: 275, Ratio: 2, RatioMin: 1.5, RatioMax: 2.5, RatioRounds: 3},
		{Test: TCPBW, Size: 64, Rounds: 3, Median: 100},
		{Test: WriteLat, Size: 8, Rounds: 4, Median: 8.5, Ratio: 1.2, RatioMin: 1.1, RatioMax: 1.2, RatioRounds: 3},
		// read_lat is a whole round trip: against twice TCP's one way.
		{Test: ReadLat, Size: 8, Rounds: 4, Median: 31, Ratio: 2.1, RatioMin: 2, RatioMax: 2.2, RatioRounds: 3},
		{Test: TCPLat, Size: 8, Rounds: 3, Median: 10},
		// No tcp_bw at 4096: no ratio.
		{Test: SendBW, Size: 4096, Rounds: 4, Median: 65},
	}
	got := Summarize(rounds)
	if len(got) != len(want) {
		t.Fatalf("%d summaries, want %d: %+v", len(got), len(want), got)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	for i, w := range want {
		g := got[i]
		if g.Test != w.Test || g.Size != w.Size || g.Rounds != w.Rounds || g.RatioRounds != w.RatioRounds ||
			!near(g.Median, w.Median) || !near(g.Ratio, w.Ratio) || !near(g.RatioMin, w.RatioMin) || !near(g.RatioMax, w.RatioMax) {
			t.Errorf("summary %d: %+v, want %+v", i, g, w)
		}
	}

	var b strings.Builder
	if err := WriteSummaries(&b, got); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"write_bw         64       4   275.00 MB/s    2.000 [1.500, 2.500] × tcp_bw",
		"read_lat          8       4    31.00 µs p50  2.100 [2.000, 2.200] × 2 × tcp_lat",
		"send_bw        4096       4    65.00 MB/s  \n",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, b.String())
		}
	}

	j, err := json.Marshal(got[3])
	if err != nil {
		t.Fatal(err)
	}
	if w := `{"summary":true,"test":"read_lat","size":8,"rounds":4,"median":31,"unit":"us_p50","ratio_to_tcp":2.1,"ratio_min":2,"ratio_max":2.2,"ratio_base":"2 × tcp_lat","ratio_rounds":3}`; string(j) != w {
		t.Errorf("JSON %s, want %s", j, w)
	}
	if j, _ := json.Marshal(got[5]); string(j) != `{"summary":true,"test":"send_bw","size":4096,"rounds":4,"median":65,"unit":"MB/s"}` {
		t.Errorf("JSON without a ratio: %s", j)
	}
}
