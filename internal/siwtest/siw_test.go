package siwtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/guest"
	"github.com/gowarp/gowarp/internal/rping"
	"github.com/gowarp/gowarp/wire"
)

// result is one line of the suite's summary.
type result struct {
	name, outcome, detail string
}

type summary struct {
	mu   sync.Mutex
	rows []result
}

func (s *summary) add(t *testing.T, name, detail string) {
	outcome := "pass"
	if t.Failed() {
		outcome = "FAIL"
	}
	s.mu.Lock()
	s.rows = append(s.rows, result{name, outcome, detail})
	s.mu.Unlock()
}

func (s *summary) String() string {
	var b strings.Builder
	b.WriteString("| scenario | result | detail |\n|---|---|---|\n")
	for _, r := range s.rows {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r.name, r.outcome, r.detail)
	}
	return b.String()
}

// TestSIW is the interop suite. See the package comment.
func TestSIW(t *testing.T) {
	siwvm := needGuest(t)
	t0 := time.Now()
	bin := filepath.Join(t.TempDir(), "gowarp")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/gowarp/gowarp/cmd/gowarp").CombinedOutput(); err != nil {
		t.Fatalf("building gowarp: %v\n%s", err, out)
	}
	sum := &summary{}
	s := &suite{v: startVM(t, siwvm), bin: bin, sum: sum, im: siwvm, top: t}
	defer func() {
		// s.v: the guest may have been restarted (restartGuest).
		s.v.stop()
		if t.Failed() || s.restarts > 0 {
			t.Logf("guest run directory kept for a look: %s (console.log, share/jobs/N.{sh,out,err,rc,stuck}, share/dmesg.txt)", s.v.dir)
		} else if !s.v.attached {
			os.RemoveAll(s.v.dir)
		}
	}()
	defer func() {
		t.Logf("suite took %v\n%s", time.Since(t0).Round(time.Second), sum)
		if p := os.Getenv("GOWARP_SIWVM_REPORT"); p != "" {
			os.WriteFile(p, []byte(fmt.Sprintf("suite time %v\n\n%s", time.Since(t0).Round(time.Second), sum)), 0o644)
		}
	}()

	// gowarp ping -c against rping -s in the guest.
	for _, c := range []pingCase{
		{size: 64, count: 10},
		{size: rping.MinSize, count: 3},
		{size: 1000, count: 5, flags: []string{"-crc"}},
		{size: 4096, count: 20},
		{size: 5000, count: 5, flags: []string{"-crc"}},
		{size: 16384, count: 5, flags: []string{"-p2p"}},
		{size: 65535, count: 10},
		{size: 65535, count: 5, flags: []string{"-crc", "-p2p"}},
		{size: 64, count: 100, flags: []string{"-ird", "16", "-ord", "16"}},
		{size: 64, count: 2, flags: []string{"-pd", "252"}},
	} {
		t.Run(c.name("gowarp-client"), func(t *testing.T) { s.hostClient(t, c) })
	}
	t.Run("gowarp-client/rev1-rping-cannot-read", s.hostClientRev1)
	t.Run("gowarp-client/private-data-253", s.privateDataTooLong)

	// rping -c in the guest against gowarp ping -s.
	for _, c := range []pingCase{
		{size: 64, count: 10},
		{size: rping.MinSize, count: 3},
		{size: 1000, count: 5},
		{size: 4096, count: 20},
		{size: 5000, count: 5, flags: []string{"-crc"}},
		{size: 65535, count: 10},
		{size: 65535, count: 3, flags: []string{"-crc"}},
	} {
		t.Run(c.name("rping-client"), func(t *testing.T) { s.guestClient(t, c) })
	}

	// perftest's servers in the guest, gowarp perftest as the client.
	for _, c := range []perfCase{
		{test: "write_bw", iters: 1000},
		{test: "read_bw", iters: 300},
		{test: "send_bw", iters: 1000},
		{test: "write_bw", iters: 200, flags: []string{"-crc"}},
		{test: "read_bw", iters: 100, flags: []string{"-crc"}},
		{test: "send_bw", iters: 200, flags: []string{"-crc"}},
		{test: "write_bw", iters: 200, flags: []string{"-mpa-rev", "1"}},
		{test: "read_bw", iters: 100, flags: []string{"-mpa-rev", "1"}},
		{test: "send_bw", iters: 200, flags: []string{"-mpa-rev", "1"}},
		{test: "send_bw", iters: 2000, size: 4096},
	} {
		t.Run(c.name(), func(t *testing.T) { s.perftest(t, c) })
	}

	// perftest's latency servers in the guest, gowarp perftest as the
	// client: CRC off and on (siw agrees to what gowarp asks).
	for _, c := range []perfCase{
		{test: "write_lat", iters: 100},
		{test: "read_lat", iters: 100},
		{test: "send_lat", iters: 100},
		{test: "write_lat", iters: 50, flags: []string{"-crc"}},
		{test: "read_lat", iters: 50, flags: []string{"-crc"}},
		{test: "send_lat", iters: 50, flags: []string{"-crc"}},
	} {
		t.Run(c.name(), func(t *testing.T) { s.perftestLatClient(t, c) })
	}

	// perftest's clients in the guest, gowarp perftest as their server:
	// every test, CRC off and on (gowarp's reply turns it on).
	for _, c := range []perfCase{
		{test: "write_bw", iters: 100},
		{test: "read_bw", iters: 100},
		{test: "send_bw", iters: 100},
		{test: "write_lat", iters: 100},
		{test: "read_lat", iters: 100},
		{test: "send_lat", iters: 100},
		{test: "write_bw", iters: 50, flags: []string{"-crc"}},
		{test: "read_bw", iters: 50, flags: []string{"-crc"}},
		{test: "send_bw", iters: 50, flags: []string{"-crc"}},
		{test: "write_lat", iters: 50, flags: []string{"-crc"}},
		{test: "read_lat", iters: 50, flags: []string{"-crc"}},
		{test: "send_lat", iters: 50, flags: []string{"-crc"}},
		// Small messages, which perftest's clients move a cache line at a
		// time through a page of the server's buffer.
		{test: "read_bw", iters: 200, size: 1},
		{test: "write_bw", iters: 200, size: 100},
	} {
		t.Run(c.serverName(), func(t *testing.T) { s.perftestServer(t, c) })
	}

	// perftest's all-sizes mode (-a), both ways.
	for _, test := range []string{"write_bw", "read_bw", "send_bw", "write_lat", "read_lat", "send_lat"} {
		t.Run("perftest/"+test+"/all", func(t *testing.T) { s.perftestAll(t, test, false, false) })
		t.Run("perftest-server/"+test+"/all", func(t *testing.T) { s.perftestAll(t, test, true, false) })
	}
	// And bidirectional (-b -a). siw's client only on a tap network: on
	// the user network the guest's network card stopped sending at 1-4 MiB
	// in two runs in a row, the second on a guest booted again
	// (docs/interop.md §13); on a tap it passed three runs in a row and
	// every suite since (2026-12-07).
	t.Run("perftest/write_bw/b_all", func(t *testing.T) { s.perftestAll(t, "write_bw", false, true) })
	if s.v.Net == guest.NetTap {
		t.Run("perftest-server/write_bw/b_all", func(t *testing.T) { s.perftestAll(t, "write_bw", true, true) })
	}

	// perftest's -q, -D and --report_gbits, both ways.
	for _, c := range flagCases {
		t.Run("perftest/"+c.test+"/"+c.name, func(t *testing.T) { s.perftestFlags(t, c, false) })
		t.Run("perftest-server/"+c.test+"/"+c.name, func(t *testing.T) { s.perftestFlags(t, c, true) })
	}

	// rdma-core's rdma_server and rdma_client, 20 sessions each way.
	t.Run("rdma_server/gowarp-client", s.rdmaServerClient)
	t.Run("rdma_client/gowarp-server", s.rdmaClientServer)
	// ucmatose: ten connections at once, a burst of Sends each way on each.
	t.Run("ucmatose/gowarp-client", s.ucmatoseServerClient)
	t.Run("ucmatose/gowarp-server", s.ucmatoseClientServer)

	// siw's Reads and Writes reaching detached regions and retired keys.
	t.Run("detached/siw-reads-and-writes", s.siwReachesDetached)

	// Terminate, both ways.
	t.Run("terminate/siw-sends", s.siwSendsTerminate)
	t.Run("terminate/gowarp-sends", s.gowarpSendsTerminate)
	t.Run("terminate/siw-sends-on-read", s.siwTerminatesRead)
}

