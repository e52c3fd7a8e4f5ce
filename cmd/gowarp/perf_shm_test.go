//go:build linux

package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// checkTransports checks that the RDMA tests of out ran over shared
// memory and the plain-TCP ones over TCP.
func checkTransports(t *testing.T, out string, n int) {
	t.Helper()
	objs := checkJSON(t, out)
	if len(objs) != n {
		t.Fatalf("%d results, want %d:\n%s", len(objs), n, out)
	}
	for _, m := range objs {
		want := "shm"
		if strings.HasPrefix(m["test"].(string), "tcp_") {
			want = "tcp"
		}
		if m["transport"] != want {
			t.Errorf("%v: transport %v, want %s", m["test"], m["transport"], want)
		}
	}
}

const shmTests = "write_bw,read_bw,send_bw,tcp_bw,write_lat,read_lat,send_lat,tcp_lat"

// TestAdapterSharedMemoryPerf: perf -shm runs every test in one process
// over a shared-memory link, the plain-TCP ones over TCP, and says so.
func TestAdapterSharedMemoryPerf(t *testing.T) {
	code, out, errs := runCmd(t, context.Background(), "perf", "-json", "-shm", "-iters", "30", "-size", "64K", "-depth", "8", "-test", shmTests)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	checkTransports(t, out, 8)
	// Without -shm, everything is TCP.
	code, out, errs = runCmd(t, context.Background(), "perf", "-json", "-iters", "10", "-size", "4K", "-depth", "8", "-test", "write_bw,write_lat")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, m := range checkJSON(t, out) {
		if m["transport"] != "tcp" {
			t.Errorf("%v without -shm: transport %v", m["test"], m["transport"])
		}
	}
}

const perfServerEnv = "GOWARP_PERF_SERVER"

// TestPerfServerChild is `gowarp perf -server` in a process of its own;
// it runs only when re-executed.
func TestPerfServerChild(t *testing.T) {
	if os.Getenv(perfServerEnv) == "" {
		t.Skip("the server of TestAdapterSharedMemoryPerfProcesses; runs in a child process")
	}
	os.Exit(dispatch(context.Background(), []string{"perf", "-server", "127.0.0.1:0"}, os.Stdout, os.Stderr))
}

// TestAdapterSharedMemoryPerfProcesses: perf -client -shm against a
// perf -server in another process runs over shared memory.
func TestAdapterSharedMemoryPerfProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPerfServerChild$")
	cmd.Env = append(os.Environ(), perfServerEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		re := regexp.MustCompile(`serving iWARP on (\S+),`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				lines <- m[1]
			}
		}
	}()
	var addr string
	select {
	case addr = <-lines:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not start")
	}
	code, out, errs := runCmd(t, context.Background(), "perf", "-client", addr, "-json", "-shm", "-iters", "30", "-size", "64K", "-depth", "8", "-test", shmTests)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	checkTransports(t, out, 8)
}
