package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gowarp/gowarp/internal/rpcbench"
)

func init() {
	register("rpc", "RPC over gowarp (package rpc): rpc bench compares it with gRPC-go", runRPC)
}

const rpcUsage = `usage: gowarp rpc bench [flags]

Measures package rpc (RPC over gowarp with call-by-reference) side by side
with gRPC-go (unary, raw-bytes codec) in one run over loopback, both ends in
this process: small calls at each concurrency, then calls with a large
argument of which the server reads a part (by reference for rpc, by value
for gRPC-go).

flags:
`

func runRPC(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("rpc bench", rpcUsage, stderr)
	dur := fs.Duration("duration", 2*time.Second, "time per case")
	conc := fs.String("c", "1,16,64", "concurrencies of small calls")
	small := fs.Int("small", 64, "small argument and result size in bytes")
	large := fs.Int("large", 1<<20, "large argument size in bytes")
	touch := fs.String("touch", "1,10,100", "percents (1-100) of the large argument the server reads")
	largeConc := fs.Int("large-c", 1, "concurrency of large calls")
	rounds := fs.Int("rounds", 1, "repeat every case `N` times, systems taking turns, and report medians")
	asJSON := fs.Bool("json", false, "print one JSON object per result")
	bench := len(args) > 0 && args[0] == "bench"
	if bench {
		args = args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	switch {
	case !bench:
		fs.Usage()
		return exitUsage
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "gowarp rpc bench: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	cs, err1 := ints(*conc)
	ts, err2 := ints(*touch)
	if err1 != nil || err2 != nil || slices.Max(ts) > 100 || *small < 1 || *large < 1 || *largeConc < 1 || *rounds < 1 {
		fmt.Fprintln(stderr, "gowarp rpc bench: bad flags")
		return exitUsage
	}
	cfg := rpcbench.Config{Duration: *dur, Concurrency: cs, Small: *small, Large: *large, Touch: ts, LargeConc: *largeConc, Rounds: *rounds}
	var results []rpcbench.Result
	enc := json.NewEncoder(stdout)
	err := rpcbench.Run(ctx, cfg, func(r rpcbench.Result) {
		if *asJSON {
			enc.Encode(r)
		} else {
			fmt.Fprintf(stderr, ".")
		}
		results = append(results, r)
	})
	if !*asJSON {
		fmt.Fprintln(stderr)
		printRPCTable(stdout, results)
	}
	if err != nil {
		fmt.Fprintln(stderr, "gowarp rpc bench:", err)
		return exitFailure
	}
	return exitOK
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad number %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// printRPCTable prints each case's systems side by side with gRPC-go's.
func printRPCTable(w io.Writer, rs []rpcbench.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tc\tsystem\tcalls/s\tp50 µs\tp99 µs\tbytes/call\tvs gRPC rate\tvs gRPC p50\t")
	var base rpcbench.Result
	for _, r := range rs {
		if r.System == "grpc-go" {
			base = r
		}
		name := r.Case
		if r.Case == "large" {
			name = fmt.Sprintf("large %d%%", r.Touch)
		}
		ratio, lat := "", ""
		if r.System != "grpc-go" && base.Rate > 0 {
			ratio = fmt.Sprintf("%.2fx", r.Rate/base.Rate)
			lat = fmt.Sprintf("%.2fx", r.P50/base.P50)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f\t%.1f\t%.1f\t%.0f\t%s\t%s\t\n", name, r.Concurrency, r.System, r.Rate, r.P50, r.P99, r.BytesPerCall, ratio, lat)
	}
	tw.Flush()
}