type suite struct {
	v   *vm
	bin string
	sum *summary
	// For restartGuest: the image, and the suite's own test, whose life
	// the guest's log lines may outlast a scenario's.
	im       *guest.Image
	top      *testing.T
	restarts int
}

type pingCase struct {
	size, count int
	flags       []string
}

func (c pingCase) name(side string) string {
	n := fmt.Sprintf("%s/%dx%d", side, c.size, c.count)
	for _, f := range c.flags {
		n += strings.ReplaceAll(f, "-", "_")
	}
	return n
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// rpingLines returns the ping data lines of rping's or gowarp ping's -v
// output with the given prefix.
func rpingLines(out, prefix string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			lines = append(lines, strings.TrimPrefix(l, prefix))
		}
	}
	return lines
}

// wantPings checks that lines are the count pings of size bytes rping's
// client sends.
func wantPings(t *testing.T, who string, lines []string, size, count int) {
	t.Helper()
	if len(lines) != count {
		t.Errorf("%s printed %d pings, want %d", who, len(lines), count)
		return
	}
	buf := make([]byte, size)
	for i, l := range lines {
		rping.FillPing(buf, i)
		if l != string(rping.CString(buf)) {
			t.Errorf("%s ping %d: %.50q..., want %.50q...", who, i, l, rping.CString(buf))
			return
		}
	}
}

