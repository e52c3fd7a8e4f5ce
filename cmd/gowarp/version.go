package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

func init() {
	register("version", "the module version and VCS revision this gowarp was built from", versionMain)
}

const versionUsage = `usage: gowarp version

Prints the module version of gowarp, the VCS revision and time of the
commit it was built from (with "modified" if the tree had uncommitted
changes), and the Go toolchain. "go build" records the revision when it
builds in a git checkout; "go run", -buildvcs=false and "go install
module@version" leave it out, and it then says so.

flags:
`

func versionMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", versionUsage, stderr)
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gowarp version: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Fprintln(stderr, "gowarp version: this binary carries no build information")
		return exitFailure
	}
	writeVersion(stdout, bi)
	return exitOK
}

// writeVersion writes what bi says of gowarp's own module and revision.
func writeVersion(w io.Writer, bi *debug.BuildInfo) {
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	fmt.Fprintf(w, "gowarp %s\n", bi.Main.Version)
	fmt.Fprintf(w, "module   %s\n", bi.Main.Path)
	if rev := settings["vcs.revision"]; rev != "" {
		state := ""
		if settings["vcs.modified"] == "true" {
			state = ", modified"
		}
		fmt.Fprintf(w, "revision %s (%s%s)\n", rev, settings["vcs.time"], state)
	} else {
		fmt.Fprintln(w, "revision unknown (not recorded: built by go run, with -buildvcs=false, or outside a checkout)")
	}
	fmt.Fprintf(w, "go       %s %s/%s\n", bi.GoVersion, runtime.GOOS, runtime.GOARCH)
}
