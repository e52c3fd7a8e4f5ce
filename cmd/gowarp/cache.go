package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
	"github.com/gowarp/gowarp/cache/monitor"
	"github.com/gowarp/gowarp/internal/cachebench"
)

func init() {
	register("cache", "the persistent block cache (package cache): serve, put, get, del, ls, stat, bench", runCache)
}

const cacheUsage = `usage: gowarp cache <serve|put|get|del|ls|stat|members|bench> [flags] [args]

  serve                  run a cache server on -addr, data in -dir
  put KEY [FILE]         store FILE (default: standard input) under KEY
  get KEY [FILE]         write KEY's value to FILE (default: standard output)
  del KEY                delete KEY
  ls [PREFIX]            list the keys (with PREFIX)
  stat                   the server's counters
  members                a cluster's servers and replicas (with -etcd)
  bench                  4 KiB and 1 MiB GETs against memcached and gowarp perf

The address defaults to $GOWARP_CACHE (else 127.0.0.1:7190). With -etcd
(default $GOWARP_ETCD), serve joins a cluster and put, get and del go to the
servers that own the key; ls and stat always talk to the one server -addr.
serve -http host:port serves a status page (/) and Prometheus metrics
(/metrics).

flags:
`

func cacheAddr() string {
	if a := os.Getenv("GOWARP_CACHE"); a != "" {
		return a
	}
	return "127.0.0.1:7190"
}

