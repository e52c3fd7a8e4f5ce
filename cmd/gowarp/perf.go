package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/perf"
)

func init() {
	register("perf", "bandwidth and latency of RDMA Write, Read and Send, and of plain TCP", perfMain)
}

const perfUsage = `usage: gowarp perf [flags]

Measures RDMA Write, Read and Send bandwidth and latency over gowarp, and
plain TCP over the same path as a floor. Without -server or -client, the
server and the client run in this process over 127.0.0.1.

With no flags it runs write_bw, read_bw, send_bw and tcp_bw at 64 KiB and
write_lat, read_lat, send_lat and tcp_lat at 8 bytes, 1 s each.

  gowarp perf -server :7174          serve until interrupted
  gowarp perf -client host:7174      run the tests against it
  gowarp perf -sweep -plot perf.svg  every test from 2 B to 1 MiB, drawn as curves
  gowarp perf -rounds 8              the tests 8 times over, then medians and ratios to TCP

The plain-TCP tests (tcp_bw, tcp_lat) use the port after ADDR's (7175
above); the server listens on both.

Tests: write_bw, read_bw, send_bw, tcp_bw (bandwidth: -depth requests
outstanding; MB/s = 10^6 bytes/s of payload) and write_lat, read_lat,
send_lat, tcp_lat (latency in µs: one way, half the round trip, for the
ping-pongs; the whole Read for read_lat), or all.

flags:
`

// perfConfig is what the flags say.
type perfConfig struct {
	tests    testList
	size     sizeFlag
	sweep    bool
	duration time.Duration
	iters    int
	rounds   int
	depth    int
	qps      int
	signal   int
	postList int
	json     bool
	plot     string
	server   string
	client   string
	verbose  bool
	cpuprof  string
	trace    string
	conn     perf.ConnOptions
}

func perfFlags(stderr io.Writer) (*flag.FlagSet, *perfConfig) {
	c := &perfConfig{}
	fs := newFlagSet("perf", perfUsage, stderr)
	fs.Var(&c.tests, "test", "test `NAME` to run; repeat or separate with commas; all for every test (default: the eight above)")
	fs.Var(&c.size, "size", "message size in `bytes` (K and M suffixes allowed; default 64K for bandwidth, 8 for latency)")
	fs.BoolVar(&c.sweep, "sweep", false, "run every size from 2 B to 1 MiB in powers of two")
	fs.DurationVar(&c.duration, "duration", time.Second, "length of each run (200ms per size with -sweep unless given)")
	fs.IntVar(&c.iters, "iters", 0, "run `N` messages or round trips instead of a -duration")
	fs.IntVar(&c.rounds, "rounds", 1, "run the tests `N` times, every other time in reverse order, and end with each one's median\nand its ratio to plain TCP's within a round (a host's speed drifts, and runs moments apart drift least)")
	fs.IntVar(&c.qps, "qps", 1, "run each bandwidth test on `N` connections at once, each with its own QP, CQ and waiting goroutine, and report their aggregate")
	fs.IntVar(&c.depth, "depth", perf.DefaultDepth, "work requests bandwidth tests keep outstanding (128 was the best overall on loopback)")
	fs.IntVar(&c.signal, "signal", 0, "bandwidth tests signal every `N`th work request (0: depth/4)")
	fs.IntVar(&c.postList, "post-list", perf.DefaultPostList, "bandwidth tests post `N` work requests per doorbell (QP.PostSendList), like perftest's --post_list; 1 posts them one by one")
	fs.BoolVar(&c.conn.CRC, "crc", false, "ask for MPA CRC32c on every FPDU")
	fs.IntVar(&c.conn.MPARevision, "mpa-rev", 2, "MPA revision, 1 or 2")
	fs.BoolVar(&c.json, "json", false, "print one JSON object per result instead of the table")
	fs.StringVar(&c.plot, "plot", "", "draw the results in `FILE` (.svg, .png or .pdf): bandwidth and latency against size per transport, and\neach one's ratio to plain TCP's; with -sweep, curves (see the README's)")
	fs.StringVar(&c.server, "server", "", "serve tests on `ADDR` (host:port) and plain TCP on port+1, until interrupted")
	fs.StringVar(&c.client, "client", "", "run the tests against the server at `ADDR` (host:port)")
	fs.BoolVar(&c.conn.AsyncOnly, "async", false, "transmit every post from the QP's transmit goroutine (QPConfig.AsyncOnly)")
	fs.Func("completion", "when signaled Sends and Writes complete: handed (the socket took them) or acked (the peer's TCP acknowledged them) (default handed)", func(s string) error {
		switch s {
		case "handed":
			c.conn.Completion = gowarp.Handed
		case "acked":
			c.conn.Completion = gowarp.Acked
		default:
			return errors.New("want handed or acked")
		}
		return nil
	})
	fs.BoolVar(&c.conn.SharedMemory, "shm", false, "offer a same-host shared-memory link (the server takes it whenever offered; the JSON's\ntransport says which link each run got); tcp_bw and tcp_lat stay plain TCP")
	fs.DurationVar(&c.conn.BusyPoll, "busy-poll", 0, "how long a receive that finds its TCP socket empty reads it again before it sleeps\n(ConnectOptions.BusyPoll; gowarp.DefaultBusyPoll is 100µs): lower latency, more CPU; 0 is off")
	fs.Var((*sizeFlag)(&c.conn.SharedMemoryRing), "shm-ring", "with -shm, the `bytes` of each direction's ring (K and M suffixes allowed; a power of two\nfrom 64K to 64M; default 1M)")
	fs.IntVar(&c.conn.MaxFPDU, "fpdu", 0, "size of full FPDUs on the wire in `bytes` (0: the TCP segment)")
	c.conn.Poll = defaultPoll
	fs.Func("cq", "how to wait: poll (busy Poll, sleeping 1µs between polls), wait (cq.Wait; the ping-pongs post from\n"+
		"QP.ProgressFunc), or each (cq.Wait, and the ping-pongs wait for each message with QP.Progress or\n"+
		"cq.Wait and post after it returns) (default "+waitName(defaultPoll, false)+")", func(s string) error {
		switch s {
		case "poll":
			c.conn.Poll, c.conn.Each = true, false
		case "wait":
			c.conn.Poll, c.conn.Each = false, false
		case "each":
			c.conn.Poll, c.conn.Each = false, true
		default:
			return errors.New("want poll, wait or each")
		}
		return nil
	})
	fs.BoolVar(&c.verbose, "v", false, "log session events")
	fs.StringVar(&c.cpuprof, "cpuprofile", "", "write a CPU profile of this process (client or server) to `FILE` (go tool pprof reads it)")
	fs.StringVar(&c.trace, "trace", "", "write an execution trace of this process to `FILE` (go tool trace reads it)")
	return fs, c
}

