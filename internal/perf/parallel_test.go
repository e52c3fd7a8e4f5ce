package perf

import (
	"context"
	"testing"
)

// TestRunParallel: a bandwidth test on several connections at once counts
// the messages of all of them, the server serves them all, and the
// latency and TCP tests refuse to run in parallel.
func TestRunParallel(t *testing.T) {
	lb, _ := startLoopback(t, &Server{})
	const n, iters, size = 8, 200, 4096
	for _, test := range []Test{WriteBW, ReadBW, SendBW} {
		r, err := lb.Client.RunParallel(context.Background(), test, Options{Size: size, Depth: 8, Iters: iters}, n)
		if err != nil {
			t.Fatalf("%v: %v", test, err)
		}
		checkSane(t, r, test, size, n*iters)
	}
	for _, test := range []Test{WriteLat, TCPBW} {
		if _, err := lb.Client.RunParallel(context.Background(), test, Options{Size: 8, Iters: 10}, 2); err == nil {
			t.Errorf("%v on 2 connections ran", test)
		}
	}
}