func runCache(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	fs := newFlagSet("cache "+sub, cacheUsage, stderr)
	addr := fs.String("addr", cacheAddr(), "the server's `host:port`")
	timeout := fs.Duration("timeout", time.Minute, "deadline of a client command")
	if sub == "" {
		// No subcommand: -h, or a usage error.
		if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
			return exitOK
		} else if err == nil {
			fs.Usage()
		}
		return exitUsage
	}
	switch sub {
	case "serve":
		return cacheServe(ctx, fs, addr, args, stderr)
	case "bench":
		return cacheBench(ctx, fs, args, stdout, stderr)
	case "put", "get", "del", "ls", "stat", "members":
	default:
		fmt.Fprintf(stderr, "gowarp cache: unknown subcommand %q\n", sub)
		fmt.Fprint(stderr, cacheUsage)
		return exitUsage
	}
	durable := fs.Bool("durable", false, "put: acknowledged only once on the server's stable storage")
	asJSON := fs.Bool("json", false, "stat: print JSON")
	quietFlag := fs.Bool("q", false, "no progress bar")
	cf := addClusterFlags(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	want := map[string][2]int{"put": {1, 2}, "get": {1, 2}, "del": {1, 1}, "ls": {0, 1}, "stat": {0, 0}, "members": {0, 0}}[sub]
	if len(pos) < want[0] || len(pos) > want[1] {
		fmt.Fprintf(stderr, "gowarp cache %s: %s, not %q\n", sub, cacheArgs[sub], pos)
		return exitUsage
	}
	if sub == "members" && !cf.on() {
		fmt.Fprintln(stderr, "gowarp cache members: a cluster's, with -etcd (or $GOWARP_ETCD)")
		return exitUsage
	}
	arg := func(i int) string {
		if i < len(pos) {
			return pos[i]
		}
		return ""
	}
	// A failure names the command (the cache's errors name the key);
	// the cache package's own "cache: " would say "cache" twice.
	failed := func(err error) int {
		fmt.Fprintf(stderr, "gowarp cache %s: %s\n", sub, strings.TrimPrefix(err.Error(), "cache: "))
		return exitFailure
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if cf.on() {
		if err := cacheClusterCommand(ctx, cf, sub, pos, *durable, stdout, stderr, log); err != nil {
			return failed(err)
		}
		return exitOK
	}
	cl, err := cache.Dial(ctx, *addr, cache.ClientOptions{Device: gowarp.Open(gowarp.WithLogger(log)), Logger: log})
	if err != nil {
		return failed(err)
	}
	defer cl.Close()
	switch sub {
	case "put":
		err = cachePut(ctx, cl, arg(0), arg(1), *durable, newBar(stderr, *quietFlag, "put "+arg(0)))
	case "get":
		err = cacheGet(ctx, cl, arg(0), arg(1), stdout, newBar(stderr, *quietFlag, "get "+arg(0)))
	case "del":
		err = cl.Delete(ctx, arg(0))
	case "ls":
		var keys []string
		if keys, err = cl.List(ctx, arg(0), 0); err == nil {
			for _, k := range keys {
				fmt.Fprintln(stdout, k)
			}
		}
	case "stat":
		var st cache.Stats
		if st, err = cl.Stats(ctx); err == nil {
			printStats(stdout, st, *asJSON)
		}
	}
	if err != nil {
		return failed(err)
	}
	return exitOK
}

// cacheArgs says what each client command takes, for a wrong count.
var cacheArgs = map[string]string{
	"put": "want KEY [FILE]", "get": "want KEY [FILE]", "del": "want KEY",
	"ls": "want at most a PREFIX", "stat": "want no argument", "members": "want no argument",
}

func cacheServe(ctx context.Context, fs *flag.FlagSet, addr *string, args []string, stderr io.Writer) int {
	dir := fs.String("dir", "", "data directory (default: gowarp/cache under the user's cache directory)")
	block := fs.String("block", "4MiB", "block size (a new data directory only)")
	budget := fs.String("budget", "1GiB", "bytes of blocks in memory at once; the rest are paged out to their files")
	maxValue := fs.String("max-value", "0", "largest value (0: 64 MiB, or what 64 blocks hold if less)")
	sf := addServeClusterFlags(fs)
	httpAddr := fs.String("http", "", "serve the status page (/) and Prometheus metrics (/metrics) on `host:port` (off if empty; port 0 picks one)")
	cpuprof := fs.String("cpuprofile", "", "write a CPU profile of the server to `FILE` (go tool pprof reads it) until it stops")
	procs := fs.Int("procs", 0, "the Go processors (GOMAXPROCS) the server runs on: on a host it shares with busy clients, its share of the CPUs (cache bench gives it half); 0: Go's default")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	bs, err1 := parseSize(*block)
	bu, err2 := parseSize(*budget)
	mv, err3 := parseSize(*maxValue)
	if err := errors.Join(err1, err2, err3); err != nil || fs.NArg() > 0 || *procs < 0 {
		fmt.Fprintln(stderr, "gowarp cache serve: bad flags", err)
		return exitUsage
	}
	if *procs > 0 {
		// A server whose connections' goroutines may run on every CPU of
		// a host its clients also keep busy competes with them for those
		// CPUs (why it costs this much is not known: cross-CPU wake-ups
		// are a guess): on 2 CPUs, 4 KiB ReadAt at 16 in flight from
		// another process made 140 k ops/s (p50 58 µs, p99 2.1 ms) on
		// Go's default and 166 k (p50 38 µs, p99 0.8 ms) with -procs 1,
		// medians of 5 interleaved rounds.
		runtime.GOMAXPROCS(*procs)
	}
	stopProf, err := startProfiles(*cpuprof, "")
	if err != nil {
		fmt.Fprintln(stderr, "gowarp cache serve:", err)
		return exitUsage
	}
	defer stopProf()
	log := slog.New(slog.NewTextHandler(stderr, nil))
	mon, err := monitor.New(monitor.Options{Name: *addr, Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, "gowarp cache serve:", err)
		return exitFailure
	}
	o := cache.ServerOptions{Dir: *dir, BlockSize: bs, Budget: bu, MaxValue: mv, Device: gowarp.Open(gowarp.WithLogger(log)), Logger: log}
	if *httpAddr != "" {
		o.OnRequest = mon.Observe
	}
	srv, err := cache.NewServer(o)
	if err != nil {
		fmt.Fprintln(stderr, "gowarp cache serve:", err)
		return exitFailure
	}
	ln, err := srv.Listen(*addr)
	if err != nil {
		srv.Close()
		fmt.Fprintln(stderr, "gowarp cache serve:", err)
		return exitFailure
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var httpDone chan error
	httpListen := ""
	if *httpAddr != "" {
		mon.Attach(srv)
		hln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", *httpAddr)
		if err != nil {
			srv.Close()
			fmt.Fprintln(stderr, "gowarp cache serve: -http:", err)
			return exitFailure
		}
		httpListen = hln.Addr().String()
		log.Info("cache: status page and metrics", "url", "http://"+httpListen+"/")
		httpDone = make(chan error, 1)
		go func() { httpDone <- mon.Serve(ctx, hln) }()
	}
	// Serve before joining: the join reconciles this server's keys
	// through its own listener.
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(ctx, ln) }()
	if sf.on() {
		leave, err := joinCluster(ctx, sf, ln.Addr().String(), httpListen, log)
		if err != nil {
			cancel()
			<-serveDone
			if httpDone != nil {
				<-httpDone
			}
			srv.Close()
			fmt.Fprintln(stderr, "gowarp cache serve: cluster:", err)
			return exitFailure
		}
		defer leave()
	}
	st := srv.Stats()
	log.Info("cache: serving", "addr", ln.Addr().String(), "procs", runtime.GOMAXPROCS(0), "dir", srv.Dir(), "keys", st.Keys, "blocks", st.Blocks, "resident", st.Resident)
	err = <-serveDone
	cancel()
	if httpDone != nil {
		if herr := <-httpDone; err == nil {
			err = herr
		}
	}
	if cerr := srv.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(stderr, "gowarp cache serve:", err)
		return exitFailure
	}
	return exitOK
}

