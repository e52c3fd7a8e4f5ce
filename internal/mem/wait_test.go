package mem

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func newRegion(t *testing.T) (*Table, *Region) {
	t.Helper()
	tab := NewTable()
	r, err := tab.Register(1, [][]byte{make([]byte, 64)}, RemoteWrite, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return tab, r
}

// TestWaitPlacedNoLostWakeup: each round, a waiter waits for the count
// one more byte reaches while another goroutine places that byte at the
// same moment, and nothing is placed after it: a wake-up lost between the
// waiter's look and its registration leaves it waiting for the guard's
// 10 s. Run with -race too.
func TestWaitPlacedNoLostWakeup(t *testing.T) {
	_, r := newRegion(t)
	const n = 20000
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range next {
			r.AddPlaced(1)
		}
	}()
	for k := uint64(1); k <= n; k++ {
		next <- struct{}{}
		if err := r.WaitPlaced(ctx, k); err != nil {
			t.Fatalf("waiting for %d (placed %d): %v", k, r.Placed(), err)
		}
	}
	close(next)
	wg.Wait()
	if r.nwait.Load() != 0 || len(r.waiters) != 0 {
		t.Fatalf("%d waiters left registered", r.nwait.Load())
	}
}

// TestWaitPlacedEnds: every way a wait ends leaves no waiter behind.
func TestWaitPlacedEnds(t *testing.T) {
	tab, r := newRegion(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.WaitPlaced(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer dcancel()
	if err := r.WaitPlaced(dctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	if r.nwait.Load() != 0 || len(r.waiters) != 0 {
		t.Fatalf("%d waiters left after cancellation", r.nwait.Load())
	}
	errc := make(chan error, 3)
	for range 3 {
		go func() { errc <- r.WaitPlaced(context.Background(), 10) }()
	}
	for r.nwait.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	if err := tab.Deregister(r); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-errc; !errors.Is(err, ErrInvalid) {
			t.Fatalf("deregistered while waiting: %v", err)
		}
	}
	if err := r.WaitPlaced(context.Background(), 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("waiting on a deregistered region: %v", err)
	}
}

func TestAddPlacedAllocs(t *testing.T) {
	_, r := newRegion(t)
	if n := testing.AllocsPerRun(100, func() { r.AddPlaced(1) }); n != 0 {
		t.Fatalf("AddPlaced allocates %v times", n)
	}
}
