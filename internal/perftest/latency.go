package perftest

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// LatReport is what perftest's print_report_lat shows for a latency test,
// in microseconds: one-way latency for write_lat and send_lat (half the
// round trip), the round trip for read_lat.
type LatReport struct {
	Size, Iters uint64
	// Sampled marks a run of a duration (perftest's -D): Iters messages
	// in the sampled time, whose average latency is Avg and rate TPS; the
	// other figures are zero.
	Sampled    bool
	TPS        float64
	Min, Max   float64
	Typical    float64 // the median
	Avg, Stdev float64
	P99, P999  float64
}

// latTail is how many of the largest samples perftest leaves out of every
// figure (LAT_MEASURE_TAIL).
const latTail = 2

// latReport computes perftest's figures from the post times of a
// ping-pong run (nanoseconds): each sample is the time between two
// consecutive posts, one round trip, divided by rtt (2 for write_lat and
// send_lat, 1 for read_lat). As perftest does, the two largest samples are
// dropped, the median of an even count is the mean of the middle two, the
// maximum is the largest sample kept's successor (delta[n] after dropping),
// and the percentiles index the sorted samples at ceil(n·p). The standard
// deviation is the true one (perftest truncates each deviation to an
// integer number of microseconds first).
func latReport(size int, tposted []int64, rtt float64) LatReport {
	r := LatReport{Size: uint64(size), Iters: uint64(len(tposted))}
	if len(tposted) < 2 {
		return r
	}
	delta := make([]float64, len(tposted)-1)
	for i := range delta {
		delta[i] = float64(tposted[i+1]-tposted[i]) / 1e3 / rtt
	}
	slices.Sort(delta)
	n := len(delta) - latTail
	if n < 1 {
		// Too few samples to drop the tail: use them all.
		n = len(delta)
	}
	at := func(i int) float64 { return delta[min(i, len(delta)-1)] }
	r.Min = delta[0]
	r.Max = at(n)
	if (n-1)%2 != 0 {
		r.Typical = (delta[n/2] + delta[n/2-1]) / 2
	} else {
		r.Typical = delta[n/2]
	}
	var sum float64
	for _, d := range delta[:n] {
		sum += d
	}
	r.Avg = sum / float64(n)
	var sq float64
	for _, d := range delta[:n] {
		sq += (d - r.Avg) * (d - r.Avg)
	}
	r.Stdev = math.Sqrt(sq / float64(n))
	r.P99 = at(int(math.Ceil(float64(n) * 0.99)))
	r.P999 = at(int(math.Ceil(float64(n) * 0.999)))
	return r
}

// latSampled is a run of a duration's report, as perftest's
// print_report_lat_duration: n messages in the sampled time, each a round
// trip (divided by rtt as latReport's samples).
func latSampled(size, n int, sample time.Duration, rtt float64) LatReport {
	r := LatReport{Size: uint64(size), Iters: uint64(n), Sampled: true}
	if n > 0 {
		r.Avg = float64(sample.Microseconds()) / rtt / float64(n)
		r.TPS = float64(n) / sample.Seconds()
	}
	return r
}

// LatResultHeader, LatResultHeaderSampled (a run of a duration) and Line
// print a latency report the way perftest does.
const (
	LatResultHeader        = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
	LatResultHeaderSampled = " #bytes        #iterations       t_avg[usec]    tps average"
)

// Line formats r as perftest's latency result line.
func (r *LatReport) Line() string {
	if r.Sampled {
		return fmt.Sprintf(" %-7d       %d            %-7.2f        %-7.2f", r.Size, r.Iters, r.Avg, r.TPS)
	}
	return fmt.Sprintf(" %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f",
		r.Size, r.Iters, r.Min, r.Max, r.Typical, r.Avg, r.Stdev, r.P99, r.P999)
}
