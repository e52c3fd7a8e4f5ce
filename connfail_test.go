package gowarp_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestConnectRefusedIsNotClosed: a Connect whose dial is refused says so,
// and does not read as a queue pair the application closed (it said
// "queue pair closed (… connection refused)" and matched ErrClosed,
// because Connect closed the queue pair before it looked why).
func TestConnectRefusedIsNotClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: the dial is refused

	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(4)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = qp.Connect(ctx, addr, gowarp.ConnectOptions{})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Connect to a closed port: %v, want ECONNREFUSED", err)
	}
	if errors.Is(err, gowarp.ErrClosed) {
		t.Fatalf("Connect to a closed port: %v matches ErrClosed; the application closed nothing", err)
	}
}