// defaultPoll: cq.Wait beat busy polling with runtime.Gosched on loopback
// everywhere: 64 KiB write_bw 1.57 vs 0.93 GB/s, read_bw 1.31 vs 0.55,
// send_bw 1.33 vs 0.34; 8 B read_lat p50/p99 26/64 vs 28/4000 µs,
// send_lat 14/34 vs 12/2000 µs (and 8600 µs p50 in one run). Busy pollers
// on every P keep the Go scheduler from polling the network: Gosched
// requeues them on the global run queue, served before the netpoller, so
// arrivals wait for sysmon's 10 ms poll. Poll mode now sleeps 1 µs between
// polls instead (internal/perf's waiter), which ends those tails (read_lat
// p99 71-78 µs in one process); waiting stays the default, as
// applications wait.
const defaultPoll = false

func waitName(poll, each bool) string {
	switch {
	case poll:
		return "poll"
	case each:
		return "each"
	}
	return "wait"
}

func perfMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := perfFlags(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "gowarp perf: "+format+"\n", a...)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return fail("unexpected arguments %q", fs.Args())
	case c.server != "" && c.client != "":
		return fail("-server and -client exclude each other")
	case c.sweep && explicit["size"]:
		return fail("-size and -sweep exclude each other")
	case c.qps < 1 || c.qps > perf.MaxQPs:
		return fail("-qps %d out of range [1, %d]", c.qps, perf.MaxQPs)
	case c.depth < 1 || c.depth > perf.MaxDepth:
		return fail("-depth %d out of range [1, %d]", c.depth, perf.MaxDepth)
	case c.conn.MPARevision != 1 && c.conn.MPARevision != 2:
		return fail("-mpa-rev %d: want 1 or 2", c.conn.MPARevision)
	case c.conn.BusyPoll < 0:
		return fail("-busy-poll %v: want 0 (off) or more", c.conn.BusyPoll)
	case c.iters < 0 || (c.iters == 0 && c.duration <= 0):
		return fail("need a positive -duration or -iters")
	case c.plot != "" && c.server != "":
		return fail("-plot draws a client's results; not with -server")
	case c.rounds < 1:
		return fail("-rounds %d: want 1 or more", c.rounds)
	case c.rounds > 1 && c.plot != "":
		return fail("-plot draws one run's results; not with -rounds")
	case c.rounds > 1 && c.server != "":
		return fail("-rounds is the client's; not with -server")
	}
	stop, err := startProfiles(c.cpuprof, c.trace)
	if err != nil {
		return fail("%v", err)
	}
	defer stop()
	var plotFormat string
	if c.plot != "" {
		var err error
		if plotFormat, err = perf.PlotFormat(c.plot); err != nil {
			return fail("%v", err)
		}
	}
	level := slog.LevelWarn
	if c.verbose {
		level = slog.LevelDebug
	}
	// The client's status line, if stderr is a terminal; log lines go
	// through it so they do not land in the middle of the line.
	var prog *progress
	if c.server == "" {
		prog = newProgress(stderr, c.json)
	}
	defer prog.close()
	log := slog.New(slog.NewTextHandler(prog.writer(stderr), &slog.HandlerOptions{Level: level}))
	if c.server != "" {
		return perfServe(ctx, c, log, stderr)
	}
	if c.sweep && !explicit["duration"] {
		c.duration = 200 * time.Millisecond
	}
	runs := c.runs()

	client := &perf.Client{Addr: c.client}
	where, plotWhere := "loopback", "loopback"
	if c.client == "" {
		lb, err := perf.StartLoopback(&perf.Server{Log: log, Conn: c.conn})
		if err != nil {
			fmt.Fprintf(stderr, "gowarp perf: %v\n", err)
			return 1
		}
		defer lb.Close()
		client = lb.Client
		where = "loopback " + lb.Addr
	} else {
		where = "client of " + c.client
		plotWhere = where
	}
	if !c.json {
		fmt.Fprintf(stdout, "# gowarp perf: %s, MPA rev %d, CRC %s, completion %s, async %t, fpdu %s, depth %d, cq %s, shm %s, busy poll %v\n",
			where, c.conn.MPARevision, onOff(c.conn.CRC), c.conn.Completion, c.conn.AsyncOnly,
			fpduName(c.conn.MaxFPDU), c.depth, waitName(c.conn.Poll, c.conn.Each), onOff(c.conn.SharedMemory), c.conn.BusyPoll)
		if c.qps > 1 {
			fmt.Fprintf(stdout, "# %d connections at once in write_bw, read_bw and send_bw (-qps); figures are their aggregate\n", c.qps)
		}
		perf.WriteTableHeader(stdout)
	}
	enc := json.NewEncoder(stdout)
	failed := 0
	var rounds [][]perf.Result
	prog.setTotal(len(runs) * c.rounds)
	for round := 1; round <= c.rounds; round++ {
		order := runs
		if round%2 == 0 {
			// Every other round backwards: each test is bracketed by the
			// others, so a drifting host weighs on them alike.
			order = slices.Clone(runs)
			slices.Reverse(order)
		}
		if c.rounds > 1 && !c.json {
			prog.print(func() { fmt.Fprintf(stdout, "# round %d of %d\n", round, c.rounds) })
		}
		var these []perf.Result
		for i, r := range order {
			prog.begin((round-1)*len(runs)+i+1, fmt.Sprintf("%s %s", r.test, sizeName(r.size)))
			res, err := c.runOne(ctx, client, r)
			if err != nil {
				if ctx.Err() != nil {
					prog.print(func() { fmt.Fprintln(stderr, "gowarp perf: interrupted") })
					return exitFailure
				}
				prog.print(func() { fmt.Fprintf(stderr, "gowarp perf: %v\n", err) })
				failed++
				continue
			}
			if c.rounds > 1 {
				res.Round = round
			}
			these = append(these, res)
			prog.print(func() {
				if c.json {
					enc.Encode(res)
				} else {
					perf.WriteTableRow(stdout, res)
				}
			})
		}
		rounds = append(rounds, these)
	}
	if c.rounds > 1 {
		ss := perf.Summarize(rounds)
		prog.print(func() {
			if c.json {
				for _, s := range ss {
					enc.Encode(s)
				}
				return
			}
			fmt.Fprintf(stdout, "# medians of %d rounds\n", c.rounds)
			perf.WriteSummaries(stdout, ss)
		})
	}
	prog.close()
	if c.plot != "" {
		title := fmt.Sprintf("gowarp perf %s\n%s, MPA rev %d, CRC %s; %s, %d CPUs, %s/%s",
			strings.Join(args, " "), plotWhere, c.conn.MPARevision, onOff(c.conn.CRC),
			time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
		if err := writePlot(c.plot, plotFormat, slices.Concat(rounds...), title); err != nil {
			fmt.Fprintf(stderr, "gowarp perf: %v\n", err)
			return exitFailure
		}
		if !c.json {
			fmt.Fprintf(stdout, "# plot: %s\n", c.plot)
		}
	}
	if failed > 0 {
		return exitFailure
	}
	return exitOK
}

