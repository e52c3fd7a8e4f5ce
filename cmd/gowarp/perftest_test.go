package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestPerftestBothWays runs gowarp perftest as a server and as its client,
// for a bandwidth and a latency test, and checks the tables and -json.
func TestPerftestBothWays(t *testing.T) {
	for _, c := range []struct {
		test string
		line *regexp.Regexp
	}{
		{"send_bw", regexp.MustCompile(`(?m)^ 4096\s+50\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+$`)},
		{"write_lat", regexp.MustCompile(`(?m)^ 64\s+50(\s+[0-9.]+){7}\s*$`)},
	} {
		t.Run(c.test, func(t *testing.T) {
			port := strconv.Itoa(freePort(t))
			size := "4096"
			if strings.HasSuffix(c.test, "_lat") {
				size = "64"
			}
			sout, cout := perftestPair(t, []string{"-a", "127.0.0.1", "-p", port, "-n", "50", "-s", size, c.test},
				[]string{"-json", "-n", "50", "-s", size, c.test, "127.0.0.1:" + port})
			if !c.line.MatchString(sout) || !strings.Contains(sout, "---------") {
				t.Errorf("server's table:\n%s", sout)
			}
			var j map[string]any
			if err := json.Unmarshal([]byte(cout), &j); err != nil {
				t.Fatalf("client's -json: %v\n%s", err, cout)
			}
			if j["test"] != c.test || j["role"] != "client" || j["iters"] != 50.0 {
				t.Errorf("client's -json: %v", j)
			}
		})
	}
}

