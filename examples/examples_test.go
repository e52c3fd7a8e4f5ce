// Package examples_test builds every example and runs its server and
// client as two processes over loopback, so that none rots.
package examples_test

import (
	"bufio"
	"context"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/testwatch"
)

var examples = []string{"sendrecv", "readbuf", "writenotify", "sharedcq", "tlswrite", "cmatose"}

var (
	buildFlags []string // more flags for go build
	buildOnce  sync.Once
	binDir     string
	buildErr   error
)

// bin builds every example once and returns the path of one.
func bin(t *testing.T, name string) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "gowarp-examples")
		if buildErr != nil {
			return
		}
		args := append([]string{"build"}, buildFlags...)
		args = append(args, "-o", binDir+string(filepath.Separator))
		for _, e := range examples {
			args = append(args, "./"+e)
		}
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			buildErr = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, name)
}

func TestMain(m *testing.M) {
	code := testwatch.Run(m)
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// TestExamplesUsePublicAPI: each example is a documented package main
// that imports the standard library and github.com/gowarp/gowarp only.
func TestExamplesUsePublicAPI(t *testing.T) {
	for _, e := range examples {
		files, err := filepath.Glob(filepath.Join(e, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", e, err)
		}
		for _, f := range files {
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if af.Name.Name != "main" {
				t.Errorf("%s: package %s, want main", f, af.Name.Name)
			}
			if filepath.Base(f) == "main.go" && (af.Doc == nil || !strings.HasPrefix(af.Doc.Text(), "Command "+e+" ")) {
				t.Errorf("%s: no doc comment starting \"Command %s\"", f, e)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if p != "github.com/gowarp/gowarp" && strings.Contains(strings.Split(p, "/")[0], ".") {
					t.Errorf("%s imports %s: examples use the standard library and github.com/gowarp/gowarp only", f, p)
				}
				if strings.HasPrefix(p, "github.com/gowarp/gowarp/") {
					t.Errorf("%s imports %s: examples use the public API (github.com/gowarp/gowarp) only", f, p)
				}
			}
		}
	}
}

// proc is a running example.
type proc struct {
	cmd  *exec.Cmd
	out  strings.Builder // stdout and stderr
	mu   sync.Mutex
	done chan struct{}
	err  error
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// start runs the example name with args; it is killed at the end of the
// test if still running.
func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	path := bin(t, name) // first: on a busy machine the build alone took over a minute
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	p := &proc{cmd: exec.CommandContext(ctx, path, args...), done: make(chan struct{})}
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
	}()
	go func() {
		p.err = p.cmd.Wait()
		w.Close()
		<-lines
		cancel()
		close(p.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

// wait waits for p to exit and returns its exit code and output.
func (p *proc) wait(t *testing.T) (int, string) {
	t.Helper()
	<-p.done
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0, p.output()
	case errors.As(p.err, &ee) && ee.Exited():
		return ee.ExitCode(), p.output()
	}
	t.Fatalf("%s: %v\n%s", p.cmd.Path, p.err, p.output())
	return -1, ""
}

// run runs an example to its end and checks it exits 0.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	code, out := start(t, name, args...).wait(t)
	if code != 0 {
		t.Fatalf("%s %q: exit %d\n%s", name, args, code, out)
	}
	return out
}

// server starts an example's server on a free loopback port and returns
// it and the port, once it listens.
func server(t *testing.T, name string, args ...string) (*proc, string) {
	t.Helper()
	p := start(t, name, append([]string{"server", "-a", "127.0.0.1", "-p", "0"}, args...)...)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		out := p.output()
		if _, rest, ok := strings.Cut(out, "listening on "); ok {
			addr, _, _ := strings.Cut(rest, "\n")
			if _, port, err := net.SplitHostPort(addr); err == nil && strings.HasSuffix(out, "\n") {
				return p, port
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s server exited: %s", name, out)
		default:
		}
	}
	t.Fatalf("%s server does not listen: %s", name, p.output())
	return nil, ""
}

func contains(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("%s output lacks %q:\n%s", what, w, out)
		}
	}
}

