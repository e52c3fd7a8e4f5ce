package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for concurrent writes and reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runCmd runs the command line args and returns its exit status and output.
func runCmd(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr syncBuffer
	code := dispatch(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

var (
	bwKeys  = []string{"bw_MBps", "iters", "msg_rate_Mpps", "size", "test", "transport"}
	latKeys = []string{"iters", "lat_us_avg", "lat_us_min", "lat_us_p50", "lat_us_p99", "size", "test", "transport"}
)

// checkJSON checks that out is one JSON object per line, in the shape of
// its test, and returns the objects.
func checkJSON(t *testing.T, out string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		keys := slices.Sorted(maps.Keys(m))
		want := latKeys
		if strings.HasSuffix(m["test"].(string), "_bw") {
			want = bwKeys
		}
		if !slices.Equal(keys, want) {
			t.Errorf("%s: keys %v, want %v", sc.Text(), keys, want)
		}
		if tr := m["transport"]; tr != "tcp" && tr != "shm" {
			t.Errorf("%s: transport %v", sc.Text(), tr)
		}
		for _, k := range keys {
			if k == "test" || k == "transport" {
				continue
			}
			if v, ok := m[k].(float64); !ok || v <= 0 {
				t.Errorf("%s: %s is %v, want a positive number", sc.Text(), k, m[k])
			}
		}
		if strings.HasSuffix(m["test"].(string), "_lat") {
			lo, p50, p99 := m["lat_us_min"].(float64), m["lat_us_p50"].(float64), m["lat_us_p99"].(float64)
			if !(lo <= p50 && p50 <= p99) {
				t.Errorf("%s: latencies out of order", sc.Text())
			}
		}
		objs = append(objs, m)
	}
	return objs
}

func TestPerfJSONShape(t *testing.T) {
	code, out, errs := runCmd(t, context.Background(), "perf", "-json", "-iters", "30", "-test", "all", "-size", "512", "-depth", "8")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	objs := checkJSON(t, out)
	var names []string
	for _, m := range objs {
		names = append(names, m["test"].(string))
		if m["size"] != 512.0 || m["iters"] != 30.0 {
			t.Errorf("%v: size %v iters %v, want 512 and 30", m["test"], m["size"], m["iters"])
		}
	}
	want := []string{"write_bw", "read_bw", "send_bw", "tcp_bw", "write_lat", "read_lat", "send_lat", "tcp_lat"}
	if !slices.Equal(names, want) {
		t.Errorf("tests %v, want %v", names, want)
	}
}

// TestPerfQPs: -qps runs the bandwidth tests on several connections at
// once and reports their aggregate; the latency tests run on one.
func TestPerfQPs(t *testing.T) {
	// With busy polling too: the connections ask for it and still run.
	code, out, errs := runCmd(t, context.Background(), "perf", "-json", "-iters", "40", "-test", "write_bw,read_bw,write_lat", "-size", "4K", "-depth", "8", "-qps", "16", "-busy-poll", "100us")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := map[string]float64{"write_bw": 16 * 40, "read_bw": 16 * 40, "write_lat": 40}
	objs := checkJSON(t, out)
	if len(objs) != len(want) {
		t.Fatalf("%d results, want %d:\n%s", len(objs), len(want), out)
	}
	for _, m := range objs {
		if n := want[m["test"].(string)]; m["iters"] != n {
			t.Errorf("%v: %v iterations, want %v", m["test"], m["iters"], n)
		}
	}
}

func TestPerfDefaultTable(t *testing.T) {
	// The default set, cut short with -iters.
	code, out, errs := runCmd(t, context.Background(), "perf", "-iters", "20")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 10 || !strings.HasPrefix(lines[0], "# gowarp perf: loopback 127.0.0.1:") ||
		!strings.Contains(lines[1], "BW[MB/s]") || !strings.Contains(lines[1], "t_p99[us]") {
		t.Fatalf("output:\n%s", out)
	}
	row := regexp.MustCompile(`^(\w+)\s+(\d+)\s+20\s`)
	var got []string
	for _, l := range lines[2:] {
		m := row.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("row %q", l)
		}
		got = append(got, m[1]+" "+m[2])
	}
	want := []string{"write_bw 65536", "read_bw 65536", "send_bw 65536", "tcp_bw 65536",
		"write_lat 8", "read_lat 8", "send_lat 8", "tcp_lat 8"}
	if !slices.Equal(got, want) {
		t.Errorf("rows %v, want %v", got, want)
	}
}

