package siwtest

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// flagCase is a bandwidth run with perftest's -q, -D or --report_gbits:
// server and client are the flags of each side, the same on either
// program; qps is -q's (1 without), and a run with -D has no fixed count.
type flagCase struct {
	name           string
	test           string
	server, client []string
	qps            int
	duration       bool
}

// The runs: both ways, on several queue pairs, in Gb/s, for a duration.
var flagCases = []flagCase{
	{name: "q2", test: "write_bw", server: []string{"-q", "2", "-n", "100"}, client: []string{"-q", "2", "-n", "100"}, qps: 2},
	{name: "q3_gbits", test: "read_bw", server: []string{"-q", "3", "-n", "50", "--report_gbits"}, client: []string{"-q", "3", "-n", "50", "--report_gbits"}, qps: 3},
	{name: "D3", test: "write_bw", client: []string{"-D", "3"}, qps: 1, duration: true},
	{name: "b", test: "write_bw", server: []string{"-b", "-n", "100"}, client: []string{"-b", "-n", "100"}, qps: 1},
	{name: "b_q2", test: "read_bw", server: []string{"-b", "-q", "2", "-n", "50"}, client: []string{"-b", "-q", "2", "-n", "50"}, qps: 2},
	{name: "b_D3", test: "write_bw", server: []string{"-b", "-D", "3"}, client: []string{"-b", "-D", "3"}, qps: 1, duration: true},
	{name: "output", test: "write_bw", server: []string{"-n", "50", "--output=bandwidth"}, client: []string{"-n", "50", "-N", "--output=bandwidth"}, qps: 1},
	{name: "D3", test: "send_bw", server: []string{"-D", "3"}, client: []string{"-D", "3"}, qps: 1, duration: true},
	{name: "D3", test: "write_lat", server: []string{"-D", "3"}, client: []string{"-D", "3"}, qps: 1, duration: true},
	{name: "D3", test: "read_lat", server: []string{"-D", "3"}, client: []string{"-D", "3"}, qps: 1, duration: true},
	{name: "D3", test: "send_lat", server: []string{"-D", "3"}, client: []string{"-D", "3"}, qps: 1, duration: true},
}

// outputLine is perftest's --output: a number, six decimals, alone.
var outputLine = regexp.MustCompile(`(?m)^[0-9]+\.[0-9]{6}$`)

