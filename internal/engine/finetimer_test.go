package engine

import (
	"container/heap"
	"runtime"
	"testing"
	"time"
)

// TestFineTimer: every armed timer fires once; a timer reset before it
// fires fires once, for its last arming; stop leaves its channel empty and
// nothing fires after it.
func TestFineTimer(t *testing.T) {
	for _, rt := range []bool{false, true} {
		t.Run(fineMode(rt), func(t *testing.T) {
			testFineRuntime = rt
			defer func() { testFineRuntime = false }()
			testFineTimer(t)
		})
	}
}

func fineMode(runtime bool) string {
	if runtime {
		return "runtime"
	}
	return "timerfd"
}

func testFineTimer(t *testing.T) {
	const n = 64
	ts := make([]*fineTimer, n)
	for i := range ts {
		ts[i] = newFineTimer()
	}
	for i := n - 1; i >= 0; i-- {
		ts[i].reset(time.Duration(i+1) * 200 * time.Microsecond)
	}
	for i := range ts {
		select {
		case <-ts[i].C():
		case <-time.After(10 * time.Second):
			t.Fatalf("timer %d never fired", i)
		}
	}
	time.Sleep(2 * time.Millisecond)
	for i := range ts {
		select {
		case <-ts[i].C():
			t.Fatalf("timer %d fired twice", i)
		default:
		}
	}

	// Reset before the expiry: one fire, not two.
	a := newFineTimer()
	a.reset(time.Hour)
	a.reset(time.Millisecond)
	<-a.C()
	time.Sleep(5 * time.Millisecond)
	select {
	case <-a.C():
		t.Fatal("a reset timer fired for its earlier arming too")
	default:
	}

	// Stop: nothing then or after, even with the expiry already sent.
	b := newFineTimer()
	b.reset(time.Microsecond)
	time.Sleep(2 * time.Millisecond) // fired, unread
	b.stop()
	c := newFineTimer()
	c.reset(2 * time.Millisecond)
	c.stop()
	time.Sleep(5 * time.Millisecond)
	select {
	case <-b.C():
		t.Fatal("a stopped timer's expiry stayed in its channel")
	case <-c.C():
		t.Fatal("a stopped timer fired")
	default:
	}
	if fine.start() {
		fine.mu.Lock()
		left := len(fine.h)
		fine.mu.Unlock()
		if left != 0 {
			t.Fatalf("%d timers left armed", left)
		}
	}
}

// TestFineTimerAllocs: arming and stopping allocate nothing (the Acked
// transmit goroutine does it at every wait).
func TestFineTimerAllocs(t *testing.T) {
	tm := newFineTimer()
	if a := testing.AllocsPerRun(1000, func() {
		tm.reset(time.Hour)
		tm.stop()
	}); a != 0 {
		t.Fatalf("%v allocations per reset and stop", a)
	}
}

// TestFineHeap: the clock fires timers in deadline order, whatever the
// order of arming, re-arming and removal.
func TestFineHeap(t *testing.T) {
	var h fineHeap
	ts := make([]*fineTimer, 50)
	for i := range ts {
		ts[i] = newFineTimer()
		ts[i].when = time.Duration((i * 37) % 50)
		heap.Push(&h, ts[i])
	}
	ts[3].when = 1000 // re-armed later
	heap.Fix(&h, ts[3].idx)
	heap.Remove(&h, ts[7].idx) // stopped
	last := time.Duration(-1)
	for h.Len() > 0 {
		tm := heap.Pop(&h).(*fineTimer)
		if tm == ts[7] {
			t.Fatal("a removed timer stayed in the heap")
		}
		if tm.when < last || tm.idx != -1 {
			t.Fatalf("popped %v (index %d) after %v", tm.when, tm.idx, last)
		}
		last = tm.when
	}
	if last != 1000 {
		t.Fatalf("last deadline %v, want the re-armed 1000", last)
	}
}

// TestFineTimerStopRace: a timer stopped just as it expires leaves
// nothing in its channel, with the timerfd and with the runtime's timers
// (where the runtime's callback may be waiting for the lock stop holds).
func TestFineTimerStopRace(t *testing.T) {
	for _, rt := range []bool{false, true} {
		t.Run(fineMode(rt), func(t *testing.T) {
			testFineRuntime = rt
			defer func() { testFineRuntime = false }()
			tm := newFineTimer()
			late := 0
			for i := range 1000 {
				tm.reset(time.Duration(i%5) * time.Microsecond)
				for range i % 7 * 50 {
					runtime.Gosched()
				}
				tm.stop()
				time.Sleep(20 * time.Microsecond) // an expiry on its way lands
				select {
				case <-tm.C():
					late++
				default:
				}
			}
			if late != 0 {
				t.Fatalf("%d expiries came after stop", late)
			}
		})
	}
}
