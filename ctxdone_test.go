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
