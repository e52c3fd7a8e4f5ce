package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/rping"
)

func init() {
	register("ping", "rping's protocol, as client or server, against rdma-core's rping or gowarp", pingMain)
}

const pingUsage = `usage: gowarp ping -s [-vVP] [-S size] [-C count] [-a addr] [-p port]
       gowarp ping -c [-vV] [-S size] [-C count] [-I addr] -a addr [-p port]

Speaks rdma-core's rping protocol, so either side may be rping on the
Linux kernel's siw (rping -s / rping -c) or another gowarp ping. Per ping
the client advertises its start buffer, the server RDMA-Reads it, the
client advertises its sink buffer, the server RDMA-Writes the data back,
each step answered by a "go ahead" Send; -V compares the buffers.

Like rping, the client asks for IRD = ORD = 1 and no peer-to-peer mode;
-crc, -mpa-rev, -p2p, -ird/-ord and -pd change that. A client exits 1 on
any failure or data mismatch.

flags:
`

func pingFlags(stderr io.Writer) (*flag.FlagSet, *pingConfig) {
	c := &pingConfig{}
	fs := newFlagSet("ping", pingUsage, stderr)
	fs.BoolVar(&c.server, "s", false, "server side")
	fs.BoolVar(&c.client, "c", false, "client side")
	fs.StringVar(&c.addr, "a", "", "`address`: to listen on (server; default all) or to connect to (client)")
	fs.StringVar(&c.source, "I", "", "client: source `address` to connect from (default: the system's choice)")
	fs.IntVar(&c.port, "p", rping.DefaultPort, "`port`")
	fs.IntVar(&c.count, "C", 0, "ping `count` times (0: until interrupted; a server serves until the client leaves)")
	fs.IntVar(&c.size, "S", rping.DefaultSize, fmt.Sprintf("ping data `size` (%d to %d)", rping.MinSize, rping.MaxSize))
	fs.BoolVar(&c.verbose, "v", false, "display ping data")
	fs.BoolVar(&c.validate, "V", false, "validate ping data (client)")
	fs.BoolVar(&c.persistent, "P", false, "persistent server: serve many clients, one goroutine each")
	fs.BoolVar(&c.quiet, "q", false, "no summary line")
	fs.BoolVar(&c.conn.CRC, "crc", false, "ask for MPA CRC32c (client in the request, server in the reply)")
	fs.IntVar(&c.conn.MPARevision, "mpa-rev", 2, "MPA revision the client asks for, 1 or 2")
	fs.BoolVar(&c.p2p, "p2p", false, "client offers MPA peer-to-peer mode with a ready-to-receive message")
	fs.IntVar(&c.conn.IRD, "ird", 1, "inbound RDMA Reads the client allows (rping: 1; the server reads from the client; 0: none)")
	fs.IntVar(&c.conn.ORD, "ord", 1, "outbound RDMA Reads the client asks for (rping: 1; 0: none)")
	fs.IntVar(&c.pd, "pd", 0, "send `N` bytes of private data in the MPA request (at most 252 to interoperate with siw)")
	fs.BoolVar(&c.debug, "d", false, "log connection events and protocol errors to stderr")
	fs.DurationVar(&c.nudge, "nudge", 200*time.Millisecond, "client: while the server has sent nothing, send a zero-length RDMA Write after this long of quiet\n(siw's server can miss a message that arrives while it accepts; gowarp.ConnectOptions.NoNudge; 0: never)")
	return fs, c
}

type pingConfig struct {
	server, client, verbose, validate, persistent, quiet, p2p, debug bool
	addr, source                                                     string
	port, count, size, pd                                            int
	conn                                                             gowarp.ConnectOptions
	nudge                                                            time.Duration
}

// splitShortFlags turns rping-style clusters of boolean flags ("-vV",
// "-sP") into separate flags for the flag package.
func splitShortFlags(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' && strings.Trim(a[1:], "scvVPqd") == "" {
			for _, r := range a[1:] {
				out = append(out, "-"+string(r))
			}
			continue
		}
		out = append(out, a)
	}
	return out
}

func pingMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := pingFlags(stderr)
	if err := fs.Parse(splitShortFlags(args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || c.server == c.client {
		fmt.Fprintln(stderr, "gowarp ping: give exactly one of -s and -c, and no arguments")
		fs.Usage()
		return 2
	}
	if err := rping.CheckSize(c.size); err != nil {
		fmt.Fprintln(stderr, "gowarp ping:", err)
		return 2
	}
	if c.count < 0 {
		fmt.Fprintf(stderr, "gowarp ping: invalid count %d\n", c.count)
		return 2
	}
	c.conn.NoP2P = !c.p2p
	// On the command line 0 means none, as in rdma_cm's conn_param.
	for _, v := range []*int{&c.conn.IRD, &c.conn.ORD} {
		if *v <= 0 {
			*v = gowarp.NoReads
		}
	}
	c.conn.NudgeEvery, c.conn.NoNudge = c.nudge, c.nudge <= 0
	if c.pd > 0 {
		c.conn.PrivateData = bytes.Repeat([]byte{'g'}, c.pd)
	}
	var opts []gowarp.DeviceOption
	if c.debug {
		opts = append(opts, gowarp.WithLogger(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	} else {
		opts = append(opts, gowarp.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	}
	dev := gowarp.Open(opts...)
	var verbose io.Writer
	if c.verbose {
		verbose = stdout
	}
	addr := net.JoinHostPort(c.addr, strconv.Itoa(c.port))
	if c.client {
		if c.addr == "" {
			fmt.Fprintln(stderr, "gowarp ping: the client needs -a ADDR")
			return 2
		}
		r, err := rping.Ping(ctx, dev, addr, rping.ClientOptions{
			Size: c.size, Count: c.count, Validate: c.validate, Verbose: verbose, Connect: c.conn, Source: c.source})
		if err != nil && !(c.count == 0 && errors.Is(err, context.Canceled)) {
			fmt.Fprintf(stderr, "gowarp ping: client failed after %d pings: %v\n", r.Pings, err)
			return 1
		}
		if !c.quiet {
			summary(stdout, "client", addr, r)
		}
		return 0
	}
	if c.source != "" {
		fmt.Fprintln(stderr, "gowarp ping: -I is the client's source address; a server listens on -a")
		return 2
	}
	// The server takes the client's revision; what it may ask for is CRC.
	sconn := gowarp.ConnectOptions{CRC: c.conn.CRC}
	ln, err := dev.Listen(addr)
	if err != nil {
		fmt.Fprintln(stderr, "gowarp ping:", err)
		return 1
	}
	defer ln.Close()
	var log io.Writer
	if !c.quiet {
		log = stdout
	}
	o := rping.ServerOptions{Count: c.count, Verbose: verbose, Log: log, Connect: sconn}
	if c.persistent {
		if err := rping.Serve(ctx, dev, ln, true, o); err != nil {
			fmt.Fprintln(stderr, "gowarp ping: server:", err)
			return 1
		}
		return 0
	}
	req, err := ln.Accept(ctx)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return 0
		}
		fmt.Fprintln(stderr, "gowarp ping: server:", err)
		return 1
	}
	peer := req.RemoteAddr().String()
	r, err := rping.ServeConn(ctx, dev, req, o)
	if err != nil {
		fmt.Fprintf(stderr, "gowarp ping: server failed after %d pings: %v\n", r.Pings, err)
		return 1
	}
	if !c.quiet {
		summary(stdout, "server", peer, r)
	}
	return 0
}

func summary(w io.Writer, side, peer string, r rping.Result) {
	if r.Pings == 0 {
		fmt.Fprintf(w, "gowarp ping %s: %s: 0 pings\n", side, peer)
		return
	}
	avg := r.Elapsed / time.Duration(r.Pings)
	nudges := ""
	if r.Nudges > 0 {
		nudges = fmt.Sprintf(" (%d zero-length Writes to wake the server)", r.Nudges)
	}
	fmt.Fprintf(w, "gowarp ping %s: %s: %d pings, %v per ping on average, %v at best%s\n",
		side, peer, r.Pings, avg.Round(time.Microsecond), r.MinRTT.Round(time.Microsecond), nudges)
}