// hostClient: gowarp ping -c against rping -s in the guest.
func (s *suite) hostClient(t *testing.T, c pingCase) {
	ctx := ctxFor(t, 3*time.Minute)
	detail := fmt.Sprintf("%d B × %d %s", c.size, c.count, strings.Join(c.flags, " "))
	defer func() { s.sum.add(t, t.Name(), detail) }()
	// rping's server reads into and writes from a buffer of its own -S.
	v := ""
	if c.size <= 5000 {
		v = "-v"
	}
	job, err := s.v.server(ctx, guestRpingPort, fmt.Sprintf("rping -s -a %s -p %d %s -S %d", guestAddr, guestRpingPort, v, c.size), 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"ping", "-c", "-a", s.v.dialIP, "-p", strconv.Itoa(s.v.rping), "-v", "-V",
		"-C", strconv.Itoa(c.count), "-S", strconv.Itoa(c.size)}, c.flags...)
	h, err := startHost(ctx, s.bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := h.wait(ctx)
	if err != nil {
		t.Errorf("gowarp ping -c: %v\n%s", err, tail([]byte(out), 2000))
	}
	wantPings(t, "gowarp ping -c", rpingLines(out, "ping data: "), c.size, c.count)
	if i := strings.Index(out, "gowarp ping client: "); i >= 0 {
		line := strings.SplitN(out[i:], "\n", 2)[0]
		detail += ": " + line[strings.LastIndex(line, ": ")+2:]
	}
	rc, gout, err := job.wait(ctx)
	if err == nil {
		rc = rpingRC(t, "rping -s", rc, gout)
	}
	if err != nil || rc != 0 {
		t.Errorf("guest rping -s: rc %d, %v\n%s", rc, err, tail([]byte(gout), 2000))
	}
	if v != "" {
		wantPings(t, "guest rping -s", rpingLines(gout, "server ping data: "), c.size, c.count)
	}
}

