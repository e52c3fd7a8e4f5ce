package perf

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gowarp/gowarp"
)

// MaxQPs bounds the connections of a parallel run.
const MaxQPs = 4096

// RunParallel runs the bandwidth test t on n connections at once, each
// with its own queue pair, CQ and goroutine waiting on it, as a server
// with many active clients has (issue 7, defect 8), and returns their
// aggregate: the messages of all of them over the time from their common
// start to the end of the last. It connects them all before the clock
// starts. With n of 1 it is Run.
func (c *Client) RunParallel(ctx context.Context, t Test, o Options, n int) (Result, error) {
	if n <= 1 {
		return c.Run(ctx, t, o)
	}
	if err := o.check(t); err != nil {
		return Result{}, err
	}
	if !t.Bandwidth() || t.TCP() {
		return Result{}, fmt.Errorf("perf: %v runs on one connection; parallel runs are for the RDMA bandwidth tests", t)
	}
	if n > MaxQPs {
		return Result{}, fmt.Errorf("perf: %d connections, at most %d", n, MaxQPs)
	}
	if c.Dev == nil {
		c.Dev = gowarp.Open()
	}
	runs := make([]*clientRun, 0, n)
	closeAll := func() error {
		var errs []error
		for _, r := range runs {
			errs = append(errs, r.close())
		}
		return errors.Join(errs...)
	}
	for range n {
		r, err := c.connect(ctx, t, &o)
		if err != nil {
			closeAll()
			return Result{}, fmt.Errorf("%v: connection %d of %d: %w", t, len(runs)+1, n, err)
		}
		runs = append(runs, r)
	}
	res := make([]Result, n)
	rerrs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i, r := range runs {
		r.start = start
		wg.Go(func() { res[i], rerrs[i] = r.run(ctx) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	cerr := closeAll()
	if err := errors.Join(append(rerrs, cerr)...); err != nil {
		return Result{}, fmt.Errorf("%v %d ×%d: %w", t, o.Size, n, err)
	}
	iters := 0
	for _, r := range res {
		iters += r.Iters
	}
	agg := bandwidthResult(t, o.Size, iters, elapsed)
	// Shared memory only if every connection got it.
	agg.Transport = gowarp.TransportSharedMemory
	for _, r := range runs {
		if r.transport != gowarp.TransportSharedMemory {
			agg.Transport = gowarp.TransportTCP
		}
	}
	return agg, nil
}
