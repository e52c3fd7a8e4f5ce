package siwtest

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestWaitListen: waitListen sees a listening port, and not one closed.
func TestWaitListen(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("waitListen reads /proc/net/tcp: Linux only")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if !waitListen(context.Background(), port, 5*time.Second) {
		t.Fatalf("port %d listens, waitListen says not", port)
	}
	ln.Close()
	if waitListen(context.Background(), port, 50*time.Millisecond) {
		t.Fatalf("port %d is closed, waitListen says it listens", port)
	}
}