// hostClientRev1: with MPA revision 1 there is no IRD/ORD exchange, and
// rping's server (which accepts with rdma_accept(id, NULL)) gets ORD 0
// from siw: the connection is made, the first Send arrives, and the
// server cannot post its RDMA Read.
func (s *suite) hostClientRev1(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	defer func() {
		s.sum.add(t, t.Name(), "MPA rev 1 accepted by siw; rping's server then has ORD 0 and cannot Read (expected refusal)")
	}()
	job := s.rpingServer(ctx, t)
	h, err := startHost(ctx, s.bin, "ping", "-c", "-a", s.v.dialIP, "-p", strconv.Itoa(s.v.rping), "-C", "1", "-mpa-rev", "1")
	if err != nil {
		t.Fatal(err)
	}
	out, err := h.wait(ctx)
	if err == nil {
		t.Errorf("gowarp ping -c with MPA revision 1 succeeded; siw's rping server was expected to fail its Read:\n%s", out)
	}
	rc, gout, _ := job.wait(ctx)
	if rc == 0 || !strings.Contains(gout, "post send error") {
		t.Errorf("guest rping -s: rc %d, want a failed RDMA Read post:\n%s", rc, gout)
	}
	if os.Getenv("GOWARP_SIWVM_DEBUG") != "" {
		t.Logf("siw's debug log: %s", s.v.dmesg(ctx, "readq_init: ORD 0, IRD 0"))
	}
}

// privateDataTooLong: siw drops an MPA request with more than 256 bytes
// of private data, so 253 bytes after the IRD/ORD block are refused.
func (s *suite) privateDataTooLong(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	defer func() {
		s.sum.add(t, t.Name(), "253 B refused by siw (connection closed), then 252 B accepted by the same server")
	}()
	job := s.rpingServer(ctx, t)
	h, err := startHost(ctx, s.bin, "ping", "-c", "-a", s.v.dialIP, "-p", strconv.Itoa(s.v.rping), "-C", "1", "-pd", "253")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := h.wait(ctx); err == nil {
		t.Errorf("253 bytes of private data were accepted:\n%s", out)
	}
	// The server still listens: a valid client lets it finish.
	h, err = startHost(ctx, s.bin, "ping", "-c", "-a", s.v.dialIP, "-p", strconv.Itoa(s.v.rping), "-C", "1", "-V", "-pd", "252")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := h.wait(ctx); err != nil {
		t.Errorf("252 bytes of private data: %v\n%s", err, out)
	}
	if rc, gout, err := job.wait(ctx); err != nil || rpingRC(t, "rping -s", rc, gout) != 0 {
		t.Errorf("guest rping -s: rc %d, %v\n%s", rc, err, gout)
	}
}

