package engine

import (
	"container/heap"
	"time"
)

// Go's timers are precise to the millisecond only while the process
// idles: the netpoller then sleeps in epoll_wait, whose timeout is in
// milliseconds, so a 50 µs timer fires after 1 ms (golang/go#53824). In
// Acked mode the transmit goroutine looks at the send queue every
// ackPoll; with one Write outstanding it waited a whole millisecond for
// each acknowledgement that loopback gives in tens of microseconds (4 KiB
// Writes at depth 1: 1.1 k/s). On Linux a timerfd read through the
// netpoller wakes epoll_wait at its expiry instead, to the microsecond
// (fineclock_linux.go); one timerfd, armed for the earliest deadline,
// serves every fineTimer of the process. Elsewhere, and where no timerfd
// can be made, a fineTimer is the runtime's timer.

// fineTimer is a one-shot timer precise to microseconds. Its channel
// receives once per expiry; stop leaves nothing in it.
type fineTimer struct {
	c    chan struct{}
	when time.Duration // since fineEpoch
	on   bool          // armed and not yet fired or stopped
	idx  int           // in fine.h; -1 when not in it
	rt   *time.Timer   // without a timerfd
}

func newFineTimer() *fineTimer { return &fineTimer{c: make(chan struct{}, 1), idx: -1} }

// C is the channel the expiry is sent on.
func (t *fineTimer) C() <-chan struct{} { return t.c }

// reset arms t to fire d from now, replacing any earlier arming.
func (t *fineTimer) reset(d time.Duration) {
	fine.mu.Lock()
	defer fine.mu.Unlock()
	t.drain()
	t.when, t.on = time.Since(fineEpoch)+d, true
	if testFineRuntime || !fine.start() {
		if t.rt == nil {
			t.rt = time.AfterFunc(d, t.fireUnlocked)
		} else {
			t.rt.Reset(d)
		}
		return
	}
	if t.idx >= 0 {
		heap.Fix(&fine.h, t.idx)
	} else {
		heap.Push(&fine.h, t)
	}
	if fine.h[0] == t && (fine.armed == 0 || t.when < fine.armed) {
		fine.arm(t.when)
	}
}

// stop disarms t; its channel is empty after it.
func (t *fineTimer) stop() {
	fine.mu.Lock()
	t.on = false
	if t.idx >= 0 {
		heap.Remove(&fine.h, t.idx)
	}
	if t.rt != nil {
		t.rt.Stop()
	}
	t.drain()
	fine.mu.Unlock()
}

func (t *fineTimer) drain() {
	select {
	case <-t.c:
	default:
	}
}

// fireUnlocked is fire for the runtime's timer, which does not hold
// fine.mu. Its callback may have begun before a stop or reset that held
// the lock: it fires only for the arming in force, once due.
func (t *fineTimer) fireUnlocked() {
	fine.mu.Lock()
	if t.on && time.Since(fineEpoch) >= t.when {
		t.fire()
	}
	fine.mu.Unlock()
}

// fire sends the expiry. Under fine.mu, so that stop, which holds it,
// leaves nothing behind.
func (t *fineTimer) fire() {
	t.on = false
	select {
	case t.c <- struct{}{}:
	default:
	}
}

var fineEpoch = time.Now()

// testFineRuntime, set by a test before any fineTimer is armed, makes
// fineTimers the runtime's timers, as where there is no timerfd.
var testFineRuntime bool

// fine is the process's one clock of fineTimers.
var fine fineClock

// fineHeap orders armed timers by deadline (container/heap).
type fineHeap []*fineTimer

func (h fineHeap) Len() int           { return len(h) }
func (h fineHeap) Less(i, j int) bool { return h[i].when < h[j].when }
func (h fineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *fineHeap) Push(x any) {
	t := x.(*fineTimer)
	t.idx = len(*h)
	*h = append(*h, t)
}
func (h *fineHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.idx = -1
	return t
}