// perftestPair runs gowarp perftest as a server with sargs and as its
// client with cargs (retried until the server listens) and returns what
// each printed; either failing fails t.
func perftestPair(t *testing.T, sargs, cargs []string) (server, client string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var sout, serr lockedBuf
	var wg sync.WaitGroup
	var scode int
	wg.Add(1)
	go func() {
		defer wg.Done()
		scode = dispatch(ctx, append([]string{"perftest"}, sargs...), &sout, &serr)
	}()
	var cout, cerr lockedBuf
	var ccode int
	for try := 0; try < 50; try++ { // until the server listens
		cout, cerr = lockedBuf{}, lockedBuf{}
		ccode = dispatch(ctx, append([]string{"perftest"}, cargs...), &cout, &cerr)
		if ccode == 0 || !strings.Contains(cerr.String(), "refused") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	if ccode != 0 || scode != 0 {
		t.Fatalf("client exit %d: %s%s\nserver exit %d: %s%s", ccode, cout.String(), cerr.String(), scode, sout.String(), serr.String())
	}
	return sout.String(), cout.String()
}

// TestPerftestAllSizes: --all (perftest's -a) on both sides, the client's
// command line as pasted from a perftest run (-R and -F, which mean
// nothing here, are taken): a line for every size from 2 B to 8 MiB.
func TestPerftestAllSizes(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	sout, cout := perftestPair(t, []string{"-a", "127.0.0.1", "-p", port, "--all", "-n", "5", "write_bw"},
		[]string{"-R", "-F", "--all", "-s", "64K", "-n", "5", "write_bw", "127.0.0.1:" + port}) // -a runs every size whatever -s says, as perftest's
	lines := regexp.MustCompile(`(?m)^ (\d+)\s+5\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+$`).FindAllStringSubmatch(cout, -1)
	if len(lines) != 23 || lines[0][1] != "2" || lines[22][1] != "8388608" {
		t.Errorf("client's table has %d size lines, want 23 from 2 to 8388608:\n%s", len(lines), cout)
	}
	if !strings.Contains(sout, " 8388608    5 ") {
		t.Errorf("server's table lacks the client's last report:\n%s", sout)
	}
}

// TestPerftestOutput: --output prints one number a line and nothing else
// on either side (the server not even its waiting line), as perftest's
// (siw's ib_write_bw --output=bandwidth printed "7.446877"); -N reports
// no peak.
func TestPerftestOutput(t *testing.T) {
	number := regexp.MustCompile(`^[0-9]+\.[0-9]{6}\n$`)
	port := strconv.Itoa(freePort(t))
	sout, cout := perftestPair(t, []string{"-a", "127.0.0.1", "-p", port, "-n", "20", "--output=bandwidth", "write_bw"},
		[]string{"-n", "20", "--output=bandwidth", "write_bw", "127.0.0.1:" + port})
	if !number.MatchString(cout) || sout != cout {
		t.Errorf("client printed %q, server %q: want the same one number", cout, sout)
	}
	port = strconv.Itoa(freePort(t))
	_, cout = perftestPair(t, []string{"-a", "127.0.0.1", "-p", port, "-n", "20", "write_bw"},
		[]string{"-n", "20", "-N", "write_bw", "127.0.0.1:" + port})
	if !regexp.MustCompile(`(?m)^ 65536\s+20\s+0\.00\s+[0-9.]+`).MatchString(cout) || strings.Contains(cout, " 65536      20               0.00               0.00") {
		t.Errorf("-N: want a peak of 0 and an average:\n%s", cout)
	}
	for _, args := range [][]string{{"--output=latency", "write_bw"}, {"--output=bandwidth", "send_lat"}, {"--output=everything", "read_bw"}} {
		var out, errb lockedBuf
		if code := dispatch(context.Background(), append([]string{"perftest", "-a", "127.0.0.1:0"}, args...), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "output can be") {
			t.Errorf("perftest %v: exit %d, %q; want %d and what the test's output can be", args, code, errb.String(), exitUsage)
		}
	}
}

// TestPerftestSize: -s as perftest reads it, with K and M.
func TestPerftestSize(t *testing.T) {
	for in, want := range map[string]int{"2": 2, "65536": 65536, "64K": 65536, "1M": 1 << 20, "8M": 8 << 20, "0x10": 16, "0": 0} {
		var z perftestSize
		if err := z.Set(in); err != nil || int(z) != want {
			t.Errorf("-s %s: %d, %v; want %d", in, z, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "2G", "K", "4096M", "1.5K"} {
		var z perftestSize
		if err := z.Set(in); err == nil {
			t.Errorf("-s %q: %d, no error", in, z)
		}
	}
}

// TestPerftestRefused: a client whose server is not there exits 1 saying
// so once, with the command's name once (it said "gowarp perftest:
// perftest: control connection: gowarp: queue pair closed (…refused)").
func TestPerftestRefused(t *testing.T) {
	port := strconv.Itoa(freePort(t)) // nothing listens there
	var out, errb lockedBuf
	code := dispatch(context.Background(), []string{"perftest", "write_bw", "127.0.0.1:" + port}, &out, &errb)
	msg := errb.String()
	if code != exitFailure || !strings.HasPrefix(msg, "gowarp perftest: control connection: ") ||
		strings.Contains(msg, "perftest: perftest") || strings.Contains(msg, "closed") || !strings.Contains(msg, "refused") {
		t.Fatalf("exit %d, stderr %q: want exit %d and one line saying the connection was refused", code, msg, exitFailure)
	}
}

// TestPerftestQPsDuration: a command line with perftest's -q, -D and
// --report_gbits, and its device flags (-d DEV, -i, -x, -c RC, which mean
// nothing here; gowarp's -d had been its debug switch, so "-d siw0" made
// siw0 the server's address): both sides on two queue pairs, the client
// for a second, in Gb/s. -D with --all, a bad -q and -c UD are refused
// where perftest's tests do not take them.
func TestPerftestQPsDuration(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	sout, cout := perftestPair(t, []string{"-a", "127.0.0.1", "-p", port, "-d", "siw0", "-q", "2", "-D", "1", "--report_gbits", "write_bw"},
		[]string{"-R", "-d", "siw0", "-i", "1", "-x", "3", "-c", "RC", "-F", "-q", "2", "-D", "1", "--report_gbits", "write_bw", "127.0.0.1:" + port})
	line := regexp.MustCompile(`(?m)^ 65536\s+\d+\s+0\.0+\s+[0-9.]+\s+[0-9.]+$`)
	for who, out := range map[string]string{"client": cout, "server": sout} {
		if !strings.Contains(out, "Number of qps   : 2") || !strings.Contains(out, "BW average[Gb/sec]") || !line.MatchString(out) ||
			strings.Count(out, "remote address") != 2 {
			t.Errorf("%s's table:\n%s", who, out)
		}
	}
	for _, args := range [][]string{{"-D", "1", "--all", "send_bw"}, {"-q", "2", "write_lat"}, {"-q", "0", "write_bw"}, {"-D", "-1", "write_bw"}, {"-c", "UD", "write_bw"}, {"-b", "send_lat"}} {
		var out, errb lockedBuf
		// A server that took them would wait for a client: not for long.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		code := dispatch(ctx, append([]string{"perftest", "-a", "127.0.0.1:0"}, args...), &out, &errb)
		cancel()
		if code != exitUsage || errb.String() == "" {
			t.Errorf("perftest %v: exit %d, %q; want %d and why", args, code, errb.String(), exitUsage)
		}
	}
}