// guestClient: rping -c in the guest against gowarp ping -s.
func (s *suite) guestClient(t *testing.T, c pingCase) {
	ctx := ctxFor(t, 3*time.Minute)
	defer func() {
		s.sum.add(t, t.Name(), fmt.Sprintf("%d B × %d %s", c.size, c.count, strings.Join(c.flags, " ")))
	}()
	args := append([]string{"ping", "-s", "-a", s.v.listenIP, "-p", strconv.Itoa(s.v.serve), "-v"}, c.flags...)
	h, err := startHost(ctx, s.bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	if !waitListen(ctx, s.v.serve, 30*time.Second) {
		t.Errorf("the host server does not listen on port %d after 30 s", s.v.serve)
	}
	v := ""
	if c.size <= 5000 {
		v = "-v"
	}
	cmd := fmt.Sprintf("rping -c -a %s -p %d %s -V -C %d -S %d %s", hostFromGuest, s.v.serve, v, c.count, c.size, stderr)
	// A run takes seconds; 75 s leaves room for one more within ctx.
	rc, gout, err := s.v.run(ctx, cmd, 75*time.Second)
	if err == nil && guestAddrBusy(rc, gout) {
		// EADDRNOTAVAIL from the guest's own connect (after which rping
		// hangs until killed): no SYN left the guest (seen once in a
		// loaded run, perhaps rdma_cm's random port colliding with one in
		// TIME_WAIT), so gowarp's server never saw it and still waits.
		// Once more, and said.
		t.Logf("guest rping -c could not connect (EADDRNOTAVAIL in the guest); once more")
		rc, gout, err = s.v.run(ctx, cmd, 75*time.Second)
	}
	if err == nil {
		rc = rpingRC(t, "rping -c", rc, gout)
	}
	wctx := ctx
	if err != nil || rc != 0 {
		t.Errorf("guest rping -c: rc %d, %v\n%s", rc, err, tail([]byte(gout), 2000))
		// gowarp's server may wait for a client that will not come: a
		// bounded wait, not the suite's (see perftestServerOnce).
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
	}
	if v != "" {
		wantPings(t, "guest rping -c", rpingLines(gout, "ping data: "), c.size, c.count)
	}
	out, err := h.wait(wctx)
	if err != nil {
		t.Errorf("gowarp ping -s: %v\n%s", err, tail([]byte(out), 2000))
	}
	wantPings(t, "gowarp ping -s", rpingLines(out, "server ping data: "), c.size, c.count)
}

type perfCase struct {
	test        string
	iters, size int
	flags       []string
}

func (c perfCase) name() string {
	c = c.sized()
	n := fmt.Sprintf("perftest/%s/%dx%d", c.test, c.size, c.iters)
	for _, f := range c.flags {
		n += strings.ReplaceAll(f, "-", "_")
	}
	return n
}

var reportLine = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)`)

// perftest: ib_*_bw -R in the guest, gowarp perftest as its client.
// A send_bw run that siw ends by miscounting a Send's FPDU, a bug of its
// receive path (docs/interop.md §11), is run once more; every other
// failure counts.
func (s *suite) perftest(t *testing.T, c perfCase) {
	if c.size == 0 {
		c.size = 65536
	}
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	detail = s.withRetry(t, c.test == "send_bw", func(ctx context.Context) (string, []string) { return s.perftestOnce(ctx, t, c) })
}

// moMiscount matches siw's complaint when it has taken 1 to 3 bytes of a
// Send's payload for header (a header split 17-19 bytes into an skb): the
// next FPDU's MO is that much more than what siw counts as placed.
var moMiscount = regexp.MustCompile(`send mo: (\d+) != (\d+)`)

// siwMOMiscounts counts siw's "send mo: N != N-k" lines, 1 ≤ k ≤ 3, in the
// guest's log.
func (s *suite) siwMOMiscounts() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := 0
	for _, m := range moMiscount.FindAllStringSubmatch(s.v.dmesg(ctx, "send mo: "), -1) {
		a, _ := strconv.Atoi(m[1])
		b, _ := strconv.Atoi(m[2])
		if k := a - b; k >= 1 && k <= 3 {
			n++
		}
	}
	return n
}

// hostClientGuestServer runs ib_<test> -R in the guest as the server and
// gowarp perftest on the host as its client, and returns what each
// printed; a failure of either goes to fail.
func (s *suite) hostClientGuestServer(ctx context.Context, c perfCase, fail func(format string, a ...any)) (string, string) {
	sized := []string{"-n", strconv.Itoa(c.iters), "-s", strconv.Itoa(c.size)}
	out, gout, problems := s.perftestBothOnce(ctx, c.test, false, slices.Concat(sized, c.flags), sized)
	for _, p := range problems {
		fail("%s", p)
	}
	return out, gout
}

// perftestOnce runs one perftest scenario and returns its detail line and
// what went wrong, if anything.
func (s *suite) perftestOnce(ctx context.Context, t *testing.T, c perfCase) (detail string, problems []string) {
	fail := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	out, gout := s.hostClientGuestServer(ctx, c, fail)
	mine, theirs := reportLine.FindStringSubmatch(out), reportLine.FindStringSubmatch(gout)
	if mine == nil || theirs == nil {
		fail("no result line:\ngowarp:\n%s\nguest:\n%s", out, gout)
		return "", problems
	}
	detail = fmt.Sprintf("gowarp measured %s MB/s avg (peak %s); siw's server printed %s MB/s avg (peak %s)", mine[4], mine[3], theirs[4], theirs[3])
	if mine[1] != theirs[1] || mine[2] != theirs[2] {
		fail("gowarp ran %s × %s, the server %s × %s", mine[1], mine[2], theirs[1], theirs[2])
	}
	if mine[1] != strconv.Itoa(c.size) || mine[2] != strconv.Itoa(c.iters) {
		fail("gowarp's report is for %s × %s, want %d × %d", mine[1], mine[2], c.size, c.iters)
	}
	if c.test != "send_bw" {
		// The write_bw and read_bw servers print the client's report,
		// received over the control connection.
		if mine[3] != theirs[3] || mine[4] != theirs[4] || mine[5] != theirs[5] {
			fail("server printed %v, gowarp sent %v", theirs[1:], mine[1:])
		}
	} else if bw, _ := strconv.ParseFloat(theirs[4], 64); bw <= 0 {
		if perftestNoClock.MatchString(gout) {
			// perftest found its cycle counter unusable against the
			// clock (a stall of the emulated guest) and prints 0 for every
			// rate: its count of messages received, checked above, is
			// what it can still tell.
			detail += "; siw's server could not calibrate its clock (perftest: r^2 < 0.9), so its rates read 0"
		} else {
			fail("send_bw server measured %s MB/s", theirs[4])
		}
	}
	return detail, problems
}

// perftestNoClock is perftest's warning that its CPU frequency estimate
// failed (get_cpu_mhz), after which it reports every rate as 0.
var perftestNoClock = regexp.MustCompile(`Correlation coefficient r\^2: [0-9.e-]+ < 0\.9`)

// latLineNoClock is a latency test's result line when perftest's clock
// estimate failed: size and count, then inf where the figures go.
var latLineNoClock = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+inf\s+inf\s+inf\b`)

