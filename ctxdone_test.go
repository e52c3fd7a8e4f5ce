package gowarp_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestDoneContextConnectsNothing: Connect, ConnectConn and
// ConnRequest.Accept called with a context that is already done return its
// error and leave their queue pair idle: nothing goes on the wire, and a
// connecting peer is not left with a connection its server gave up.
func TestDoneContextConnectsNothing(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	p := newIdlePair(t, 16)
	defer p.a.Close()
	defer p.b.Close()

	// ConnectConn: not one byte of an MPA request reaches the peer.
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	got := make(chan int, 1)
	go func() {
		c2.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, _ := c2.Read(make([]byte, 64))
		got <- n
	}()
	if err := p.a.ConnectConn(done, c1, gowarp.ConnectOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("ConnectConn: %v, want context.Canceled", err)
	}
	if n := <-got; n != 0 {
		t.Errorf("ConnectConn with a done context wrote %d bytes", n)
	}
	if s := p.a.State(); s != gowarp.StateIdle {
		t.Errorf("after ConnectConn: %v, want idle", s)
	}
	if err := p.a.Connect(done, "127.0.0.1:1", gowarp.ConnectOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Connect: %v, want context.Canceled", err)
	}
	if s := p.a.State(); s != gowarp.StateIdle {
		t.Errorf("after Connect: %v, want idle", s)
	}

	// Accept: the client's Connect fails, and the server's queue pair
	// stays idle for another request.
	ln, err := p.dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	cerr := make(chan error, 1)
	go func() { cerr <- p.a.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{}) }()
	req, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.Accept(done, p.b, gowarp.ConnectOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("ConnRequest.Accept: %v, want context.Canceled", err)
	}
	if s := p.b.State(); s != gowarp.StateIdle {
		t.Errorf("server's queue pair after Accept: %v, want idle", s)
	}
	if err := <-cerr; err == nil {
		t.Errorf("the client connected to a server that gave up its Accept")
	}
}

// countingReader counts the bytes read from it.
type countingReader struct{ n int }

func (r *countingReader) Read(p []byte) (int, error) { r.n += len(p); return len(p), nil }

// TestDoneContextMovesNothing: Table.Export, Table.Import,
// Table.ImportSessions and SessionListener.Export called with a context
// that is already done return its error having done nothing: no table
// frozen, no byte written or read, no region registered, no session
// stopped.
func TestDoneContextMovesNothing(t *testing.T) {
	dev := gowarp.Open()
	tb := dev.DefaultTable()
	if _, err := dev.AllocPD().Register(make([]byte, 4096), gowarp.RemoteWrite); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out countingWriter
	if _, err := tb.Export(ctx, &out); !errors.Is(err, context.Canceled) {
		t.Fatalf("Export: %v, want context.Canceled", err)
	}
	if tb.Frozen() || out.n != 0 {
		t.Fatalf("Export with a done context: frozen %v, %d bytes written", tb.Frozen(), out.n)
	}
	other := gowarp.Open().DefaultTable()
	var in countingReader
	if _, err := other.Import(ctx, &in, gowarp.ImportOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Import: %v, want context.Canceled", err)
	}
	if _, err := other.ImportSessions(ctx, &in, gowarp.ImportOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("ImportSessions: %v, want context.Canceled", err)
	}
	if in.n != 0 || other.Len() != 0 {
		t.Fatalf("imports with a done context read %d bytes, registered %d regions", in.n, other.Len())
	}
	ln := dev.AllocPD().ListenSession(gowarp.SessionConfig{})
	defer ln.Close()
	if _, err := ln.Export(ctx, &out, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("SessionListener.Export: %v, want context.Canceled", err)
	}
	if tb.Frozen() || out.n != 0 {
		t.Fatalf("SessionListener.Export with a done context: frozen %v, %d bytes written", tb.Frozen(), out.n)
	}
}

// countingWriter counts the bytes written to it.
type countingWriter struct{ n int }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
