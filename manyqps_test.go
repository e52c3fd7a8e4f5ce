package gowarp_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gowarp/gowarp"
)

// BenchmarkManyQPs runs N client queue pairs in one process, each with its
// own CQ and a goroutine waiting on it (CQ.Wait with a cancellable
// context, as an application that can be shut down waits), each keeping
// eight signaled 4 KiB operations in flight, Writes and Reads alternately,
// against N server queue pairs. ops/s is the aggregate rate; it should
// hold as N grows (issue 7, defect 8). cpu-ns/op is the process's CPU time
// (both sides) per operation.
func BenchmarkManyQPs(b *testing.B) {
	for _, n := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchManyQPs(b, n) })
	}
}

func benchManyQPs(b *testing.B, n int) {
	const (
		size  = 4 << 10
		depth = 8
	)
	type client struct {
		p        *pair
		src, dst *gowarp.MR
		wr       [2]gowarp.SendWR
	}
	cs := make([]client, n)
	for i := range cs {
		c := &cs[i]
		c.p = newPair(b, gowarp.ConnectOptions{})
		c.src, _ = c.p.reg(b, size, gowarp.LocalWrite)
		c.dst, _ = c.p.reg(b, size, gowarp.RemoteWrite|gowarp.RemoteRead)
		c.wr[0] = gowarp.SendWR{Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: c.src, Length: size}}, RemoteAddr: c.dst.Addr(), RKey: uint32(c.dst.STag())}
		c.wr[1] = gowarp.SendWR{Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: c.src, Length: size}}, RemoteAddr: c.dst.Addr(), RKey: uint32(c.dst.STag())}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var left atomic.Int64 // operations still to post, over all clients
	left.Store(int64(b.N))
	var failed atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := range cs {
		c := &cs[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var wc [depth]gowarp.Completion
			inflight, k := 0, 0
			post := func() bool {
				if left.Add(-1) < 0 {
					return false
				}
				if err := c.p.a.PostSend(&c.wr[k&1]); err != nil {
					failed.Store(err)
					return false
				}
				k++
				inflight++
				return true
			}
			for inflight < depth && post() {
			}
			for inflight > 0 {
				m := c.p.acq.Poll(wc[:])
				if m == 0 {
					if err := c.p.acq.Wait(ctx); err != nil {
						failed.Store(err)
						return
					}
					continue
				}
				for _, w := range wc[:m] {
					if w.Status != gowarp.Success {
						failed.Store(fmt.Errorf("completion %v", w.Status))
						return
					}
				}
				inflight -= m
				for range m {
					if !post() {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	cpu := cpuTime() - cpu0
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	// The machine may be shared: the process's CPU time per operation
	// shows the cost of the path whatever share of the CPUs it got.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}
