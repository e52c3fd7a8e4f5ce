package main

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
)

func TestTopLevelUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{nil, exitUsage},
		{[]string{"-h"}, exitOK},
		{[]string{"--help"}, exitOK},
		{[]string{"help"}, exitOK},
		{[]string{"nosuchcommand"}, exitUsage},
	} {
		code, out, errs := runCmd(t, context.Background(), tc.args...)
		if code != tc.code {
			t.Errorf("gowarp %q: exit %d, want %d", tc.args, code, tc.code)
		}
		if out != "" {
			t.Errorf("gowarp %q wrote to stdout: %q", tc.args, out)
		}
		for _, want := range []string{"usage: gowarp <command>", "version", "exit status:", "  0 ", "  1 ", "  2 "} {
			if !strings.Contains(errs, want) {
				t.Errorf("gowarp %q: usage lacks %q:\n%s", tc.args, want, errs)
			}
		}
	}
}

// flagBlocks splits the flag list of a command's usage into one block per
// flag, keyed by name.
func flagBlocks(t *testing.T, usage string) map[string]string {
	t.Helper()
	_, list, ok := strings.Cut(usage, "\nflags:\n")
	if !ok {
		t.Fatalf("no flags section:\n%s", usage)
	}
	blocks := map[string]string{}
	name := ""
	start := regexp.MustCompile(`^  -([\w-]+)`)
	for _, l := range strings.Split(list, "\n") {
		if m := start.FindStringSubmatch(l); m != nil {
			name = m[1]
		}
		if name != "" {
			blocks[name] += l + "\n"
		}
	}
	return blocks
}

// TestCommandHelp asks every command for -h, as "gowarp CMD -h" and as
// "gowarp help CMD": usage on stderr, exit 0, every flag with its default;
// an unknown flag is a usage error, exit 2.
func TestCommandHelp(t *testing.T) {
	if len(commands) < 4 {
		t.Fatalf("only %d commands registered", len(commands))
	}
	for name := range commands {
		for _, args := range [][]string{{name, "-h"}, {name, "-help"}, {"help", name}} {
			code, out, errs := runCmd(t, context.Background(), args...)
			if code != exitOK || out != "" || !strings.HasPrefix(errs, "usage: gowarp "+name) {
				t.Errorf("gowarp %q: exit %d, stdout %q, stderr starts %.40q; want 0, usage on stderr", args, code, out, errs)
				continue
			}
			for flagName, block := range flagBlocks(t, errs) {
				if !strings.Contains(block, "default") {
					t.Errorf("gowarp %s: flag -%s shows no default:\n%s", name, flagName, block)
				}
			}
		}
		code, _, errs := runCmd(t, context.Background(), name, "-no-such-flag")
		if code != exitUsage || !strings.Contains(errs, "flag provided but not defined") {
			t.Errorf("gowarp %s -no-such-flag: exit %d, stderr %q; want 2", name, code, errs)
		}
	}
}

// TestHelpListsEveryFlag checks the flag list against the flag sets
// themselves, including the flags whose defaults flag.PrintDefaults hides.
func TestHelpListsEveryFlag(t *testing.T) {
	_, _, errs := runCmd(t, context.Background(), "perf", "-h")
	blocks := flagBlocks(t, errs)
	fs, _ := perfFlags(os.Stderr)
	var want []string
	fs.VisitAll(func(f *flag.Flag) { want = append(want, f.Name) })
	var got []string
	for n := range blocks {
		got = append(got, n)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("perf -h lists %v, want %v", got, want)
	}
	for _, f := range []string{"async", "crc", "json", "sweep", "iters"} {
		if !strings.Contains(blocks[f], "(default ") {
			t.Errorf("perf -h: -%s shows no default:\n%s", f, blocks[f])
		}
	}
}

func TestWriteVersion(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Path: "github.com/gowarp/gowarp", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.time", Value: "2026-12-01T00:00:00Z"},
			{Key: "vcs.modified", Value: "true"}}}
	var b strings.Builder
	writeVersion(&b, bi)
	for _, want := range []string{"gowarp v1.2.3\n", "module   github.com/gowarp/gowarp\n",
		"revision 0123abcd (2026-12-01T00:00:00Z, modified)\n", "go       go1.99 "} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	bi.Settings = nil
	writeVersion(&b, bi)
	if !strings.Contains(b.String(), "revision unknown") {
		t.Errorf("without VCS settings:\n%s", b.String())
	}
	code, out, _ := runCmd(t, context.Background(), "version")
	if code != exitOK || !strings.HasPrefix(out, "gowarp ") || !strings.Contains(out, "module   github.com/gowarp/gowarp\n") {
		t.Errorf("gowarp version: exit %d:\n%s", code, out)
	}
	if code, _, _ := runCmd(t, context.Background(), "version", "extra"); code != exitUsage {
		t.Errorf("gowarp version extra: exit %d, want 2", code)
	}
}

// TestVersionRevision builds gowarp from a clone of this repository's
// HEAD, as a user would, and checks that "gowarp version" names HEAD.
func TestVersionRevision(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gowarp; not in -short")
	}
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed")
	}
	top, err := exec.Command(git, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	head, err := exec.Command(git, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	// A clone, not the checkout itself: go build records no revision in a
	// git worktree, and the clone has no uncommitted changes.
	dir := filepath.Join(t.TempDir(), "gowarp")
	if out, err := exec.Command(git, "clone", "--quiet", strings.TrimSpace(string(top)), dir).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	bin := filepath.Join(t.TempDir(), "gowarp")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/gowarp")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("gowarp version: %v", err)
	}
	want := "revision " + strings.TrimSpace(string(head)) + " ("
	if !strings.Contains(string(out), want) || strings.Contains(string(out), "modified") {
		t.Errorf("gowarp version in a clone of HEAD:\n%s\nwant %q, not modified", out, want)
	}
}