func cachePut(ctx context.Context, cl *cache.Client, key, file string, durable bool, bar *bar) error {
	defer bar.done()
	var v []byte
	var err error
	if file == "" || file == "-" {
		v, err = io.ReadAll(os.Stdin)
	} else {
		v, err = os.ReadFile(file)
	}
	if err != nil {
		return err
	}
	return cl.Put(ctx, key, v, cache.PutOptions{Durable: durable, Progress: bar.set})
}

func cacheGet(ctx context.Context, cl *cache.Client, key, file string, stdout io.Writer, bar *bar) error {
	v, err := cl.GetInto(ctx, key, nil, cache.GetOptions{Progress: bar.set})
	bar.done()
	if err != nil {
		return err
	}
	if file == "" || file == "-" {
		_, err = stdout.Write(v)
		return err
	}
	return os.WriteFile(file, v, 0o644)
}

func printStats(w io.Writer, st cache.Stats, asJSON bool) {
	if asJSON {
		json.NewEncoder(w).Encode(st)
		return
	}
	fmt.Fprintf(w, "keys %d (%s), blocks %d of %s, %d resident (budget %s)\n", st.Keys, fmtSize(int64(st.Bytes)),
		st.Blocks, fmtSize(int64(st.BlockSize)), st.Resident, fmtSize(int64(st.Budget)))
	fmt.Fprintf(w, "puts %d (%d durable, %s in), gets %d (%d hits, %d misses, %s inline), deletes %d\n",
		st.Puts, st.DurablePuts, fmtSize(int64(st.BytesIn)), st.Gets, st.Hits, st.Misses, fmtSize(int64(st.BytesOut)), st.Deletes)
	fmt.Fprintf(w, "page-ins %d, page-outs %d, errors %d, clients %d\n", st.PageIns, st.PageOuts, st.Errors, st.Conns)
	if st.IndexBuckets > 0 {
		fmt.Fprintf(w, "index %d of %d buckets used, %d updates, %d removes, %d not indexed, %d one-sided reads, %d misses\n",
			st.IndexEntries, st.IndexBuckets, st.IndexUpdates, st.IndexRemoves, st.IndexOverflow, st.IndexReads, st.IndexMisses)
	}
}

// parseSize reads a size: a number with an optional K, M, G (powers of
// two, with or without iB).
func parseSize(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mul := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mul, t = 1<<10, t[:n-1]
		case 'M':
			mul, t = 1<<20, t[:n-1]
		case 'G':
			mul, t = 1<<30, t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mul {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return v * mul, nil
}

func fmtSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// bar is a byte progress bar on a terminal, drawn at most every
// progressTick; nil (not a terminal, or -q) draws nothing.
type bar struct {
	w     io.Writer
	what  string
	mu    sync.Mutex
	last  time.Time
	shown bool
}

func newBar(w io.Writer, quiet bool, what string) *bar {
	if quiet || !isTerminal(w) {
		return nil
	}
	return &bar{w: w, what: what}
}

func (b *bar) set(done, total int64) {
	if b == nil || total <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if now := time.Now(); now.Sub(b.last) >= progressTick || done == total {
		b.last = now
		const width = 30
		k := int(done * width / total)
		fmt.Fprintf(b.w, "\r\033[K%s [%s%s] %s / %s %3d%%", b.what, strings.Repeat("#", k), strings.Repeat(".", width-k),
			fmtSize(done), fmtSize(total), done*100/total)
		b.shown = true
	}
}

func (b *bar) done() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.shown {
		fmt.Fprint(b.w, "\r\033[K")
		b.shown = false
	}
}

