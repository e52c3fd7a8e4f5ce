package perf

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
)

// Summary is one test at one size over several rounds: the median of
// its results, and the median and range of its ratio to plain TCP's
// result of the same kind and size in the same round. A host's speed
// drifts within seconds (tcp_bw has moved by half between one run and
// the next on the VM this was written on), so a ratio taken within a
// round, where gowarp and TCP ran moments apart, says more than one
// taken between medians.
type Summary struct {
	Test   Test
	Size   int
	Rounds int     // rounds with a result
	Median float64 // MB/s for bandwidth, the p50 in µs for latency

	// Ratio is the median of the per-round ratios, RatioMin and RatioMax
	// their range, over RatioRounds rounds (those that also ran plain
	// TCP's test; none for the TCP tests themselves). Bandwidth is
	// divided by tcp_bw's, latency by tcp_lat's, and read_lat, a whole
	// round trip, by twice tcp_lat's one-way figure.
	Ratio, RatioMin, RatioMax float64
	RatioRounds               int
}

// value is what a summary takes the median of.
func (r Result) value() float64 {
	if r.Test.Bandwidth() {
		return r.MBps
	}
	return r.LatP50
}

// base returns the TCP test r is compared with and the factor on its
// value.
func (t Test) base() (Test, float64) {
	switch {
	case t.TCP():
		return 0, 0
	case t.Bandwidth():
		return TCPBW, 1
	case t == ReadLat:
		return TCPLat, 2
	}
	return TCPLat, 1
}

// Summarize summarizes rounds of results, each round a run of the same
// tests (in any order), in the order of first appearance of each test and
// size.
func Summarize(rounds [][]Result) []Summary {
	type key struct {
		t    Test
		size int
	}
	var order []key
	vals := map[key][]float64{}
	ratios := map[key][]float64{}
	for _, round := range rounds {
		tcp := map[key]float64{}
		for _, r := range round {
			if r.Test.TCP() && r.value() > 0 {
				tcp[key{r.Test, r.Size}] = r.value()
			}
		}
		for _, r := range round {
			k := key{r.Test, r.Size}
			if _, ok := vals[k]; !ok {
				order = append(order, k)
			}
			vals[k] = append(vals[k], r.value())
			bt, f := r.Test.base()
			if b := tcp[key{bt, r.Size}]; f > 0 && b > 0 {
				ratios[k] = append(ratios[k], r.value()/(f*b))
			}
		}
	}
	out := make([]Summary, 0, len(order))
	for _, k := range order {
		s := Summary{Test: k.t, Size: k.size, Rounds: len(vals[k]), Median: median(vals[k])}
		if rs := ratios[k]; len(rs) > 0 {
			s.Ratio, s.RatioMin, s.RatioMax, s.RatioRounds = median(rs), slices.Min(rs), slices.Max(rs), len(rs)
		}
		out = append(out, s)
	}
	return out
}

// median returns the median of v (the mean of the middle two for an even
// count), sorting v.
func median(v []float64) float64 {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// ratioBase names what a test's ratio divides by, as the table prints it.
func (t Test) ratioBase() string {
	bt, f := t.base()
	if f == 2 {
		return "2 × " + bt.String()
	}
	return bt.String()
}

// WriteSummaries writes summaries as a table under a header line.
func WriteSummaries(w io.Writer, ss []Summary) error {
	if _, err := fmt.Fprintf(w, "%-10s %8s %7s %15s  %s\n", "#test", "bytes", "rounds", "median", "ratio to plain TCP in the same round: median [min, max]"); err != nil {
		return err
	}
	for _, s := range ss {
		unit := "µs p50"
		if s.Test.Bandwidth() {
			unit = "MB/s"
		}
		line := fmt.Sprintf("%-10s %8d %7d %8.2f %-6s", s.Test, s.Size, s.Rounds, s.Median, unit)
		if s.RatioRounds > 0 {
			line += fmt.Sprintf("  %.3f [%.3f, %.3f] × %s", s.Ratio, s.RatioMin, s.RatioMax, s.Test.ratioBase())
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

type summaryJSON struct {
	Summary     bool     `json:"summary"`
	Test        string   `json:"test"`
	Size        int      `json:"size"`
	Rounds      int      `json:"rounds"`
	Median      float64  `json:"median"`
	Unit        string   `json:"unit"`
	Ratio       *float64 `json:"ratio_to_tcp,omitempty"`
	RatioMin    *float64 `json:"ratio_min,omitempty"`
	RatioMax    *float64 `json:"ratio_max,omitempty"`
	RatioBase   string   `json:"ratio_base,omitempty"`
	RatioRounds int      `json:"ratio_rounds,omitempty"`
}

// MarshalJSON encodes a summary as {summary: true, test, size, rounds,
// median, unit ("MB/s" or "us_p50")}, and, where it has a ratio to plain
// TCP, ratio_to_tcp, ratio_min, ratio_max, ratio_base (what it divides
// by: "tcp_bw", "tcp_lat" or "2 × tcp_lat") and ratio_rounds.
func (s Summary) MarshalJSON() ([]byte, error) {
	j := summaryJSON{Summary: true, Test: s.Test.String(), Size: s.Size, Rounds: s.Rounds, Median: round(s.Median, 3), Unit: "us_p50"}
	if s.Test.Bandwidth() {
		j.Unit = "MB/s"
	}
	if s.RatioRounds > 0 {
		r, lo, hi := round(s.Ratio, 4), round(s.RatioMin, 4), round(s.RatioMax, 4)
		j.Ratio, j.RatioMin, j.RatioMax, j.RatioBase, j.RatioRounds = &r, &lo, &hi, s.Test.ratioBase(), s.RatioRounds
	}
	return json.Marshal(j)
}
