package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/perftest"
)

func init() {
	register("perftest", "perftest's -R tests both ways: client or server of ib_{write,read,send}_{bw,lat}", perftestMain)
}

const perftestUsage = `usage: gowarp perftest [flags] TEST [HOST[:PORT]]

TEST is write_bw, read_bw, send_bw, write_lat, read_lat or send_lat:
linux-rdma/perftest's tests over rdma_cm (-R). With a HOST, gowarp is the
client of a perftest server ("ib_write_lat -R" on the other machine, for
instance siw's); without one it is the server that a perftest client
("ib_write_lat -R HOST") runs against, serving one run and exiting:

  gowarp perftest write_lat                 # then: ib_write_lat -R HOST
  gowarp perftest -s 65536 write_bw 10.0.0.2  # against: ib_write_bw -R

It speaks perftest's -R control exchange as perftest 4.5-0.17 ("6.06")
does and prints perftest's table: the bandwidth tests' figures (the
write_bw and read_bw servers print the client's, as perftest's do) or the
latency tests' (one-way for write_lat and send_lat, the round trip for
read_lat, which only its client measures). Give both sides the same -s,
-n, -q, -b and --all (and -D to send_bw and the latency tests), as with perftest: a send_bw server posts receives for exactly -n
messages, and iWARP has no receiver-not-ready retry.

flags:
`

func perftestMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("perftest", perftestUsage, stderr)
	var o perftest.Options
	test := fs.String("test", "", "`test`: write_bw, read_bw, send_bw, write_lat, read_lat or send_lat (or the first argument)")
	client := fs.String("client", "", "server `ADDR` to run against (host or host:port; or the last argument); none: serve")
	bind := fs.String("a", "", "server: listen on `ADDR` (host, or host:port; all interfaces when empty)")
	port := fs.Int("p", perftest.DefaultPort, "`port` to connect to or listen on when the address has none")
	fs.Var((*perftestSize)(&o.Size), "s", "message size in `bytes`, or with K or M for KiB or MiB as perftest's (0: perftest's, 65536 for bw, 2 for lat; --all runs every size whatever -s says, as perftest's -a)")
	// Flags of perftest's command lines that mean nothing here, taken so
	// that one pasted from a perftest run works.
	fs.Bool("R", true, "accepted for perftest's command lines: gowarp always connects with rdma_cm (perftest's -R)")
	fs.Bool("F", false, "accepted for perftest's command lines: gowarp reads no CPU frequency to warn about (perftest's -F)")
	fs.String("d", "", "accepted for perftest's command lines: the RDMA `device` (perftest's -d, --ib-dev); gowarp runs over the host's TCP")
	fs.Int("i", 1, "accepted for perftest's command lines: the device's `port` (perftest's -i)")
	fs.Int("x", 0, "accepted for perftest's command lines: the GID `index` (perftest's -x); gowarp uses the address given")
	conn := fs.String("c", "RC", "connection `type` (perftest's -c): RC, the only one iWARP has")
	fs.BoolVar(&o.All, "all", false, "run every size from 2 B to 8 MiB, doubling (perftest's -a, --all; gowarp's -a is the address)")
	fs.IntVar(&o.Iters, "n", 0, "`iterations` (0: perftest's, 5000 for write_bw, 1000 otherwise)")
	fs.IntVar(&o.QPs, "q", 1, "write_bw and read_bw: `N` data connections, each with its own queue pair (perftest's -q; give both sides the same)")
	secs := fs.Int("D", 0, "run for `seconds` instead of -n messages, measuring between margins of a quarter of it (perftest's -D; write_bw's and read_bw's server needs none unless -b, send_bw's and the latency tests' both sides do)")
	fs.BoolVar(&o.Duplex, "b", false, "write_bw and read_bw: bidirectional, both sides Writing or Reading at once, each printing both ways' figures added to its own count (perftest's -b; give both sides, and -D to both if any)")
	fs.BoolVar(&o.NoPeak, "N", false, "bandwidth clients: no peak, reported as 0 (perftest's -N, --noPeak)")
	fs.StringVar(&o.Output, "output", "", "print only these `units`, a number a line, instead of the table: bandwidth or message_rate (bandwidth tests), latency (the average; latency tests) (perftest's --output=<units>)")
	fs.BoolVar(&o.Gbits, "report_gbits", false, "report bandwidth in Gb/s, not MB/s (perftest's --report_gbits; a server prints the client's figures in its own unit, as perftest's does)")
	fs.IntVar(&o.TxDepth, "t", perftest.DefaultTxDepth, "bandwidth clients: work requests outstanding (tx depth)")
	fs.IntVar(&o.RxDepth, "r", perftest.DefaultRxDepth, "send tests: rx depth (perftest -r; at most -n)")
	fs.DurationVar(&o.Settle, "settle", 0, "client: wait after the control connection before the first message (perftest's client waits 1 s;\ngowarp needs no wait: its queue pair wakes a siw server that missed the first message)")
	fs.BoolVar(&o.Connect.CRC, "crc", false, "ask for MPA CRC32c on both connections (a server turns it on in its reply)")
	fs.IntVar(&o.Connect.MPARevision, "mpa-rev", 2, "client: MPA revision, 1 or 2")
	p2p := fs.Bool("p2p", false, "client: offer MPA peer-to-peer mode (perftest on siw does not)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	verbose := fs.Bool("v", false, "log each protocol step to stderr")
	debug := fs.Bool("debug", false, "log gowarp's connection events and protocol errors to stderr (-d is perftest's device)")
	// perftest puts the test first and the host last; flags may sit
	// between.
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	for _, p := range pos {
		switch {
		case *test == "" && (strings.HasSuffix(p, "_bw") || strings.HasSuffix(p, "_lat")):
			*test = p
		case *client == "":
			*client = p
		default:
			fmt.Fprintf(stderr, "gowarp perftest: unexpected argument %q\n", p)
			fs.Usage()
			return exitUsage
		}
	}
	o.Test = perftest.Test(*test)
	if *secs < 0 {
		fmt.Fprintf(stderr, "gowarp perftest: -D %d: a duration is positive\n", *secs)
		return exitUsage
	}
	if *conn != "RC" {
		fmt.Fprintf(stderr, "gowarp perftest: -c %s: iWARP has reliable connections (RC) only\n", *conn)
		return exitUsage
	}
	if o.QPs < 1 {
		fmt.Fprintf(stderr, "gowarp perftest: -q %d: at least one queue pair\n", o.QPs)
		return exitUsage
	}
	o.Duration = time.Duration(*secs) * time.Second
	if o.Test == "" {
		fmt.Fprintln(stderr, "gowarp perftest: give a test")
		fs.Usage()
		return exitUsage
	}
	// perftest's defaults, filled in here so that a bad value is a usage
	// error and the table shows what ran.
	if err := perftest.Fill(&o); err != nil {
		perftestErr(stderr, err)
		return exitUsage
	}
	o.Connect.NoP2P = !*p2p
	if *verbose {
		o.Log = stderr
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *debug {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	dev := gowarp.Open(gowarp.WithLogger(logger))
	withPort := func(addr string) string {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return net.JoinHostPort(addr, strconv.Itoa(*port))
		}
		return addr
	}
	var r *perftest.Result
	if *client != "" {
		o.Addr = withPort(*client)
		r, err = perftest.Run(ctx, dev, o)
	} else {
		ln, lerr := dev.Listen(withPort(*bind))
		if lerr != nil {
			fmt.Fprintln(stderr, "gowarp perftest:", lerr)
			return exitFailure
		}
		defer ln.Close()
		if !*asJSON && o.Output == "" {
			fmt.Fprintf(stdout, "gowarp perftest %s: waiting for a client on %v\n", o.Test, ln.Addr())
		}
		r, err = perftest.Serve(ctx, dev, ln, o)
	}
	if err != nil {
		perftestErr(stderr, err)
		return exitFailure
	}
	if *asJSON {
		b, _ := json.Marshal(r.JSON(&o))
		fmt.Fprintln(stdout, string(b))
		return exitOK
	}
	if o.Output != "" {
		r.WriteOutput(stdout, &o)
		return exitOK
	}
	r.WriteTable(stdout, &o)
	return exitOK
}

// perftestErr prints err after the command's name, once: the package's
// own errors already begin with "perftest: ".
func perftestErr(w io.Writer, err error) {
	fmt.Fprintln(w, "gowarp perftest:", strings.TrimPrefix(err.Error(), "perftest: "))
}

// perftestSize is perftest's -s: a number (decimal, or 0x hexadecimal, as
// strtol with base 0 reads it), times 1024 after a K and 1024² after an M.
type perftestSize int

func (z *perftestSize) String() string { return strconv.Itoa(int(*z)) }

func (z *perftestSize) Set(s string) error {
	f := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		s, f = s[:len(s)-1], 1<<10
	case strings.HasSuffix(s, "M"):
		s, f = s[:len(s)-1], 1<<20
	}
	n, err := strconv.ParseInt(s, 0, 32)
	if err != nil || n < 0 || n*f > math.MaxInt32 {
		return fmt.Errorf("want a size in bytes, or with K or M (perftest's -s)")
	}
	*z = perftestSize(n * f)
	return nil
}
