package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
)

// TestCacheCommands: put, get, ls, stat and del against a server in this
// process, with a value small enough to go inline and one that goes by
// RDMA; an unknown key fails with exit 1.
func TestCacheCommands(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	srv, err := cache.NewServer(cache.ServerOptions{Dir: t.TempDir(), BlockSize: 256 << 10, Device: gowarp.Open(gowarp.WithLogger(log)), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	served := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(served) }()
	defer func() { cancel(); <-served; srv.Close() }()
	addr := "-addr=" + ln.Addr().String()
	dir := t.TempDir()
	big := bytes.Repeat([]byte("0123456789abcdef"), 40000) // 640,000 bytes: three blocks
	os.WriteFile(filepath.Join(dir, "small"), []byte("hello\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "big"), big, 0o644)
	for _, args := range [][]string{
		{"cache", "put", addr, "s", filepath.Join(dir, "small")},
		{"cache", "put", addr, "-durable", "b", filepath.Join(dir, "big")},
		{"cache", "get", addr, "b", filepath.Join(dir, "big.out")},
	} {
		if code, _, errs := runCmd(t, ctx, args...); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "big.out")); !bytes.Equal(got, big) {
		t.Fatalf("got %d bytes back, put %d", len(got), len(big))
	}
	if code, out, errs := runCmd(t, ctx, "cache", "get", addr, "s"); code != exitOK || out != "hello\n" {
		t.Fatalf("get s: exit %d, %q, %s", code, out, errs)
	}
	if code, out, _ := runCmd(t, ctx, "cache", "ls", addr); code != exitOK || out != "b\ns\n" {
		t.Fatalf("ls: exit %d, %q", code, out)
	}
	code, out, _ := runCmd(t, ctx, "cache", "stat", addr, "-json")
	var st cache.Stats
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.Keys != 2 || st.DurablePuts != 1 {
		t.Fatalf("stat: exit %d, %q", code, out)
	}
	if code, _, _ := runCmd(t, ctx, "cache", "del", addr, "s"); code != exitOK {
		t.Fatal("del failed")
	}
	if code, _, errs := runCmd(t, ctx, "cache", "get", addr, "s"); code != exitFailure || errs != "gowarp cache get: key not found: \"s\"\n" {
		t.Fatalf("get of a deleted key: exit %d, %q", code, errs)
	}
	// Flags may follow the arguments, as users type them; after "--" a
	// key may start with '-'.
	if code, out, errs := runCmd(t, ctx, "cache", "get", "b", filepath.Join(dir, "big.2"), addr, "-q"); code != exitOK {
		t.Fatalf("get with the flags last: exit %d, %q, %s", code, out, errs)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "big.2")); !bytes.Equal(got, big) {
		t.Fatalf("get with the flags last: got %d bytes back, put %d", len(got), len(big))
	}
	if code, _, errs := runCmd(t, ctx, "cache", "put", addr, "--", "-k", filepath.Join(dir, "small")); code != exitOK {
		t.Fatalf("put -- -k: exit %d, %s", code, errs)
	}
	if code, out, errs := runCmd(t, ctx, "cache", "ls", addr); code != exitOK || out != "-k\nb\n" {
		t.Fatalf("ls: exit %d, %q, %s", code, out, errs)
	}
	// A wrong count says what the command takes, in a line.
	for _, args := range [][]string{{"get"}, {"get", "a", "b", "c"}, {"del", "a", "b"}, {"ls", "a", "b"}, {"stat", "a"}} {
		code, _, errs := runCmd(t, ctx, append(append([]string{"cache"}, args...), addr)...)
		if code != exitUsage || !strings.HasPrefix(errs, "gowarp cache "+args[0]+": want ") || strings.Count(errs, "\n") != 1 {
			t.Errorf("%q: exit %d, %q", args, code, errs)
		}
	}
}

// TestCacheBench runs the benchmark briefly, memcached included (it
// starts memcached itself) and the cache server in a process of its own
// (this binary, as gowarp: TestMain), and checks the JSON has every case.
func TestCacheBench(t *testing.T) {
	if _, err := exec.LookPath("memcached"); err != nil {
		t.Skip("memcached is not installed (scripts/memcached installs it)")
	}
	t.Setenv("GOWARP_CMD_MAIN", "1") // for the server process
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, errs := runCmd(t, ctx, "cache", "bench", "-duration=100ms", "-keys=20", "-c=2", "-large-c=1", "-json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	systems := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			System string  `json:"system"`
			Ops    int     `json:"ops"`
			MBps   float64 `json:"MBps"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Ops == 0 || r.MBps <= 0 {
			t.Fatalf("result %q (%v)", line, err)
		}
		systems[r.System] = true
	}
	for _, s := range []string{"memcached", "gowarp-get", "gowarp-get-index", "gowarp-readat", "gowarp-lookup+read", "gowarp-lookup-index+read", "gowarp-perf read_bw"} {
		if !systems[s] {
			t.Errorf("no %s result in %s", s, out)
		}
	}
}

// TestCacheBenchSystems: -systems runs only the cases named and
// -large-c 0 none of 1 MiB; -cpuprofile leaves a profile of the bench's
// process and one of the server's.
func TestCacheBenchSystems(t *testing.T) {
	if _, err := exec.LookPath("memcached"); err != nil {
		t.Skip("memcached is not installed (scripts/memcached installs it)")
	}
	t.Setenv("GOWARP_CMD_MAIN", "1") // for the server process
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prof := filepath.Join(t.TempDir(), "cpu.prof")
	code, out, errs := runCmd(t, ctx, "cache", "bench", "-duration=100ms", "-keys=20", "-c=2", "-large-c=0", "-systems=gowarp-readat", "-cpuprofile", prof, "-json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `"system":"gowarp-readat","size":4096`) {
		t.Fatalf("results %q, want one of gowarp-readat at 4 KiB", out)
	}
	for _, p := range []string{prof, prof + ".server"} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", p, err)
		}
	}
}

// TestCacheServeHTTP: gowarp cache serve -http serves the status page and
// the metrics while it serves the cache, and stops with it.
func TestCacheServeHTTP(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runCache(ctx, []string{"serve", "-addr", "127.0.0.1:0", "-dir", t.TempDir(), "-http", "127.0.0.1:0", "-budget", "16MiB"}, io.Discard, &stderr)
	}()
	re := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+/)`)
	var url string
	deadline := time.Now().Add(30 * time.Second)
	for url == "" {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no status page URL logged in 30 s:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for path, want := range map[string]string{"": "gowarp cache", "metrics": "gowarp_cache_budget_bytes 1.6777216e+07", "status.json": `"Budget":16777216`} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("GET /%s: %s, no %q in\n%.300s", path, resp.Status, want, b)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("serve exited %d:\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop in 30 s")
	}
	if _, err := http.Get(url); err == nil {
		t.Error("the status page is still served after serve stopped")
	}
}

// TestCacheServeProcs: -procs sets the server's Go processors, as its
// start says; a negative one is a usage error.
func TestCacheServeProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0)) // serve runs in this process
	if code := runCache(context.Background(), []string{"serve", "-procs", "-1"}, io.Discard, io.Discard); code != exitUsage {
		t.Fatalf("-procs -1: exit %d, want %d", code, exitUsage)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runCache(ctx, []string{"serve", "-addr", "127.0.0.1:0", "-dir", t.TempDir(), "-budget", "16MiB", "-procs", "1"}, io.Discard, &stderr)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stderr.String(), "cache: serving") {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start in 30 s:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), " procs=1 ") || runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("GOMAXPROCS %d, log:\n%s", runtime.GOMAXPROCS(0), stderr.String())
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("serve exited %d:\n%s", code, stderr.String())
	}
}