func TestSendRecv(t *testing.T) {
	srv, port := server(t, "sendrecv", "-n", "3")
	out := run(t, "sendrecv", "client", "-p", port)
	contains(t, "client", out, `reply: "HELLO, SERVER" (16 bytes)`)
	// CRC, and peer-to-peer mode.
	out = run(t, "sendrecv", "client", "-p", port, "-crc", "-msg", "with CRC")
	contains(t, "client", out, `reply: "WITH CRC" (16 bytes)`)
	out = run(t, "sendrecv", "client", "-p", port, "-p2p", "-msg", "p2p")
	contains(t, "client", out, `reply: "P2P" (16 bytes)`)
	code, sout := srv.wait(t)
	if code != 0 {
		t.Fatalf("server exit %d:\n%s", code, sout)
	}
	contains(t, "server", sout, `: "hello, server" (16 bytes)`, `: "with CRC" (16 bytes)`, `: "p2p" (16 bytes)`)

	// Another size, on both sides.
	srv, port = server(t, "sendrecv", "-size", "64")
	out = run(t, "sendrecv", "client", "-p", port, "-size", "64", "-msg", "a request longer than sixteen bytes")
	contains(t, "client", out, `reply: "A REQUEST LONGER THAN SIXTEEN BYTES" (64 bytes)`)
	if code, sout := srv.wait(t); code != 0 {
		t.Fatalf("server exit %d:\n%s", code, sout)
	}
}

// TestSendRecvTooBig: a request bigger than the server's receive fails on
// both sides, saying why (the server's Terminate), and neither hangs.
func TestSendRecvTooBig(t *testing.T) {
	srv, port := server(t, "sendrecv")
	code, out := start(t, "sendrecv", "client", "-p", port, "-size", "64").wait(t)
	if code != 1 || !strings.Contains(out, "flushed") || !strings.Contains(out, "terminated") {
		t.Errorf("client: exit %d, %q; want 1 and the Terminate", code, out)
	}
	if code, out := srv.wait(t); code != 1 {
		t.Errorf("server: exit %d, %q; want 1", code, out)
	}
}

func TestReadBuf(t *testing.T) {
	srv, port := server(t, "readbuf", "-text", "one-sided")
	out := run(t, "readbuf", "client", "-p", port)
	contains(t, "client", out, `read 9 bytes: "one-sided"`)
	code, sout := srv.wait(t)
	if code != 0 {
		t.Fatalf("server exit %d:\n%s", code, sout)
	}
	contains(t, "server", sout, "advertised 9 bytes at 0x", "client gone: ")
}

func TestWriteNotify(t *testing.T) {
	srv, port := server(t, "writenotify")
	out := run(t, "writenotify", "client", "-p", port, "-text", "arrived before its notice")
	contains(t, "client", out, "wrote 25 bytes and sent the notice")
	code, sout := srv.wait(t)
	if code != 0 {
		t.Fatalf("server exit %d:\n%s", code, sout)
	}
	contains(t, "server", sout, `notified: 25 bytes at offset 64 (25 placed in all): "arrived before its notice"`)
}

// TestSharedCQ serves four clients from one CQ: three connections of one
// sharedcq client (on one CQ of its own) and a sendrecv client, at once.
func TestSharedCQ(t *testing.T) {
	srv, port := server(t, "sharedcq", "-n", "4")
	many := start(t, "sharedcq", "client", "-p", port, "-n", "3")
	one := run(t, "sendrecv", "client", "-p", port, "-msg", "sendrecv here")
	contains(t, "sendrecv client", one, `reply: "SENDRECV HERE"`)
	code, out := many.wait(t)
	if code != 0 {
		t.Fatalf("sharedcq client exit %d:\n%s", code, out)
	}
	contains(t, "sharedcq client", out, `connection 0: reply "CLIENT 0 HERE"`, `connection 1: reply "CLIENT 1 HERE"`, `connection 2: reply "CLIENT 2 HERE"`)
	code, sout := srv.wait(t)
	if code != 0 {
		t.Fatalf("server exit %d:\n%s", code, sout)
	}
	contains(t, "server", sout, `"client 0 here"`, `"client 1 here"`, `"client 2 here"`, `"sendrecv here"`, "served 4 clients from one CQ")
}

