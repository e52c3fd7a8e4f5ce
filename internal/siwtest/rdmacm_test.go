package siwtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rdma_server and rdma_client (rdma-core's librdmacm/examples) exchange one
// 16-byte Send each way: the client sends first, the server answers, both
// disconnect; rdma_server serves one client and exits. gowarp's side is
// the example written to match them, examples/sendrecv.
const rdmaSessions = 20

// buildExample builds examples/name.
func buildExample(t *testing.T, name string) string {
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/gowarp/gowarp/examples/"+name).CombinedOutput(); err != nil {
		t.Fatalf("building examples/%s: %v\n%s", name, err, out)
	}
	return bin
}

var wokeLine = regexp.MustCompile(`woke the server with (\d+) zero-length Writes`)

// rdmaServerClient: 20 sessions of gowarp's sendrecv client against
// rdma_server in the guest, each sending its request as soon as it is
// connected. Without the queue pair's nudges (GOWARP_SIWVM_NONUDGE=1
// passes -nonudge and shows it) siw's responder misses the request in
// some session and rdma_server waits for it forever (docs/interop.md §1).
func (s *suite) rdmaServerClient(t *testing.T) {
	ctx := ctxFor(t, 8*time.Minute)
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	bin := buildExample(t, "sendrecv")
	noNudge := os.Getenv("GOWARP_SIWVM_NONUDGE") != ""
	nudges, nudged, done := 0, 0, 0
	for i := range rdmaSessions {
		job, err := s.v.server(ctx, guestRpingPort, fmt.Sprintf("rdma_server -p %d", guestRpingPort), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		// siw answers within milliseconds; 10 s without a reply is the
		// hang of docs/interop.md §1.
		args := []string{"client", "-s", s.v.dialIP, "-p", strconv.Itoa(s.v.rping),
			"-msg", fmt.Sprintf("request %d", i), "-timeout", "10s"}
		if noNudge {
			args = append(args, "-nonudge")
		}
		h, err := startHost(ctx, bin, args...)
		if err != nil {
			t.Fatal(err)
		}
		out, err := h.wait(ctx)
		if m := wokeLine.FindStringSubmatch(out); m != nil {
			n, _ := strconv.Atoi(m[1])
			nudges += n
			nudged++
		}
		if err != nil || !strings.Contains(out, "reply: \"\" (16 bytes)") {
			t.Errorf("session %d of %d (-nonudge %v): sendrecv client: %v\n%s", i+1, rdmaSessions, noNudge, err, out)
			break // rdma_server stays stuck; its job's time limit ends it
		}
		rc, gout, err := job.wait(ctx)
		if err != nil || rc != 0 || !strings.Contains(gout, "rdma_server: end 0") {
			t.Errorf("session %d: guest rdma_server: rc %d, %v\n%s", i+1, rc, err, gout)
			break
		}
		done++
	}
	detail = fmt.Sprintf("examples/sendrecv client: %d of %d sessions, request sent at once; %d needed nudges (%d zero-length Writes)", done, rdmaSessions, nudged, nudges)
	if noNudge {
		detail += "; -nonudge"
	}
}

// rdmaClientServer: rdma_client in the guest, 20 times, against gowarp's
// sendrecv server on the host.
func (s *suite) rdmaClientServer(t *testing.T) {
	ctx := ctxFor(t, 8*time.Minute)
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	bin := buildExample(t, "sendrecv")
	h, err := startHost(ctx, bin, "server", "-a", s.v.listenIP, "-p", strconv.Itoa(s.v.serve), "-n", strconv.Itoa(rdmaSessions))
	if err != nil {
		t.Fatal(err)
	}
	if !waitListen(ctx, s.v.serve, 30*time.Second) {
		t.Errorf("the host server does not listen on port %d after 30 s", s.v.serve)
	}
	// rdma_connect in the guest now and then fails at once with
	// EADDRNOTAVAIL (seen in 1 of about 8 suite runs, at session 5): the
	// local port rdma_cm picked could not be bound for siw's TCP
	// connection, so nothing reached gowarp. That session runs once more,
	// and the report says so; any other failure, or that one twice, fails.
	script := fmt.Sprintf(`c() { rdma_client -s %s -p %d 2>&1; }
for i in $(seq %d); do
  out=$(c); rc=$?; echo "$out"
  if [ $rc -ne 0 ] && echo "$out" | grep -q "rdma_connect: Cannot assign requested address"; then
    echo "rdma_client $i: local bind refused (EADDRNOTAVAIL), once more"; out=$(c); rc=$?; echo "$out"
  fi
  [ $rc -eq 0 ] || { echo "rdma_client $i failed: $rc"; exit 1; }
done`, hostFromGuest, s.v.serve, rdmaSessions)
	rc, gout, err := s.v.run(ctx, script, 5*time.Minute)
	if err != nil || rc != 0 {
		t.Errorf("guest rdma_client loop: rc %d, %v\n%s", rc, err, tail([]byte(gout), 2000))
	}
	ends := strings.Count(gout, "rdma_client: end 0")
	wctx := ctx
	if err != nil || rc != 0 {
		// The server waits for sessions that will not come: a few seconds
		// for the ones under way, not the scenario's whole time.
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	out, err := h.wait(wctx)
	if err != nil {
		t.Errorf("sendrecv server: %v\n%s", err, tail([]byte(out), 2000))
	}
	served := strings.Count(out, "(16 bytes)")
	if ends != rdmaSessions || served != rdmaSessions {
		t.Errorf("%d rdma_client runs ended well and gowarp's server answered %d, want %d each:\n%s\n%s", ends, served, rdmaSessions, tail([]byte(gout), 1500), tail([]byte(out), 1500))
	}
	detail = fmt.Sprintf("%d of %d rdma_client sessions answered by examples/sendrecv server", served, rdmaSessions)
	if n := strings.Count(gout, "once more"); n > 0 {
		detail += fmt.Sprintf(" (%d run again after the guest's rdma_connect could not bind its port)", n)
	}
}

// ucmatose (rdma-core's cmatose.c) opens many connections at once; its
// server sends a burst of messages on each as soon as all are up, its
// client answers each burst with one of its own, and the server
// disconnects them all. gowarp's side is examples/cmatose.
var ucmatoseArgs = []string{"-c", "10", "-C", "50", "-S", "5000"}

// ucmatoseServerClient: gowarp's cmatose client against ucmatose in the
// guest, offering peer-to-peer mode (siw takes it) and not (the guest's
// server then sends first, which siw allows).
func (s *suite) ucmatoseServerClient(t *testing.T) {
	ctx := ctxFor(t, 6*time.Minute)
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	bin := buildExample(t, "cmatose")
	for _, p2p := range []bool{true, false} {
		job, err := s.v.server(ctx, guestRpingPort, fmt.Sprintf("stdbuf -oL ucmatose -p %d %s", guestRpingPort, strings.Join(ucmatoseArgs, " ")), 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		args := append([]string{"client", "-s", s.v.dialIP, "-p", strconv.Itoa(s.v.rping), "-timeout", "90s"}, ucmatoseArgs...)
		if !p2p {
			args = append(args, "-nop2p")
		}
		h, err := startHost(ctx, bin, args...)
		if err != nil {
			t.Fatal(err)
		}
		out, herr := h.wait(ctx)
		rc, gout, gerr := job.wait(ctx)
		if herr != nil || !strings.Contains(out, "data transfers complete: 50 messages of 5000 bytes each way on each of 10 connections") {
			t.Errorf("p2p %v: cmatose client: %v\n%s\nguest ucmatose:\n%s", p2p, herr, tail([]byte(out), 2000), tail([]byte(gout), 1500))
			return
		}
		if gerr != nil || rc != 0 || !strings.Contains(gout, "data transfers complete") || !strings.Contains(gout, "return status 0") {
			t.Errorf("p2p %v: guest ucmatose: rc %d, %v\n%s", p2p, rc, gerr, gout)
			return
		}
	}
	detail = "examples/cmatose client, 10 connections × 50 Sends of 5000 B each way, with and without peer-to-peer mode"
}

// ucmatoseClientServer: ucmatose's client in the guest against gowarp's
// cmatose server, twice, the second time with CRC.
func (s *suite) ucmatoseClientServer(t *testing.T) {
	ctx := ctxFor(t, 6*time.Minute)
	var detail string
	defer func() { s.sum.add(t, t.Name(), detail) }()
	bin := buildExample(t, "cmatose")
	for _, crc := range []bool{false, true} {
		args := append([]string{"server", "-a", s.v.listenIP, "-p", strconv.Itoa(s.v.serve), "-timeout", "90s"}, ucmatoseArgs...)
		if crc {
			args = append(args, "-crc")
		}
		h, err := startHost(ctx, bin, args...)
		if err != nil {
			t.Fatal(err)
		}
		if !waitListen(ctx, s.v.serve, 30*time.Second) {
			t.Fatalf("the host server does not listen on port %d after 30 s", s.v.serve)
		}
		rc, gout, gerr := s.v.run(ctx, fmt.Sprintf("stdbuf -oL ucmatose -s %s -p %d %s", hostFromGuest, s.v.serve, strings.Join(ucmatoseArgs, " ")), 2*time.Minute)
		out, herr := h.wait(ctx)
		if gerr != nil || rc != 0 || !strings.Contains(gout, "data transfers complete") || !strings.Contains(gout, "return status 0") {
			t.Errorf("crc %v: guest ucmatose: rc %d, %v\n%s\ncmatose server:\n%s", crc, rc, gerr, gout, tail([]byte(out), 2000))
			return
		}
		if herr != nil || !strings.Contains(out, "data transfers complete: 50 messages of 5000 bytes") || !strings.Contains(out, "disconnected") {
			t.Errorf("crc %v: cmatose server: %v\n%s", crc, herr, tail([]byte(out), 2000))
			return
		}
	}
	detail = "10 ucmatose connections × 50 Sends of 5000 B each way against examples/cmatose server, with and without CRC"
}