// latSampledLine is a latency test's result line for a run of a duration:
// size, count, average latency, transactions a second.
var latSampledLine = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s*$`)

// perftestFlags runs c with gowarp perftest as the client of siw's
// server (gowarpServes false) or as the server of siw's client. The
// server prints the client's report, which says the whole run's count
// (-n × -q) and is in the client's unit; with -b both print the two
// sides' reports added.
func (s *suite) perftestFlags(t *testing.T, c flagCase, gowarpServes bool) {
	var detail, note string
	defer func() { s.sum.add(t, t.Name(), detail+note) }()
	gflags, pflags := c.client, c.server
	if gowarpServes {
		gflags, pflags = c.server, c.client
	}
	client, server, note := s.perftestBoth(t, c.test, gowarpServes, gflags, pflags)
	if slices.ContainsFunc(c.client, func(f string) bool { return strings.HasPrefix(f, "--output=") }) {
		// One number each, the client's average: the server prints it too.
		mine, theirs := outputLine.FindAllString(client, -1), outputLine.FindAllString(server, -1)
		if len(mine) != 1 || !slices.Equal(mine, theirs) {
			t.Errorf("--output: the client printed %q, the server %q; want one number, the same:\n%s\n%s", mine, theirs, client, server)
		}
		if strings.Contains(client, "BW average") || strings.Contains(server, "BW average") {
			t.Errorf("--output: a table was printed too:\n%s\n%s", client, server)
		}
		detail = fmt.Sprintf("both printed %q only", mine)
		return
	}
	if strings.HasSuffix(c.test, "_lat") {
		detail = latFlags(t, c, client, server)
		return
	}
	mine, theirs := reportLine.FindStringSubmatch(client), reportLine.FindStringSubmatch(server)
	if mine == nil || theirs == nil {
		t.Fatalf("no result line:\nclient:\n%s\nserver:\n%s", client, server)
	}
	duplex := slices.Contains(c.client, "-b")
	switch {
	case duplex && c.duration:
		// Each side's line has its own count, and both ways' figures
		// added (perftest's print_full_bw_report).
		if mine[1] != theirs[1] || !slices.Equal(mine[3:], theirs[3:]) {
			t.Errorf("the server printed %v, the client %v: want the same size and figures", theirs[1:], mine[1:])
		}
	case c.test == "send_bw":
		// Each side measures its own side (the server its receives, from
		// the first), as without -D: the same size, some messages and no
		// peak on the server's line too.
		if m, _ := strconv.Atoi(theirs[2]); mine[1] != theirs[1] || m <= 0 || theirs[3] != "0.00" {
			t.Errorf("the server printed %v, the client %v: want the same size, some messages, no peak", theirs[1:], mine[1:])
		}
		note += fmt.Sprintf("; the server received %s messages at %s avg", theirs[2], theirs[4])
	case !slices.Equal(mine[1:], theirs[1:]):
		t.Errorf("the server printed %v, the client %v", theirs[1:], mine[1:])
	}
	for who, o := range map[string]string{"client": client, "server": server} {
		if want := fmt.Sprintf("Number of qps   : %d", c.qps); !strings.Contains(o, want) || strings.Count(o, "remote address") != c.qps {
			t.Errorf("the %s's table lacks %q or has not %d remote addresses:\n%s", who, want, c.qps, o)
		}
	}
	unit := "MB/sec"
	for _, f := range c.client {
		if f == "--report_gbits" {
			unit = "Gb/sec"
		}
	}
	if !strings.Contains(client, "BW average["+unit+"]") {
		t.Errorf("the client's table is not in %s:\n%s", unit, client)
	}
	if duplex && (!strings.Contains(client, "Bidirectional BW Test") || !strings.Contains(server, "Bidirectional BW Test")) {
		t.Errorf("a bidirectional run's tables do not say so:\n%s\n%s", client, server)
	}
	n, _ := strconv.Atoi(mine[2])
	switch {
	case c.duration:
		if n <= 0 || mine[3] != "0.00" {
			t.Errorf("a run of a duration reported %d messages, peak %s; want some and no peak", n, mine[3])
		}
	default:
		var iters int
		for i, f := range c.client {
			if f == "-n" {
				iters, _ = strconv.Atoi(c.client[i+1])
			}
		}
		if n != iters*c.qps {
			t.Errorf("the client reported %d messages, want %d on each of %d queue pairs", n, iters, c.qps)
		}
	}
	detail = fmt.Sprintf("%s messages of %s B; the client measured %s %s avg", mine[2], mine[1], mine[4], unit)
}

// latFlags checks a latency test's run of a duration: each side that
// measures (read_lat's client only) prints its count, average and rate,
// and the two sides of write_lat and send_lat counted the same round
// trips, give or take the one in flight at an end.
func latFlags(t *testing.T, c flagCase, client, server string) (detail string) {
	t.Helper()
	mine := latSampledLine.FindStringSubmatch(client)
	if mine == nil || !strings.Contains(client, "tps average") {
		t.Fatalf("the client printed no result line of a duration:\n%s", client)
	}
	n, _ := strconv.Atoi(mine[2])
	if n <= 0 {
		t.Errorf("the client counted %d round trips", n)
	}
	detail = fmt.Sprintf("the client counted %d round trips, %s µs on average", n, mine[3])
	if c.test == "read_lat" {
		return detail
	}
	theirs := latSampledLine.FindStringSubmatch(server)
	if theirs == nil {
		t.Fatalf("the server printed no result line of a duration:\n%s", server)
	}
	if m, _ := strconv.Atoi(theirs[2]); m < n-1 || m > n+1 {
		t.Errorf("the client counted %d round trips, the server %d", n, m)
	}
	return detail + fmt.Sprintf("; the server %s, %s µs", theirs[2], theirs[3])
}
