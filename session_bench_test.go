package gowarp_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// BenchmarkSessionsIdle reports the CPU idle sessions cost: 200 of them,
// one path each, both sides in this process, the default heartbeat (1 s
// timeout), per session and second idle. It is the probes' exchanges and
// the sessions' looks; docs/failover.md has the figures between two
// processes.
func BenchmarkSessionsIdle(b *testing.B) {
	const n = 200
	dev := gowarp.Open(gowarp.WithLogger(slog.New(slog.DiscardHandler)))
	pd := dev.AllocPD()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	sl := pd.ListenSession(gowarp.SessionConfig{}, ln)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	accepted := make(chan *gowarp.Session, n)
	go func() {
		for {
			s, err := sl.Accept(ctx)
			if err != nil {
				return
			}
			accepted <- s
		}
	}()
	var all []*gowarp.Session
	for range n {
		s, err := pd.DialSession(ctx, []string{ln.Addr().String()}, gowarp.SessionConfig{})
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, s, <-accepted)
	}
	defer func() {
		for _, s := range all {
			s.Close()
		}
	}()
	time.Sleep(1500 * time.Millisecond) // past the joins and the first probes
	b.ResetTimer()
	cpu0 := cpuTime()
	for range b.N {
		time.Sleep(100 * time.Millisecond)
	}
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/(float64(b.N)/10)/n, "cpu-µs/s/session")
}