// TestPerfRounds: -rounds runs the tests again, every other round
// backwards, marks each result with its round, and ends with a summary
// per test whose ratios are taken within each round.
func TestPerfRounds(t *testing.T) {
	code, out, errs := runCmd(t, context.Background(), "perf", "-json", "-rounds", "3", "-iters", "50", "-test", "write_lat,tcp_lat,read_lat")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got []string
	sums := map[string]map[string]any{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if m["summary"] == true {
			sums[m["test"].(string)] = m
			continue
		}
		got = append(got, fmt.Sprintf("%v %v", m["round"], m["test"]))
	}
	want := []string{"1 write_lat", "1 tcp_lat", "1 read_lat", "2 read_lat", "2 tcp_lat", "2 write_lat", "3 write_lat", "3 tcp_lat", "3 read_lat"}
	if !slices.Equal(got, want) {
		t.Errorf("runs %v, want %v", got, want)
	}
	for name, base := range map[string]string{"write_lat": "tcp_lat", "read_lat": "2 × tcp_lat", "tcp_lat": ""} {
		s := sums[name]
		if s == nil || s["rounds"] != 3.0 || s["unit"] != "us_p50" || s["median"].(float64) <= 0 {
			t.Errorf("%s: summary %v", name, s)
			continue
		}
		if base == "" {
			if _, ok := s["ratio_to_tcp"]; ok {
				t.Errorf("%s: a ratio to itself: %v", name, s)
			}
			continue
		}
		r, lo, hi := s["ratio_to_tcp"].(float64), s["ratio_min"].(float64), s["ratio_max"].(float64)
		if s["ratio_base"] != base || s["ratio_rounds"] != 3.0 || !(0 < lo && lo <= r && r <= hi) {
			t.Errorf("%s: summary %v", name, s)
		}
	}

	// The table: a line per round, and the summary's.
	code, out, errs = runCmd(t, context.Background(), "perf", "-rounds", "2", "-iters", "20", "-test", "write_bw,tcp_bw", "-size", "4K", "-depth", "8")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, s := range []string{"# round 1 of 2\n", "# round 2 of 2\n", "# medians of 2 rounds\n", "] × tcp_bw\n"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

func TestPerfSweep(t *testing.T) {
	code, out, errs := runCmd(t, context.Background(), "perf", "-json", "-sweep", "-iters", "2", "-test", "read_lat")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	objs := checkJSON(t, out)
	if len(objs) != 20 || objs[0]["size"] != 2.0 || objs[19]["size"] != float64(1<<20) {
		t.Errorf("sweep gave %d results:\n%s", len(objs), out)
	}
}

func TestPerfBadUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"perf", "-test", "write_bandwidth"}, 2, `unknown test "write_bandwidth"`},
		{[]string{"perf", "-server", ":1", "-client", "x:1"}, 2, "exclude each other"},
		{[]string{"perf", "-mpa-rev", "3"}, 2, "-mpa-rev 3"},
		{[]string{"perf", "-completion", "soon"}, 2, "handed or acked"},
		{[]string{"perf", "-size", "0"}, 2, "want a size"},
		{[]string{"perf", "-sweep", "-size", "8"}, 2, "exclude each other"},
		{[]string{"perf", "-depth", "0"}, 2, "-depth 0"},
		{[]string{"perf", "-qps", "0"}, 2, "-qps 0"},
		{[]string{"perf", "-busy-poll", "-1us"}, 2, "-busy-poll -1µs"},
		{[]string{"perf", "extra"}, 2, "unexpected arguments"},
		{[]string{"perf", "-rounds", "0"}, 2, "-rounds 0"},
		{[]string{"perf", "-rounds", "2", "-plot", "x.svg"}, 2, "not with -rounds"},
		{[]string{"perf", "-rounds", "2", "-server", ":1"}, 2, "not with -server"},
		{[]string{"perf", "-help"}, 0, "port after ADDR"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"help"}, 0, "perf"},
		// Nobody listens on port 1: the runs fail, the tool says why.
		{[]string{"perf", "-client", "127.0.0.1:1", "-test", "write_bw", "-iters", "1"}, 1, "connection refused"},
	} {
		code, _, errs := runCmd(t, context.Background(), tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.msg) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errs, tc.code, tc.msg)
		}
	}
}