// rpingServer starts a 64-byte rping server in the guest.
func (s *suite) rpingServer(ctx context.Context, t *testing.T) *guestJob {
	job, err := s.v.server(ctx, guestRpingPort, fmt.Sprintf("rping -s -a %s -p %d -S 64", guestAddr, guestRpingPort), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// connectToGuestRping connects a gowarp queue pair to a guest rping
// server and waits until siw has surely handed the socket to its queue
// pair (see docs/interop.md on siw's accept race).
func (s *suite) connectToGuestRping(ctx context.Context, t *testing.T) (*gowarp.QP, *gowarp.PD, *gowarp.CQ, *guestJob) {
	job := s.rpingServer(ctx, t)
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(64)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qp.Close() })
	if err := qp.Connect(ctx, net.JoinHostPort(s.v.dialIP, strconv.Itoa(s.v.rping)), gowarp.ConnectOptions{NoP2P: true, IRD: 1, ORD: 1}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	return qp, pd, cq, job
}

func waitQPError(ctx context.Context, qp *gowarp.QP) error {
	for qp.State() != gowarp.StateError {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return qp.Err()
}

// badSTag posts op, signaled with ID id, against an STag siw never issued
// on a connection to a guest rping server, and waits for the queue pair to
// fail. It returns the Terminate error in the failure if any, the CQ, the
// rping job and the failure.
func (s *suite) badSTag(ctx context.Context, t *testing.T, op gowarp.WROp, id uint64) (*wire.TermError, *gowarp.CQ, *guestJob, error) {
	qp, pd, cq, job := s.connectToGuestRping(ctx, t)
	mr, err := pd.Register(make([]byte, 16), gowarp.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.PostSend(&gowarp.SendWR{ID: id, Op: op, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: mr, Length: 16}}, RemoteAddr: 0x1000, RKey: 0xbad57a00}); err != nil {
		t.Fatal(err)
	}
	err = waitQPError(ctx, qp)
	var te *wire.TermError
	if !errors.As(err, &te) {
		te = nil
	}
	return te, cq, job, err
}

// siwSendsTerminate: an RDMA Write to an STag siw never issued draws
// siw's Terminate (DDP, tagged buffer error, invalid STag), which gowarp
// decodes and reports.
func (s *suite) siwSendsTerminate(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	te, _, job, err := s.badSTag(ctx, t, gowarp.OpWrite, 7)
	switch {
	case !errors.Is(err, gowarp.ErrPeerTerminated):
		t.Errorf("queue pair error %v, want the peer's Terminate", err)
	case te == nil:
		t.Errorf("queue pair error %v carries no Terminate error", err)
	case te.Layer != wire.LayerDDP || !errors.Is(err, wire.ErrDDPInvalidSTag):
		t.Errorf("siw's Terminate %v (layer %v type %d code %#x), want DDP tagged invalid STag", te, te.Layer, te.Type, te.Code)
	default:
		detail = fmt.Sprintf("siw answered a Write to STag 0xbad57a00 with Terminate: %v", te)
	}
	rc, gout, _ := job.wait(ctx)
	t.Logf("guest rping -s rc %d: %s", rc, strings.TrimSpace(gout))
	detail += fmt.Sprintf("; rping -s exited %d", rc)
}

// siwTerminatesRead: an RDMA Read of an STag siw never issued draws an
// RDMAP protection Terminate that echoes the Read Request.
func (s *suite) siwTerminatesRead(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	te, cq, job, err := s.badSTag(ctx, t, gowarp.OpRead, 8)
	if !errors.Is(err, gowarp.ErrPeerTerminated) || te == nil || te.Layer != wire.LayerRDMAP {
		t.Errorf("queue pair error %v, want siw's RDMAP Terminate", err)
	} else {
		detail = fmt.Sprintf("siw answered a Read of STag 0xbad57a00 with Terminate: %v", te)
	}
	var wc [4]gowarp.Completion
	if n := cq.Poll(wc[:]); n == 0 || wc[0].ID != 8 || wc[0].Status != gowarp.RemoteAccessError {
		t.Errorf("Read completion %+v, want remote access error (queue pair: %v)", wc[:n], err)
	}
	rc, _, _ := job.wait(ctx)
	detail += fmt.Sprintf("; rping -s exited %d", rc)
}

// gowarpSendsTerminate: a gowarp server that posts no receive answers
// siw's first Send with a Terminate (DDP, untagged buffer error, no
// buffer available). siw logs it (decoding the RFC's layout with Layer and
// EType swapped: "layer 2, type 1, code 2") and tears the connection
// down; rping's client sees a disconnect before its first ping completes
// (and, since it ends in the DISCONNECTED state, exits 0).
func (s *suite) gowarpSendsTerminate(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	dev := gowarp.Open()
	ln, err := dev.Listen(net.JoinHostPort(s.v.listenIP, strconv.Itoa(s.v.serve)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	qpc := make(chan *gowarp.QP, 1)
	errc := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			errc <- err
			return
		}
		pd := dev.AllocPD()
		cq := dev.NewCQ(16)
		qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			errc <- err
			return
		}
		qpc <- qp
		errc <- req.Accept(ctx, qp, gowarp.ConnectOptions{})
	}()
	script := fmt.Sprintf(`before=$(dmesg | grep -c 'got TERMINATE')
rping -c -a %s -p %d -v -C 1 -S 64 2>&1
rc=$?
echo "rping rc=$rc"
sleep 1
echo "siw TERMINATEs logged: $(( $(dmesg | grep -c 'got TERMINATE') - before ))"
dmesg | grep 'got TERMINATE' | tail -1
exit $rc`, hostFromGuest, s.v.serve)
	rc, gout, err := s.v.run(ctx, script, 40*time.Second)
	if err == nil && guestAddrBusy(rc, gout) {
		// The guest's connect found no local address, and rping hung
		// until the job's timeout: nothing reached gowarp's listener,
		// which still waits (as in rpingClient; docs/interop.md §1).
		t.Logf("guest rping -c could not connect (EADDRNOTAVAIL in the guest); once more")
		_, gout, err = s.v.run(ctx, script, 40*time.Second)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("accept: %v", err)
	}
	qp := <-qpc
	defer qp.Close()
	qerr := waitQPError(ctx, qp)
	if !errors.Is(qerr, gowarp.ErrTerminated) || !errors.Is(qerr, wire.ErrDDPNoBuffer) {
		t.Errorf("gowarp queue pair error %v, want a Terminate sent for a Send with no receive", qerr)
	}
	if !strings.Contains(gout, "siw TERMINATEs logged: 1") || !strings.Contains(gout, "got TERMINATE. layer 2, type 1, code 2") {
		t.Errorf("siw did not log gowarp's Terminate:\n%s", gout)
	}
	if strings.Contains(gout, "ping data:") {
		t.Errorf("rping's ping completed:\n%s", gout)
	}
	logged := ""
	if i := strings.Index(gout, "siw: got TERMINATE"); i >= 0 {
		logged = strings.TrimSpace(strings.SplitN(gout[i:], "\n", 2)[0])
	}
	detail = fmt.Sprintf("gowarp sent Terminate (%v); siw logged %q; rping -c stopped before its first ping", wire.ErrDDPNoBuffer, logged)
}
