package main

import (
	"context"
	"encoding/json"
	"testing"
)

// TestQPMem runs qpmem small and holds the Go heap a connected queue pair
// keeps after traffic to its bound (issue 7, item 5). The heap is counted
// after a GC, so the figure does not depend on timing; RSS does, and is
// only reported.
func TestQPMem(t *testing.T) {
	if testing.Short() {
		t.Skip("connects 200 queue pairs")
	}
	code, out, errOut := runCmd(t, context.Background(), "qpmem", "-n", "200", "-c", "4", "-json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r qpmemReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	t.Logf("per queue pair: idle %+v, after traffic %+v", r.IdlePerQP, r.AfterPerQP)
	if r.QPs != 200 || r.Base.RSS <= 0 || r.Traffic.Heap <= r.Base.Heap {
		t.Fatalf("implausible report %+v", r)
	}
	const maxHeap = 48 << 10 // the goal of issue 7, item 5
	if h := r.AfterPerQP.Heap; h > maxHeap {
		t.Errorf("a queue pair keeps %.1f KiB of heap after traffic, more than %d KiB", h/1024, maxHeap>>10)
	}
	// The receive goroutine and, on the connecting side while the peer
	// has not spoken, the nudge goroutine; the transmit goroutine runs
	// only while writes would block.
	if g := r.AfterPerQP.Goroutines; g > 2 {
		t.Errorf("%.2f goroutines per queue pair", g)
	}
}

// TestQPMemUsage: bad flags are usage errors.
func TestQPMemUsage(t *testing.T) {
	for _, args := range [][]string{{"-n", "3"}, {"-n", "0"}, {"-size", "0"}, {"-c", "0"}, {"extra"}} {
		if code, _, _ := runCmd(t, context.Background(), append([]string{"qpmem"}, args...)...); code != exitUsage {
			t.Errorf("qpmem %q: exit %d, want %d", args, code, exitUsage)
		}
	}
}
