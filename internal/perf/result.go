package perf

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/gowarp/gowarp"
)

// Result is the outcome of one run.
type Result struct {
	Test    Test
	Size    int
	Iters   int           // messages (bandwidth) or round trips / Reads (latency)
	Elapsed time.Duration // first post to last completion

	// Bandwidth tests.
	MBps float64 // payload bytes per second / 10^6
	Mpps float64 // messages per second / 10^6

	// Latency tests, in microseconds: one way (half the round trip) for
	// the ping-pong tests, the whole Read for read_lat, as perftest does.
	LatMin, LatAvg, LatP50, LatP99 float64

	// Transport is the link the run's connection got (TCP for the
	// plain-TCP tests).
	Transport gowarp.Transport

	// Round is the round of a run of several (gowarp perf -rounds),
	// from 1; 0 for a single run.
	Round int
}

func bandwidthResult(t Test, size, iters int, elapsed time.Duration) Result {
	r := Result{Test: t, Size: size, Iters: iters, Elapsed: elapsed}
	if s := elapsed.Seconds(); s > 0 {
		r.MBps = float64(size) * float64(iters) / s / 1e6
		r.Mpps = float64(iters) / s / 1e6
	}
	return r
}

// latencyResult summarises samples (nanoseconds, sorted in place); half
// halves them, for ping-pong tests.
func latencyResult(t Test, size int, samples []int64, elapsed time.Duration, half bool) Result {
	r := Result{Test: t, Size: size, Iters: len(samples), Elapsed: elapsed}
	if len(samples) == 0 {
		return r
	}
	slices.Sort(samples)
	div := 1e3
	if half {
		div = 2e3
	}
	var sum float64
	for _, s := range samples {
		sum += float64(s)
	}
	r.LatMin = float64(samples[0]) / div
	r.LatAvg = sum / float64(len(samples)) / div
	r.LatP50 = float64(percentile(samples, 50)) / div
	r.LatP99 = float64(percentile(samples, 99)) / div
	return r
}

// percentile returns the nearest-rank p-th percentile of sorted samples.
func percentile(sorted []int64, p int) int64 {
	i := (len(sorted)*p + 99) / 100
	return sorted[max(0, min(i-1, len(sorted)-1))]
}

type bwJSON struct {
	Test      string  `json:"test"`
	Size      int     `json:"size"`
	Iters     int     `json:"iters"`
	MBps      float64 `json:"bw_MBps"`
	Mpps      float64 `json:"msg_rate_Mpps"`
	Transport string  `json:"transport"`
	Round     int     `json:"round,omitempty"`
}

type latJSON struct {
	Test      string  `json:"test"`
	Size      int     `json:"size"`
	Iters     int     `json:"iters"`
	Min       float64 `json:"lat_us_min"`
	Avg       float64 `json:"lat_us_avg"`
	P50       float64 `json:"lat_us_p50"`
	P99       float64 `json:"lat_us_p99"`
	Transport string  `json:"transport"`
	Round     int     `json:"round,omitempty"`
}

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

// MarshalJSON encodes a bandwidth result as {test, size, iters, bw_MBps,
// msg_rate_Mpps, transport} and a latency result as {test, size, iters,
// lat_us_min, lat_us_avg, lat_us_p50, lat_us_p99, transport}; transport
// is "tcp" or "shm". A result of a round of several has its round too.
func (r Result) MarshalJSON() ([]byte, error) {
	if r.Test.Bandwidth() {
		return json.Marshal(bwJSON{r.Test.String(), r.Size, r.Iters, round(r.MBps, 2), round(r.Mpps, 6), r.Transport.String(), r.Round})
	}
	return json.Marshal(latJSON{r.Test.String(), r.Size, r.Iters,
		round(r.LatMin, 3), round(r.LatAvg, 3), round(r.LatP50, 3), round(r.LatP99, 3), r.Transport.String(), r.Round})
}

// WriteTableHeader writes the header of the table WriteTableRow fills.
func WriteTableHeader(w io.Writer) error {
	_, err := fmt.Fprintf(w, "%-10s %8s %11s %12s %9s %10s %10s %10s %10s\n",
		"#test", "bytes", "iterations", "BW[MB/s]", "Mpps", "t_min[us]", "t_avg[us]", "t_p50[us]", "t_p99[us]")
	return err
}

// WriteTableRow writes r as one line of the table.
func WriteTableRow(w io.Writer, r Result) error {
	var err error
	if r.Test.Bandwidth() {
		_, err = fmt.Fprintf(w, "%-10s %8d %11d %12.2f %9.4f\n", r.Test, r.Size, r.Iters, r.MBps, r.Mpps)
	} else {
		_, err = fmt.Fprintf(w, "%-10s %8d %11d %12s %9s %10.2f %10.2f %10.2f %10.2f\n",
			r.Test, r.Size, r.Iters, "", "", r.LatMin, r.LatAvg, r.LatP50, r.LatP99)
	}
	return err
}