// TestCmatose: 20 connections at once, 20 messages of 5000 bytes each way on
// each (two FPDUs each), whole and in order; with the client offering
// peer-to-peer mode, without it (the server then sends first, as
// ucmatose's does), and with CRC.
func TestCmatose(t *testing.T) {
	for _, extra := range [][]string{nil, {"-nop2p"}, {"-crc"}} {
		args := append([]string{"-c", "20", "-C", "20", "-S", "5000", "-check"}, extra...)
		srv, port := server(t, "cmatose", args...)
		out := run(t, "cmatose", append([]string{"client", "-p", port}, args...)...)
		contains(t, "client", out, "data transfers complete: 20 messages of 5000 bytes each way on each of 20 connections")
		code, sout := srv.wait(t)
		if code != 0 {
			t.Fatalf("server %q: exit %d:\n%s", extra, code, sout)
		}
		contains(t, "server", sout, "20 connected", "data transfers complete", "disconnected")
	}
}

// TestCmatoseTooBig: server messages bigger than the client's receives
// fail both sides, saying why (the client's Terminate), and neither hangs.
func TestCmatoseTooBig(t *testing.T) {
	srv, port := server(t, "cmatose", "-c", "2", "-timeout", "20s")
	code, out := start(t, "cmatose", "client", "-p", port, "-c", "2", "-S", "50", "-timeout", "20s").wait(t)
	if code != 1 || !strings.Contains(out, "local length error") || !strings.Contains(out, "Send of at least 100 bytes into a receive of 50") {
		t.Errorf("client: exit %d, %q; want 1 and the short receive", code, out)
	}
	if code, out := srv.wait(t); code != 1 || !strings.Contains(out, "peer terminated") {
		t.Errorf("server: exit %d, %q; want 1 and the client's Terminate", code, out)
	}
}

// TestTLSWrite: Write, Read and Send over a TLS connection the example
// opens itself (ConnectConn, ListenOn); the server first drops a client
// that speaks gowarp without TLS and a TLS client that does not trust its
// certificate, each of which fails saying why, and serves the next.
func TestTLSWrite(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "cert.pem")
	srv, port := server(t, "tlswrite", "-certout", cert)
	code, out := start(t, "sendrecv", "client", "-p", port, "-timeout", "20s").wait(t)
	if code != 1 {
		t.Errorf("plain client of the TLS server: exit %d, %q; want 1", code, out)
	}
	code, out = start(t, "tlswrite", "client", "-p", port).wait(t) // the system's roots
	if code != 1 || !strings.Contains(out, "certificate") {
		t.Errorf("client not trusting the server: exit %d, %q; want 1 and why", code, out)
	}
	out = run(t, "tlswrite", "client", "-p", port, "-ca", cert, "-text", "sealed and placed")
	contains(t, "client", out, "wrote 17 bytes over TLS and read them back")
	code, sout := srv.wait(t)
	if code != 0 {
		t.Fatalf("server exit %d:\n%s", code, sout)
	}
	contains(t, "server", sout, `wrote 17 bytes over TLS: "sealed and placed"`)
}

// TestExamplesFailClearly: -h exits 0 listing the flags, usage errors exit 2, a client with no server
// exits 1 saying why, and none hangs.
func TestExamplesFailClearly(t *testing.T) {
	port := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	}()
	for _, e := range examples {
		if code, out := start(t, e).wait(t); code != 2 || !strings.Contains(out, "usage: "+e) {
			t.Errorf("%s with no arguments: exit %d, %q", e, code, out)
		}
		for _, side := range []string{"server", "client"} {
			if code, out := start(t, e, side, "-h").wait(t); code != 0 || !strings.Contains(out, "-p int") || !strings.Contains(out, "(default 747") {
				t.Errorf("%s %s -h: exit %d, %q; want 0 and the flags with defaults", e, side, code, out)
			}
		}
		if code, out := start(t, e, "client", "-no-such-flag").wait(t); code != 2 {
			t.Errorf("%s client -no-such-flag: exit %d, %q", e, code, out)
		}
		if code, out := start(t, e, "client", "-p", port).wait(t); code != 1 || !strings.Contains(out, "connection refused") {
			t.Errorf("%s client with no server: exit %d, %q", e, code, out)
		}
	}
}
