// Command gowarp is the gowarp tool box.
//
//	gowarp perf [flags]       bandwidth and latency of RDMA Write, Read and Send vs plain TCP
//	gowarp ping [flags]       rping's protocol, as client or server
//	gowarp perftest [flags]   perftest's -R exchange, against rdma-core's ib_* tools
//	gowarp rpc bench [flags]  RPC over gowarp next to gRPC-go
//	gowarp qpmem [flags]      memory and goroutines per connected queue pair
//	gowarp version            the module version and VCS revision it was built from
//
// Run "gowarp <command> -h" for a command's flags. Exit status: 0 when the
// command did its work, 1 when it failed, 2 for a usage error.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// Exit statuses, the same for every command.
const (
	exitOK      = 0 // the command did its work (or -h printed its usage)
	exitFailure = 1 // it ran and failed: a test, a connection, a mismatch
	exitUsage   = 2 // bad flags or arguments: nothing was run
)

// command is one subcommand. run gets the arguments after the command's
// name; it returns the process's exit status.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands holds the subcommands; each file adds its own in an init function.
var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	if _, dup := commands[name]; dup {
		panic("gowarp: command registered twice: " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(stderr)
		return exitOK
	case "help":
		// "gowarp help perf" is "gowarp perf -h".
		if len(args) == 1 {
			usage(stderr)
			return exitOK
		}
		args = []string{args[1], "-h"}
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "gowarp: unknown command %q\n", args[0])
		usage(stderr)
		return exitUsage
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: gowarp <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
	fmt.Fprint(w, `
Run "gowarp <command> -h" (or "gowarp help <command>") for a command's flags.

exit status:
  0  the command did its work (and -h)
  1  it ran and failed: a test, a connection, a data mismatch
  2  usage error: unknown command, bad flag or argument; nothing was run
`)
}

// newFlagSet is a subcommand's flag set: errors and -h go to stderr, as
// usage followed by every flag (printFlags).
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		printFlags(fs)
	}
	return fs
}

// parseInterleaved parses fs's flags wherever they sit among args, as
// users type them ("get KEY -addr host:port", perftest's "TEST -s 8
// HOST"), and returns the other arguments in order; after "--" every
// argument is one. The flag package alone stops at the first argument
// that is not a flag.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// printFlags writes every flag of fs with its default, unlike
// flag.PrintDefaults, which leaves out zero defaults (false, 0, "") and so
// hides what a flag does when it is not given.
func printFlags(fs *flag.FlagSet) {
	w := fs.Output()
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		fmt.Fprintln(w, "  none")
	}
	fs.VisitAll(func(f *flag.Flag) {
		name, help := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if name != "" {
			line += " " + name
		}
		help = strings.ReplaceAll(help, "\n", "\n    \t")
		fmt.Fprintf(w, "%s\n    \t%s", line, help)
		// A Func flag has no default value of its own; its usage says it.
		if !strings.Contains(help, "default") {
			def := f.DefValue
			if def == "" {
				def = `""`
			}
			fmt.Fprintf(w, " (default %s)", def)
		}
		fmt.Fprintln(w)
	})
}
