// Package cachebench is the logic of `gowarp cache bench`: GETs of the
// gowarp block cache (package cache) next to memcached 1.6 driven from Go
// (github.com/bradfitz/gomemcache) at the same concurrency, and 1 MiB
// reads next to `gowarp perf`'s read_bw, all in one run on this machine.
package cachebench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
	"github.com/gowarp/gowarp/internal/perf"
)

// Config is one run of the benchmark.
type Config struct {
	Duration    time.Duration // per case
	Concurrency int           // goroutines of the 4 KiB cases
	LargeConc   int           // goroutines of the 1 MiB cases
	Keys        int           // values of each size preloaded
	Conns       int           // the gowarp client's connections (0: 1)
	Memcached   string        // the memcached binary (default: memcached on PATH)
	// Rounds repeats every case, the systems taking turns, and reports
	// each system's median round (by ops/s): on a loaded machine one run
	// of each says more about the load than about the systems.
	Rounds int
	Log    *slog.Logger
}

// Result is one case's outcome.
type Result struct {
	System      string  `json:"system"` // memcached, gowarp-get, gowarp-readat, gowarp-perf
	Size        int     `json:"size"`
	Concurrency int     `json:"concurrency"`
	Ops         int     `json:"ops"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	MBps        float64 `json:"MBps"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
}

// Run runs every case and hands each result to emit as it comes.
func Run(ctx context.Context, cfg Config, emit func(Result)) error {
	if cfg.Duration <= 0 {
		cfg.Duration = 2 * time.Second
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.LargeConc <= 0 {
		cfg.LargeConc = 2
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 1
	}
	if cfg.Keys <= 0 {
		cfg.Keys = 1000
	}
	if cfg.Conns <= 0 {
		cfg.Conns = 1 // the fastest at 16 in flight on 2 cores (1, 2, 4 tried)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	mc, stopMC, err := startMemcached(ctx, cfg.Memcached)
	if err != nil {
		return err
	}
	defer stopMC()

	dir, err := os.MkdirTemp("", "gowarp-cachebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dev := gowarp.Open(gowarp.WithLogger(cfg.Log))
	srv, err := cache.NewServer(cache.ServerOptions{Dir: dir, Budget: 4 << 30, Device: dev, Logger: cfg.Log})
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go srv.Serve(sctx, ln)
	cl, err := cache.Dial(ctx, ln.Addr().String(), cache.ClientOptions{Conns: cfg.Conns, Device: gowarp.Open(gowarp.WithLogger(cfg.Log)), Logger: cfg.Log})
	if err != nil {
		return err
	}
	defer cl.Close()

	for _, size := range []int{4 << 10, 1 << 20} {
		keys := cfg.Keys
		conc := cfg.Concurrency
		if size > 4<<10 {
			keys, conc = max(8, cfg.Keys/100), cfg.LargeConc
		}
		val := make([]byte, size)
		for i := range val {
			val[i] = byte(i * 7)
		}
		for i := range keys {
			k := key(size, i)
			if err := mc.Set(&memcache.Item{Key: k, Value: val}); err != nil {
				return fmt.Errorf("memcached set: %w", err)
			}
			if err := cl.Put(ctx, k, val, cache.PutOptions{}); err != nil {
				return fmt.Errorf("cache put: %w", err)
			}
		}
		bufs := make([][]byte, conc)
		mrs := make([]*gowarp.MR, conc)
		for g := range mrs {
			if mrs[g], err = cl.PD().Register(make([]byte, size), gowarp.LocalWrite); err != nil {
				return err
			}
		}
		cases := []struct {
			system string
			op     func(g, i int) error
		}{
			{"memcached", func(g, i int) error {
				it, err := mc.Get(key(size, (g*7919+i)%keys))
				if err == nil && len(it.Value) != size {
					err = fmt.Errorf("memcached: %d bytes", len(it.Value))
				}
				return err
			}},
			{"gowarp-get", func(g, i int) error {
				ctx, cancel := context.WithTimeout(ctx, opTimeout)
				defer cancel()
				v, err := cl.GetInto(ctx, key(size, (g*7919+i)%keys), bufs[g], cache.GetOptions{})
				bufs[g] = v
				if err == nil && len(v) != size {
					err = fmt.Errorf("cache: %d bytes", len(v))
				}
				return err
			}},
			{"gowarp-readat", func(g, i int) error {
				ctx, cancel := context.WithTimeout(ctx, opTimeout)
				defer cancel()
				n, err := cl.ReadAt(ctx, key(size, (g*7919+i)%keys), mrs[g], 0, size, 0)
				if err == nil && n != size {
					err = fmt.Errorf("cache: %d bytes", n)
				}
				return err
			}},
		}
		runs := make([][]Result, len(cases))
		for range cfg.Rounds {
			for i, c := range cases {
				runs[i] = append(runs[i], measure(c.system, size, conc, cfg.Duration, c.op))
			}
		}
		for _, rs := range runs {
			emit(median(rs))
		}
		for _, mr := range mrs {
			mr.Deregister()
		}
		if size == 1<<20 {
			var rs []Result
			for range cfg.Rounds {
				r, err := perfReadBW(ctx, size, cfg)
				if err != nil {
					return err
				}
				rs = append(rs, r)
			}
			emit(median(rs))
		}
	}
	return ctx.Err()
}

// median returns the round with the median ops/s.
func median(rs []Result) Result {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Result) int { return cmp.Compare(a.OpsPerSec, b.OpsPerSec) })
	return rs[len(rs)/2]
}

// opTimeout bounds one GET: a stall ends the run with an error instead
// of hanging it.
const opTimeout = 10 * time.Second

func key(size, i int) string { return "bench-" + strconv.Itoa(size) + "-" + strconv.Itoa(i) }

// measure runs op on conc goroutines for d and reports ops/s, MB/s and
// the latency percentiles; an op that fails ends the run with its error
// counted (the run's Ops excludes it).
func measure(system string, size, conc int, d time.Duration, op func(g, i int) error) Result {
	lats := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	var firstErr error
	var emu sync.Mutex
	start := time.Now()
	end := start.Add(d)
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := make([]time.Duration, 0, 1<<16)
			for i := 0; ; i++ {
				t0 := time.Now()
				if t0.After(end) {
					break
				}
				if err := op(g, i); err != nil {
					err = fmt.Errorf("op %d of goroutine %d: %w", i, g, err)
					emu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					emu.Unlock()
					break
				}
				l = append(l, time.Since(t0))
			}
			lats[g] = l
		}()
	}
	wg.Wait()
	el := time.Since(start)
	all := slices.Concat(lats...)
	slices.Sort(all)
	r := Result{System: system, Size: size, Concurrency: conc, Ops: len(all)}
	r.OpsPerSec = float64(len(all)) / el.Seconds()
	r.MBps = r.OpsPerSec * float64(size) / 1e6
	if len(all) > 0 {
		r.P50us = float64(all[len(all)/2].Nanoseconds()) / 1e3
		r.P99us = float64(all[len(all)*99/100].Nanoseconds()) / 1e3
	}
	if firstErr != nil {
		r.System += " (error: " + firstErr.Error() + ")"
	}
	return r
}

