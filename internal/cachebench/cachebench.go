// Package cachebench is the logic of `gowarp cache bench`: GETs of the
// gowarp block cache (package cache) next to memcached 1.6 driven from Go
// (github.com/bradfitz/gomemcache) at the same concurrency, and 1 MiB
// reads next to `gowarp perf`'s read_bw, all in one run on this machine.
package cachebench

import (
	"bufio"
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
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
	"github.com/gowarp/gowarp/internal/perf"
)

// Config is one run of the benchmark.
type Config struct {
	Duration time.Duration // per case
	// Concurrency lists the goroutines (GETs in flight) of the 4 KiB
	// cases, each run in turn (default 16).
	Concurrency []int
	LargeConc   int    // goroutines of the 1 MiB cases (default 2; negative: none run)
	Keys        int    // values of each size preloaded
	Conns       int    // the gowarp client's connections (0: 2)
	Memcached   string // the memcached binary (default: memcached on PATH)
	// Rounds repeats every case, the systems taking turns, and reports
	// each system's median round (by ops/s): on a loaded machine one run
	// of each says more about the load than about the systems.
	Rounds int
	// ServerCmd, if set, runs the cache server as a process of its own, as
	// memcached is: the command and its first arguments (`gowarp cache
	// serve`), to which Run adds -addr, -dir and -budget; the server's
	// log names its address (addr=host:port). Empty: the server runs in
	// this process, its goroutines next to the client's.
	ServerCmd []string
	// Systems, if set, names the systems to run (Result.System; the perf
	// row is "gowarp-perf"); empty runs them all.
	Systems []string
	Log     *slog.Logger
}

// runs reports whether cfg runs system.
func (cfg Config) runs(system string) bool {
	return len(cfg.Systems) == 0 || slices.Contains(cfg.Systems, system)
}

