package gowarp_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestConnectRefusesBadOptionsBeforeDialing: options no peer could accept
// (more private data than an MPA request carries, an unknown revision)
// fail Connect before a TCP connection is made, so a server never sees a
// connection that is dropped after its SYN, and the queue pair stays idle
// for a Connect with good options. Before, the dial came first: the
// server accepted a connection that closed at once, and the queue pair
// was closed.
func TestConnectRefusesBadOptionsBeforeDialing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	p := newIdlePair(t, 16)
	defer p.a.Close()
	defer p.b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tt := range []struct {
		name string
		o    gowarp.ConnectOptions
		want error
	}{
		{"private data", gowarp.ConnectOptions{PrivateData: make([]byte, 600)}, gowarp.ErrPrivateDataLong},
		{"revision", gowarp.ConnectOptions{MPARevision: 3}, gowarp.ErrMPARevision},
	} {
		err := p.a.Connect(ctx, ln.Addr().String(), tt.o)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: Connect: %v, want %v", tt.name, err, tt.want)
		}
		if p.a.State() != gowarp.StateIdle {
			t.Errorf("%s: queue pair %v after the refused Connect, want idle", tt.name, p.a.State())
		}
	}
	ln.Close()
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections reached the server", n)
	}
	// The queue pair connects with good options.
	p.connect(t, gowarp.ConnectOptions{PrivateData: []byte("hello")}, gowarp.ConnectOptions{})
}