// perfReadBW is `gowarp perf -test read_bw` of the size, in this process
// over loopback, as the bound a one-sided GET can reach.
func perfReadBW(ctx context.Context, size int, cfg Config) (Result, error) {
	lb, err := perf.StartLoopback(&perf.Server{Log: cfg.Log})
	if err != nil {
		return Result{}, err
	}
	defer lb.Close()
	pr, err := lb.Client.Run(ctx, perf.ReadBW, perf.Options{Size: size, Duration: cfg.Duration})
	if err != nil {
		return Result{}, fmt.Errorf("perf read_bw: %w", err)
	}
	r := Result{System: "gowarp-perf read_bw", Size: size, Concurrency: 1, Ops: pr.Iters, MBps: pr.MBps}
	r.OpsPerSec = pr.Mpps * 1e6
	return r, nil
}

// startMemcached starts memcached on a free loopback port and returns a
// client of it once it answers.
func startMemcached(ctx context.Context, bin string) (*memcache.Client, func(), error) {
	if bin == "" {
		bin = "memcached"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, nil, fmt.Errorf("cachebench: %w (install it: scripts/memcached, or apt-get install memcached)", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	args := []string{"-l", "127.0.0.1", "-p", port, "-U", "0", "-t", "4", "-m", "2048", "-I", "2m"}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root")
	}
	cmd := exec.Command(path, args...)
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("cachebench: memcached: %w", err)
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	addr := "127.0.0.1:" + port
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return nil, nil, errors.Join(fmt.Errorf("cachebench: memcached does not answer on %s", addr), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mc := memcache.New(addr)
	mc.MaxIdleConns = 64
	mc.Timeout = 5 * time.Second
	return mc, stop, nil
}