// runOne runs one test at one size as the flags say.
func (c *perfConfig) runOne(ctx context.Context, client *perf.Client, r run) (perf.Result, error) {
	o := perf.Options{ConnOptions: c.conn, Size: r.size, Depth: c.depth, SignalEvery: c.signal, PostList: c.postList,
		Iters: c.iters, Duration: c.duration}
	if c.qps > 1 && r.test.Bandwidth() && !r.test.TCP() {
		return client.RunParallel(ctx, r.test, o, c.qps)
	}
	return client.Run(ctx, r.test, o)
}

func writePlot(name, format string, results []perf.Result, title string) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := perf.WritePlot(f, format, results, title); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// sizeName writes a message size as the -size flag takes it.
func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func perfServe(ctx context.Context, c *perfConfig, log *slog.Logger, stderr io.Writer) int {
	srv := &perf.Server{Log: log, Conn: c.conn}
	ln, tln, err := perf.Listen(gowarp.Open(gowarp.WithLogger(log)), c.server)
	if err != nil {
		fmt.Fprintf(stderr, "gowarp perf: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "gowarp perf: serving iWARP on %s, plain TCP on %s\n", ln.Addr(), tln.Addr())
	if err := srv.Serve(ctx, ln, tln); err != nil {
		fmt.Fprintf(stderr, "gowarp perf: %v\n", err)
		return 1
	}
	return 0
}

type run struct {
	test perf.Test
	size int
}

// defaultTests is the set run with no -test: bandwidth at 64 KiB, latency at 8 B.
var defaultTests = []perf.Test{perf.WriteBW, perf.ReadBW, perf.SendBW, perf.TCPBW,
	perf.WriteLat, perf.ReadLat, perf.SendLat, perf.TCPLat}

func (c *perfConfig) runs() []run {
	tests := []perf.Test(c.tests)
	if len(tests) == 0 {
		tests = defaultTests
	}
	var runs []run
	for _, t := range tests {
		switch {
		case c.sweep:
			for s := 2; s <= 1<<20; s *= 2 {
				runs = append(runs, run{t, s})
			}
		case c.size > 0:
			runs = append(runs, run{t, int(c.size)})
		case t.Bandwidth():
			runs = append(runs, run{t, 64 << 10})
		default:
			runs = append(runs, run{t, 8})
		}
	}
	return runs
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func fpduName(n int) string {
	if n == 0 {
		return "auto"
	}
	return strconv.Itoa(n)
}

// testList is the value of -test: names, repeated or comma-separated.
type testList []perf.Test

func (l *testList) String() string {
	var s []string
	for _, t := range *l {
		s = append(s, t.String())
	}
	return strings.Join(s, ",")
}

func (l *testList) Set(v string) error {
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if name == "all" {
			*l = append(*l, perf.AllTests()...)
			continue
		}
		t, err := perf.ParseTest(name)
		if err != nil {
			return err
		}
		*l = append(*l, t)
	}
	return nil
}

// sizeFlag is a byte count with an optional K or M suffix (powers of 1024).
type sizeFlag int

func (s *sizeFlag) String() string { return strconv.Itoa(int(*s)) }

func (s *sizeFlag) Set(v string) error {
	mult := 1
	switch {
	case strings.HasSuffix(v, "K"), strings.HasSuffix(v, "k"):
		mult, v = 1<<10, v[:len(v)-1]
	case strings.HasSuffix(v, "M"), strings.HasSuffix(v, "m"):
		mult, v = 1<<20, v[:len(v)-1]
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > perf.MaxSize/mult {
		return fmt.Errorf("want a size from 1 to %d bytes", perf.MaxSize)
	}
	*s = sizeFlag(n * mult)
	return nil
}

// startProfiles starts the CPU profile and the execution trace the flags
// ask for (an empty name: none) and returns what stops them and closes
// their files.
func startProfiles(cpu, tr string) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if cpu != "" {
		f, err := os.Create(cpu)
		if err != nil {
			return stop, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return stop, err
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	if tr != "" {
		f, err := os.Create(tr)
		if err != nil {
			stop()
			return func() {}, err
		}
		if err := trace.Start(f); err != nil {
			f.Close()
			stop()
			return func() {}, err
		}
		stops = append(stops, func() { trace.Stop(); f.Close() })
	}
	return stop, nil
}
