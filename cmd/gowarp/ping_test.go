package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp/wire"
)

// lockedBuf is an output buffer for a command running in a goroutine.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// pingPair runs gowarp ping with server's flags and client's on
// 127.0.0.1 and a free port, the client until the server listens; both
// must exit 0. It returns their output.
func pingPair(ctx context.Context, t *testing.T, server, client []string) (sout, cout string) {
	t.Helper()
	at := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(freePort(t))}
	var so, serr lockedBuf
	done := make(chan int, 1)
	go func() { done <- dispatch(ctx, slices.Concat([]string{"ping"}, server, at), &so, &serr) }()
	var co, cerr lockedBuf
	var code int
	for range 50 { // until the server listens
		co, cerr = lockedBuf{}, lockedBuf{}
		if code = dispatch(ctx, slices.Concat([]string{"ping"}, client, at), &co, &cerr); code == 0 ||
			!strings.Contains(cerr.String(), "connection refused") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != 0 {
		t.Fatalf("client exit %d: %s", code, cerr.String())
	}
	if c := <-done; c != 0 {
		t.Fatalf("server exit %d: %s", c, serr.String())
	}
	return so.String(), co.String()
}

// TestPingCommand runs gowarp ping -s and -c against each other, with
// rping's clustered flags.
func TestPingCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sout, cout := pingPair(ctx, t, []string{"-sv", "-crc"}, []string{"-c", "-vV", "-C", "3", "-S", "100"})
	if n := strings.Count(cout, "ping data: rdma-ping-"); n != 3 {
		t.Errorf("client printed %d pings:\n%s", n, cout)
	}
	if n := strings.Count(sout, "server ping data: rdma-ping-"); n != 3 {
		t.Errorf("server printed %d pings:\n%s", n, sout)
	}
	for _, out := range []string{cout, sout} {
		if !strings.Contains(out, "3 pings") {
			t.Errorf("no summary line:\n%s", out)
		}
	}
}

// TestPingSource: -I is rping's client source address. The server's
// summary names the client by it; a source that is not the machine's
// fails the client with the dial's reason.
func TestPingSource(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sout, _ := pingPair(ctx, t, []string{"-s"}, []string{"-c", "-V", "-I", "127.0.0.2", "-C", "2"})
	if !strings.Contains(sout, "gowarp ping server: 127.0.0.2:") || !strings.Contains(sout, "2 pings") {
		t.Errorf("server's summary does not name the source 127.0.0.2:\n%s", sout)
	}

	// 192.0.2.1 (TEST-NET-1) is no address of this machine.
	port := strconv.Itoa(freePort(t))
	var cout, cerr lockedBuf
	code := dispatch(ctx, []string{"ping", "-c", "-I", "192.0.2.1", "-a", "127.0.0.1", "-p", port, "-C", "1"}, &cout, &cerr)
	if code != 1 || !strings.Contains(cerr.String(), "connect from 192.0.2.1") || !strings.Contains(cerr.String(), "assign requested address") {
		t.Errorf("client from a foreign source: exit %d, %q", code, cerr.String())
	}
	cout, cerr = lockedBuf{}, lockedBuf{}
	code = dispatch(ctx, []string{"ping", "-c", "-I", "no-such-host.invalid", "-a", "127.0.0.1", "-p", port, "-C", "1"}, &cout, &cerr)
	if code != 1 || !strings.Contains(cerr.String(), `source address "no-such-host.invalid"`) {
		t.Errorf("client from an unknown host name: exit %d, %q", code, cerr.String())
	}
}

func TestPingUsage(t *testing.T) {
	for _, args := range [][]string{
		{"ping"},                   // neither -s nor -c
		{"ping", "-s", "-c"},       // both
		{"ping", "-c"},             // no address
		{"ping", "-s", "-S", "10"}, // below rping's minimum size
		{"ping", "-s", "-S", "70000"},
		{"ping", "-c", "-a", "x", "extra"},
		{"ping", "-s", "-I", "127.0.0.1"}, // a client's flag
	} {
		var out, errb lockedBuf
		if code := dispatch(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errb.String())
		}
	}
}

func TestSplitShortFlags(t *testing.T) {
	got := splitShortFlags([]string{"-sP", "-vV", "-C", "5", "-p", "7174", "-crc", "--", "-vV"})
	want := []string{"-s", "-P", "-v", "-V", "-C", "5", "-p", "7174", "-crc", "--", "-vV"}
	if !slices.Equal(got, want) {
		t.Errorf("splitShortFlags = %q, want %q", got, want)
	}
}

func TestPerftestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"perftest"},
		{"perftest", "127.0.0.1"},
		{"perftest", "write_bw", "a", "b"},
		{"perftest", "-test", "lat", "127.0.0.1"},
		{"perftest", "-s", "-1", "write_lat"},
		{"perftest", "-n", "2", "write_lat", "127.0.0.1"},
	} {
		var out, errb lockedBuf
		if code := dispatch(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errb.String())
		}
	}
	// An unreachable server is a failure, not a usage error.
	var out, errb lockedBuf
	port := strconv.Itoa(freePort(t))
	if code := dispatch(context.Background(), []string{"perftest", "-settle", "0", "write_bw", "127.0.0.1:" + port}, &out, &errb); code != 1 {
		t.Errorf("against no server: exit %d, want 1 (%s)", code, errb.String())
	}
}

// TestPingZeroReads: -ird 0 -ord 0 puts IRD/ORD 0 in the client's MPA
// request (0 is none on the command line, as in rdma_cm's conn_param).
func TestPingZeroReads(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan wire.MPAFrame, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		hdr := make([]byte, wire.MPAHeaderLen)
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		n, _ := wire.MPAFrameLen(hdr)
		b := append(hdr, make([]byte, n-len(hdr))...)
		io.ReadFull(c, b[len(hdr):])
		f, _, _ := wire.ParseMPAFrame(b)
		got <- f
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	var out, errb lockedBuf
	dispatch(ctx, []string{"ping", "-c", "-a", "127.0.0.1", "-p", port, "-C", "1", "-ird", "0", "-ord", "0"}, &out, &errb)
	select {
	case f := <-got:
		if !f.Enhanced || f.IRD != 0 || f.ORD != 0 {
			t.Fatalf("request IRD/ORD %d/%d (enhanced %v), want 0/0", f.IRD, f.ORD, f.Enhanced)
		}
	case <-ctx.Done():
		t.Fatal("no request")
	}
}
