package rpc

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// TestDoneContextSendsNothing: a call whose context is already done (a
// cancellation, no deadline) returns its error and never reaches the
// handler, with slots free.
func TestDoneContextSendsNothing(t *testing.T) {
	srv, cl, _ := pair(t, Options{})
	var ran atomic.Int64
	srv.RegisterFunc("count", func(ctx context.Context, arg []byte) ([]byte, error) {
		ran.Add(1)
		return arg, nil
	})
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for range 10 {
		if _, err := cl.Call(done, "count", []byte("x"), nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("call with a done context: %v, want context.Canceled", err)
		}
	}
	// A live call after them is the only one the handler sees.
	if _, err := cl.Call(context.Background(), "count", []byte("y"), nil); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1 (the live call)", n)
	}
}