// Result is one case's outcome.
type Result struct {
	// System is memcached; gowarp-get (the control path: the value
	// inline in the reply); gowarp-get-index (the client-readable index:
	// a Read of the key's buckets, then of the value); gowarp-readat (one
	// Read of the value through the address the client kept);
	// gowarp-lookup+read and gowarp-lookup-index+read (a lookup of the
	// key, by the control path or the index, then a Read of the value:
	// what a GET of a key the client has not seen costs); or gowarp-perf.
	System      string  `json:"system"`
	Size        int     `json:"size"`
	Concurrency int     `json:"concurrency"`
	Ops         int     `json:"ops"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	MBps        float64 `json:"MBps"`
	// Meanus is the mean latency: Concurrency / OpsPerSec by Little's law,
	// whatever the distribution; P50us is below it when a few callers are
	// served much later than the rest (memcached's p99 is 10-40 × its p50).
	Meanus float64 `json:"mean_us"`
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	// CPUus is the CPU time (user and system) per op of the client (this
	// process) and the server (memcached's process, or the cache server's,
	// which is this one with -in-process): what the op costs whatever
	// else loads the machine. Zero where it cannot be read (not Linux).
	CPUus float64 `json:"cpu_us_per_op"`
}

// Run runs every case and hands each result to emit as it comes.
func Run(ctx context.Context, cfg Config, emit func(Result)) error {
	if cfg.Duration <= 0 {
		cfg.Duration = 2 * time.Second
	}
	if len(cfg.Concurrency) == 0 {
		cfg.Concurrency = []int{16}
	}
	if cfg.LargeConc == 0 {
		cfg.LargeConc = 2
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 1
	}
	if cfg.Keys <= 0 {
		cfg.Keys = 1000
	}
	if cfg.Conns <= 0 {
		// Two: each is served by a server goroutine of its own, so two
		// 1 MiB Reads leave on both cores (ReadAt 1,951-3,076 MB/s,
		// median 2,865, against 1,917-2,481, median 2,136, on one; 2 in
		// flight, load 5-7); 4 KiB at 16 in flight is the same within
		// the noise on 1 or 2 (2 cores).
		cfg.Conns = 2
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	mc, mcPID, stopMC, err := startMemcached(ctx, cfg.Memcached)
	if err != nil {
		return err
	}
	defer stopMC()

	dir, err := os.MkdirTemp("", "gowarp-cachebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var addr string
	srvPID := 0 // the cache server's process, if not this one
	if len(cfg.ServerCmd) > 0 {
		a, pid, stop, err := startServerProcess(ctx, cfg.ServerCmd, dir)
		if err != nil {
			return err
		}
		defer stop()
		addr, srvPID = a, pid
	} else {
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
		addr = ln.Addr().String()
	}
	cdev := gowarp.Open(gowarp.WithLogger(cfg.Log))
	cl, err := cache.Dial(ctx, addr, cache.ClientOptions{Conns: cfg.Conns, Device: cdev, Logger: cfg.Log, Lookup: cache.LookupControl})
	if err != nil {
		return err
	}
	defer cl.Close()
	ci, err := cache.Dial(ctx, addr, cache.ClientOptions{Conns: cfg.Conns, Device: cdev, Logger: cfg.Log, Lookup: cache.LookupIndex})
	if err != nil {
		return err
	}
	defer ci.Close()

	type kase struct {
		size, keys, conc int
	}
	var kases []kase
	for _, c := range cfg.Concurrency {
		kases = append(kases, kase{4 << 10, cfg.Keys, c})
	}
	if cfg.LargeConc > 0 {
		kases = append(kases, kase{1 << 20, max(8, cfg.Keys/100), cfg.LargeConc})
	}
	loaded := map[int]bool{}
	for _, k := range kases {
		size, keys, conc := k.size, k.keys, k.conc
		val := make([]byte, size)
		for i := range val {
			val[i] = byte(i * 7)
		}
		for i := range keys {
			if loaded[size] {
				break
			}
			k := key(size, i)
			if err := mc.Set(&memcache.Item{Key: k, Value: val}); err != nil {
				return fmt.Errorf("memcached set: %w", err)
			}
			if err := cl.Put(ctx, k, val, cache.PutOptions{}); err != nil {
				return fmt.Errorf("cache put: %w", err)
			}
		}
		loaded[size] = true
		bufs := make([][]byte, conc)
		mrs := make([]*gowarp.MR, conc)
		imrs := make([]*gowarp.MR, conc)
		for g := range mrs {
			if mrs[g], err = cl.PD().Register(make([]byte, size), gowarp.LocalWrite); err != nil {
				return err
			}
			if imrs[g], err = ci.PD().Register(make([]byte, size), gowarp.LocalWrite); err != nil {
				return err
			}
		}
		check := func(n int, err error) error {
			if err == nil && n != size {
				err = fmt.Errorf("cache: %d bytes", n)
			}
			return err
		}
		get := func(c *cache.Client) func(ctx context.Context, g, i int) error {
			return func(ctx context.Context, g, i int) error {
				v, err := c.GetInto(ctx, key(size, (g*7919+i)%keys), bufs[g], cache.GetOptions{})
				bufs[g] = v
				return check(len(v), err)
			}
		}
		lookupRead := func(c *cache.Client, mrs []*gowarp.MR) func(ctx context.Context, g, i int) error {
			return func(ctx context.Context, g, i int) error {
				e, err := c.Lookup(ctx, key(size, (g*7919+i)%keys))
				if err != nil {
					return err
				}
				return check(c.ReadEntry(ctx, e, mrs[g], 0, size, 0))
			}
		}
		cases := []struct {
			system string
			op     func(ctx context.Context, g, i int) error
		}{
			{"memcached", func(_ context.Context, g, i int) error {
				it, err := mc.Get(key(size, (g*7919+i)%keys))
				if err != nil {
					return err
				}
				return check(len(it.Value), nil)
			}},
			{"gowarp-get", get(cl)},
			{"gowarp-get-index", get(ci)},
			{"gowarp-readat", func(ctx context.Context, g, i int) error {
				return check(cl.ReadAt(ctx, key(size, (g*7919+i)%keys), mrs[g], 0, size, 0))
			}},
			{"gowarp-lookup+read", lookupRead(cl, mrs)},
			{"gowarp-lookup-index+read", lookupRead(ci, imrs)},
		}
		cases = slices.DeleteFunc(cases, func(c struct {
			system string
			op     func(ctx context.Context, g, i int) error
		}) bool {
			return !cfg.runs(c.system)
		})
		runs := make([][]Result, len(cases))
		for range cfg.Rounds {
			for i, c := range cases {
				pid := srvPID
				if c.system == "memcached" {
					pid = mcPID
				}
				runs[i] = append(runs[i], measure(ctx, c.system, size, conc, cfg.Duration, pid, c.op))
			}
		}
		for _, rs := range runs {
			emit(median(rs))
		}
		for g := range mrs {
			mrs[g].Deregister()
			imrs[g].Deregister()
		}
		if size == 1<<20 && cfg.runs("gowarp-perf") {
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

// opTimeout bounds a run's GETs past its end: a stall ends the run with
// an error instead of hanging it. Each goroutine has one context for
// the run, ending opTimeout after it: a context made for every GET
// (context.WithTimeout, its timer and its cancel) cost the client a
// tenth of its CPU per 4 KiB GET, which is the caller's and not the
// cache's (memcached's client, given no context, pays only its own
// per-op deadline).
const opTimeout = 10 * time.Second

func key(size, i int) string { return "bench-" + strconv.Itoa(size) + "-" + strconv.Itoa(i) }

// measure runs op on conc goroutines for d and reports ops/s, MB/s and
// the latency percentiles; an op that fails ends the run with its error
// counted (the run's Ops excludes it).
func measure(ctx context.Context, system string, size, conc int, d time.Duration, serverPID int, op func(ctx context.Context, g, i int) error) Result {
	lats := make([][]time.Duration, conc)
	cpu0 := cpuTime(0) + cpuTime(serverPID)
	var wg sync.WaitGroup
	var firstErr error
	var emu sync.Mutex
	start := time.Now()
	end := start.Add(d)
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithDeadline(ctx, end.Add(opTimeout))
			defer cancel()
			l := make([]time.Duration, 0, 1<<16)
			for i := 0; ; i++ {
				t0 := time.Now()
				if t0.After(end) {
					break
				}
				if err := op(ctx, g, i); err != nil {
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
	cpu := cpuTime(0) + cpuTime(serverPID) - cpu0
	all := slices.Concat(lats...)
	slices.Sort(all)
	r := Result{System: system, Size: size, Concurrency: conc, Ops: len(all)}
	r.OpsPerSec = float64(len(all)) / el.Seconds()
	r.MBps = r.OpsPerSec * float64(size) / 1e6
	if len(all) > 0 && cpu > 0 {
		r.CPUus = float64(cpu.Nanoseconds()) / float64(len(all)) / 1e3
	}
	if len(all) > 0 {
		var sum time.Duration
		for _, l := range all {
			sum += l
		}
		r.Meanus = float64(sum.Nanoseconds()) / float64(len(all)) / 1e3
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

// startServerProcess runs the cache server command on a free loopback
// port with the data directory dir, and returns its address once its log
// names it.
func startServerProcess(ctx context.Context, argv []string, dir string) (string, int, func(), error) {
	args := append(slices.Clone(argv[1:]), "-addr", "127.0.0.1:0", "-dir", dir, "-budget", "4GiB")
	cmd := exec.Command(argv[0], args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", 0, nil, fmt.Errorf("cachebench: cache server: %w", err)
	}
	stop := func() {
		// Interrupted, the server ends as on ^C (and writes its profile,
		// if asked to); killed if it has not within 10 s.
		cmd.Process.Signal(os.Interrupt)
		t := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
		cmd.Wait()
		t.Stop()
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() { // and on to the end, so the server never blocks on its log
			if _, rest, ok := strings.Cut(sc.Text(), "msg=\"cache: serving\" addr="); ok && !sent {
				found <- strings.Fields(rest)[0]
				sent = true
			}
		}
		if !sent {
			close(found)
		}
	}()
	select {
	case a, ok := <-found:
		if !ok {
			stop()
			return "", 0, nil, errors.New("cachebench: the cache server ended before it served")
		}
		return a, cmd.Process.Pid, stop, nil
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	stop()
	return "", 0, nil, errors.New("cachebench: the cache server does not say where it serves")
}

// startMemcached starts memcached on a free loopback port and returns a
// client of it once it answers.
func startMemcached(ctx context.Context, bin string) (*memcache.Client, int, func(), error) {
	if bin == "" {
		bin = "memcached"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("cachebench: %w (install it: scripts/memcached, or apt-get install memcached)", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, 0, nil, err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	args := []string{"-l", "127.0.0.1", "-p", port, "-U", "0", "-t", "4", "-m", "2048", "-I", "2m"}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root")
	}
	cmd := exec.Command(path, args...)
	if err := cmd.Start(); err != nil {
		return nil, 0, nil, fmt.Errorf("cachebench: memcached: %w", err)
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
			return nil, 0, nil, errors.Join(fmt.Errorf("cachebench: memcached does not answer on %s", addr), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mc := memcache.New(addr)
	mc.MaxIdleConns = 64
	mc.Timeout = 5 * time.Second
	return mc, cmd.Process.Pid, stop, nil
}