func cacheBench(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) int {
	dur := fs.Duration("duration", 2*time.Second, "time per case")
	conc := fs.String("c", "16", "goroutines of the 4 KiB cases (the same for memcached and gowarp): `N[,N...]`, each in turn")
	largeConc := fs.Int("large-c", 2, "goroutines of the 1 MiB cases (0: none run)")
	conns := fs.Int("conns", 0, "the gowarp client's connections (0: 2)")
	keys := fs.Int("keys", 1000, "4 KiB values preloaded (1 MiB: a hundredth, at least 8)")
	mcBin := fs.String("memcached", "memcached", "the memcached binary (scripts/memcached installs Debian's)")
	rounds := fs.Int("rounds", 1, "repeat every case `N` times, the systems taking turns, and report each one's median round")
	asJSON := fs.Bool("json", false, "print one JSON object per result")
	systems := fs.String("systems", "", "run only these systems' cases: `NAME[,NAME...]` (memcached, gowarp-readat, gowarp-perf…; default all)")
	cpuprof := fs.String("cpuprofile", "", "write a CPU profile of this process (the clients; the server too with -in-process) to `FILE`, and the server process's to FILE.server")
	inProc := fs.Bool("in-process", false, "run the cache server in this process rather than in a process of its own (as memcached is)")
	srvProcs := fs.Int("server-procs", max(1, runtime.NumCPU()/2), "the cache server process's -procs: its share of the CPUs it shares with this process's clients (memcached runs its default 4 threads, its best here)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	var concs []int
	for _, f := range strings.Split(*conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			concs = nil
			break
		}
		concs = append(concs, n)
	}
	if fs.NArg() > 0 || *rounds < 1 || len(concs) == 0 || *largeConc < 0 || *keys < 1 || *conns < 0 || *srvProcs < 0 {
		fs.Usage()
		return exitUsage
	}
	cfg := cachebench.Config{Duration: *dur, Concurrency: concs, LargeConc: cmp.Or(*largeConc, -1), Keys: *keys, Conns: *conns, Memcached: *mcBin, Rounds: *rounds,
		Log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if *systems != "" {
		for _, s := range strings.Split(*systems, ",") {
			cfg.Systems = append(cfg.Systems, strings.TrimSpace(s))
		}
	}
	if !*inProc {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintln(stderr, "gowarp cache bench:", err)
			return exitFailure
		}
		cfg.ServerCmd = []string{exe, "cache", "serve", "-procs", strconv.Itoa(*srvProcs)}
		if *cpuprof != "" {
			cfg.ServerCmd = append(cfg.ServerCmd, "-cpuprofile", *cpuprof+".server")
		}
	}
	stopProf, err := startProfiles(*cpuprof, "")
	if err != nil {
		fmt.Fprintln(stderr, "gowarp cache bench:", err)
		return exitUsage
	}
	defer stopProf()
	enc := json.NewEncoder(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	if !*asJSON {
		fmt.Fprintln(tw, "system\tsize\tconc\tops/s\tMB/s\tmean µs\tp50 µs\tp99 µs\tCPU µs/op\t")
	}
	err = cachebench.Run(ctx, cfg, func(r cachebench.Result) {
		if *asJSON {
			enc.Encode(r)
			return
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", r.System, fmtSize(int64(r.Size)), r.Concurrency, r.OpsPerSec, r.MBps, r.Meanus, r.P50us, r.P99us, r.CPUus)
		fmt.Fprint(stderr, ".")
	})
	if !*asJSON {
		fmt.Fprintln(stderr)
	}
	tw.Flush()
	if err != nil {
		fmt.Fprintln(stderr, "gowarp cache bench:", err)
		return exitFailure
	}
	return exitOK
}
