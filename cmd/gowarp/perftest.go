package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/perftest"
)

func init() {
	register("perftest", "client of perftest's -R bandwidth servers (ib_write_bw, ib_read_bw, ib_send_bw)", perftestMain)
}

const perftestUsage = `usage: gowarp perftest [flags] write_bw|read_bw|send_bw HOST[:PORT]

The client side of linux-rdma/perftest's bandwidth tests over rdma_cm:
start "ib_write_bw -R" (or ib_read_bw, ib_send_bw) on the server, for
instance siw's, then run

  gowarp perftest -s 65536 -n 5000 write_bw 10.0.0.2

It speaks perftest's -R control exchange (version, parameters, keys,
reports) as perftest 4.5-0.17 ("6.06") does, connects the data queue pair,
runs the test and prints perftest's figures as measured here. For
write_bw and read_bw it sends them to the server, which prints them; for
send_bw the server measures and prints its own. Give the server's -n to
send_bw: its server posts exactly that many receives, and iWARP has no
receiver-not-ready retry.

flags:
`

func perftestMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("perftest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), perftestUsage)
		printFlags(fs)
	}
	var o perftest.Options
	test := fs.String("test", "", "`test`: write_bw, read_bw or send_bw (or the first argument)")
	client := fs.String("client", "", "server `ADDR` (host or host:port; or the last argument)")
	port := fs.Int("p", perftest.DefaultPort, "server `port` when the address has none")
	fs.IntVar(&o.Size, "s", perftest.DefaultSize, "message size in `bytes`")
	fs.IntVar(&o.Iters, "n", perftest.DefaultIters, "`iterations`")
	fs.IntVar(&o.TxDepth, "t", perftest.DefaultTxDepth, "work requests outstanding (tx depth)")
	fs.IntVar(&o.RxDepth, "r", perftest.DefaultRxDepth, "send_bw: the server's rx depth (perftest -r)")
	fs.DurationVar(&o.Settle, "settle", 0, "wait after the control connection before the first message (perftest's client waits 1 s;\ngowarp needs no wait: its queue pair wakes a siw server that missed the first message)")
	fs.BoolVar(&o.Connect.CRC, "crc", false, "ask for MPA CRC32c on both connections")
	fs.IntVar(&o.Connect.MPARevision, "mpa-rev", 2, "MPA revision, 1 or 2")
	p2p := fs.Bool("p2p", false, "offer MPA peer-to-peer mode (perftest on siw does not)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	verbose := fs.Bool("v", false, "log each protocol step to stderr")
	debug := fs.Bool("d", false, "log gowarp's connection events and protocol errors to stderr")
	// perftest puts the test first and the host last; flags may sit
	// between.
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	for _, p := range pos {
		switch {
		case *test == "" && strings.HasSuffix(p, "_bw"):
			*test = p
		case *client == "":
			*client = p
		default:
			fmt.Fprintf(stderr, "gowarp perftest: unexpected argument %q\n", p)
			fs.Usage()
			return 2
		}
	}
	o.Test = perftest.Test(*test)
	if o.Test == "" || *client == "" {
		fmt.Fprintln(stderr, "gowarp perftest: give a test and the server's address")
		fs.Usage()
		return 2
	}
	o.Addr = *client
	if _, _, err := net.SplitHostPort(o.Addr); err != nil {
		o.Addr = net.JoinHostPort(o.Addr, strconv.Itoa(*port))
	}
	o.Connect.NoP2P = !*p2p
	if *verbose {
		o.Log = stderr
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *debug {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r, err := perftest.Run(ctx, gowarp.Open(gowarp.WithLogger(logger)), o)
	if err != nil {
		fmt.Fprintln(stderr, "gowarp perftest:", err)
		return 1
	}
	if *asJSON {
		out := map[string]any{
			"test": o.Test, "size": r.Local.Size, "iters": r.Local.Iters,
			"bw_peak_MBps": r.Local.BWPeak, "bw_avg_MBps": r.Local.BWAvg, "msg_rate_Mpps": r.Local.MsgRateMpps,
			"server_version": r.ServerVersion,
		}
		if r.Remote.Plausible(o.Size) {
			out["server_report"] = map[string]any{"size": r.Remote.Size, "iters": r.Remote.Iters,
				"bw_peak_MBps": r.Remote.BWPeak, "bw_avg_MBps": r.Remote.BWAvg, "msg_rate_Mpps": r.Remote.MsgRateMpps}
		}
		b, _ := json.Marshal(out)
		fmt.Fprintln(stdout, string(b))
		return 0
	}
	const line = "---------------------------------------------------------------------------------------"
	names := map[perftest.Test]string{perftest.WriteBW: "RDMA_Write", perftest.ReadBW: "RDMA_Read", perftest.SendBW: "Send"}
	fmt.Fprintln(stdout, line)
	fmt.Fprintf(stdout, "                    %s BW Test (gowarp, against perftest %s at %s)\n", names[o.Test], r.ServerVersion, o.Addr)
	fmt.Fprintf(stdout, " TX depth        : %d\n", min(o.TxDepth, o.Iters))
	fmt.Fprintf(stdout, " MPA             : revision %d, CRC %s\n", o.Connect.MPARevision, map[bool]string{false: "off", true: "on"}[o.Connect.CRC])
	fmt.Fprintln(stdout, line)
	for _, d := range []struct {
		who string
		d   perftest.Dest
	}{{"local", r.ClientDest}, {"remote", r.ServerDest}} {
		fmt.Fprintf(stdout, " %s address: LID %#04x QPN %#06x PSN %#06x RKey %#08x VAddr %#016x\n",
			d.who, d.d.LID, d.d.QPN, d.d.PSN, d.d.RKey, d.d.VAddr)
	}
	fmt.Fprintln(stdout, line)
	fmt.Fprintln(stdout, perftest.ResultHeader)
	fmt.Fprintln(stdout, r.Local.Line())
	fmt.Fprintln(stdout, line)
	switch {
	case o.Test == perftest.SendBW:
		fmt.Fprintln(stdout, " the send_bw server measured the receive side itself and printed its figures there")
	case r.Remote.Plausible(o.Size):
		fmt.Fprintln(stdout, " server's report:")
		fmt.Fprintln(stdout, r.Remote.Line())
	default:
		fmt.Fprintln(stdout, " the server's report is uninitialised memory (perftest's write_bw and read_bw servers measure nothing);")
		fmt.Fprintln(stdout, " the server printed the figures above")
	}
	return 0
}