// TestPerfServerMode runs `perf -server` and two `perf -client` at once
// against it, then stops the server as an interrupt would.
func TestPerfServerMode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var srvErr syncBuffer
	exited := make(chan int, 1)
	go func() { exited <- dispatch(ctx, []string{"perf", "-server", "127.0.0.1:0"}, io.Discard, &srvErr) }()
	var addr string
	re := regexp.MustCompile(`serving iWARP on (\S+), plain TCP on (\S+)`)
	for deadline := time.Now().Add(5 * time.Second); addr == ""; time.Sleep(10 * time.Millisecond) {
		if m := re.FindStringSubmatch(srvErr.String()); m != nil {
			addr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("server did not start: %s", srvErr.String())
		}
	}
	var wg sync.WaitGroup
	for _, tests := range []string{"write_bw,read_lat,tcp_bw", "send_bw,write_lat,tcp_lat,read_bw,send_lat"} {
		wg.Go(func() {
			code, out, errs := runCmd(t, ctx, "perf", "-client", addr, "-json", "-iters", "100", "-size", "4K", "-test", tests)
			if code != 0 {
				t.Errorf("client %s: exit %d: %s", tests, code, errs)
				return
			}
			if n := len(checkJSON(t, out)); n != strings.Count(tests, ",")+1 {
				t.Errorf("client %s: %d results", tests, n)
			}
		})
	}
	wg.Wait()
	cancel()
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("server exit %d: %s", code, srvErr.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server did not stop")
	}
	if s := srvErr.String(); strings.Contains(s, "level=WARN") || strings.Contains(s, "level=ERROR") {
		t.Errorf("server complained:\n%s", s)
	}
}

// TestPerfProfiles: -cpuprofile and -trace leave a CPU profile and an
// execution trace of the run, which pprof and the trace tool read (their
// headers say so); a file that cannot be created is a usage error.
func TestPerfProfiles(t *testing.T) {
	dir := t.TempDir()
	prof, tr := filepath.Join(dir, "cpu.prof"), filepath.Join(dir, "run.trace")
	code, _, errs := runCmd(t, context.Background(), "perf", "-iters", "20", "-size", "4K", "-depth", "4", "-test", "write_bw", "-cpuprofile", prof, "-trace", tr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	p, err := os.ReadFile(prof)
	if err != nil || len(p) < 2 || p[0] != 0x1f || p[1] != 0x8b { // gzipped protobuf
		t.Errorf("cpu profile: %d bytes, %v", len(p), err)
	}
	if b, err := os.ReadFile(tr); err != nil || !bytes.HasPrefix(b, []byte("go 1.")) {
		t.Errorf("trace: %.12q, %v", b, err)
	}
	if code, _, _ := runCmd(t, context.Background(), "perf", "-iters", "1", "-test", "write_bw", "-cpuprofile", filepath.Join(dir, "no", "such", "dir")); code != 2 {
		t.Errorf("profile in a missing directory: exit %d, want 2", code)
	}
}
