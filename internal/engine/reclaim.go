package engine

import (
	"sync"
	"time"
)

// The receive path of a queue pair is held by its receive goroutine or,
// inline, by an application goroutine waiting for its completions (see
// receiveInline). When the waiter leaves, the path stays free for it to
// come back to, since an application that waits in a loop leaves between
// every two waits, and taking the path from the receive goroutine costs a
// doorbell (a read deadline) and two wake-ups. Only when it has not come
// back since the watcher last looked does the receive goroutine take the
// path again, to place Writes, answer Reads and drain the socket. No event
// marks an application that has stopped waiting, so that takes a clock;
// but one clock, the watcher's, serves every queue pair, so waiting costs
// the same with 1 queue pair as with thousands (issue 7, defect 8: a timer
// per queue pair every 200 µs collapsed throughput with 64 active ones).
//
// The clock must also stay quiet while applications wait in a loop. Any
// clock that wakes the process costs a ping-pong: two processes trading 8
// bytes over TCP, 5 runs of 60,000 round trips each, took 13.7 µs one way
// (median) with nothing else in them, 16.0 with a timerfd expiring every
// 2 ms, and 21.9 with a Go timer every 2 ms (while a Go timer is pending,
// the runtime's findRunnable gives every netpoller wait a timeout; that
// this is the extra cost is our reading, not measured). So the watcher
// looks at a queue pair rxReclaim after its waiter first leaves, and
// then, for as long as it finds the waiter came back and left again
// meanwhile (a loop), at twice the last interval, up to rxReclaimMax: a
// loop costs the process a look every rxReclaimMax. A path left for good
// goes back to the receive goroutine at the first look that finds it has
// not been taken since the last one: within 2×rxReclaim of the leave for
// a waiter that leaves once, within 2×rxReclaimMax for one that looped
// before it stopped. That bound is the price of the quiet clock: a
// client's Read of a server that waited in a ping-pong loop, then stopped
// waiting, took 24-37 ms with rxReclaimMax at 20 ms (1.2-3.6 ms when the
// watcher looked every 2 ms), hence 5 ms. (Looking sooner at a loop found
// away, its application perhaps busy elsewhere, made the looks follow the
// load: on two busy CPUs an in-process ping-pong's waiter was found away
// at most looks.) The watcher's clock is a fineTimer (a timerfd on
// Linux), not the runtime's timer.
//
// Inline waiters' contexts need no watching: a context that can be done
// rings the waiter's doorbell through context.AfterFunc (see
// receiveInline).

// rxReclaim is the first interval between the watcher's looks at a
// receive path its waiter left; rxReclaimMax the longest, reached by a
// waiter that keeps coming back.
const (
	rxReclaim    = 200 * time.Microsecond
	rxReclaimMax = 5 * time.Millisecond
)

// waitWatcher is the process's one watcher of left receive paths.
var waitWatcher watcher

type watcher struct {
	mu      sync.Mutex
	qps     []watched
	started bool
	idle    bool          // the goroutine waits on wake: nothing is watched
	wake    chan struct{} // wakes it when something is
	t       *fineTimer
	next    time.Duration // when t fires (since fineEpoch); 0: not armed
}

// watched is a queue pair under the watcher: the generation of its
// receive path last seen (rxAppGen), the interval between two looks at it
// and when the next is due (since fineEpoch). The generation is kept
// here, not in the QP: a write there at every look, beside the fields its
// receive path writes at every wait, took the line from the core running
// that path, once per queue pair and tick (issue 7: the watcher's cost
// grew with N).
type watched struct {
	q     *QP
	seen  uint64
	every time.Duration
	due   time.Duration
}

// watch puts q under the watcher, if it is not already. Called by an
// inline waiter as it leaves, and by the receive goroutine as it yields
// the path to a waiter that may not come.
func (w *watcher) watch(q *QP) {
	if q.watched.Load() {
		return
	}
	w.mu.Lock()
	if !q.watched.Load() {
		q.watched.Store(true)
		due := time.Since(fineEpoch) + rxReclaim
		w.qps = append(w.qps, watched{q: q, seen: q.rxAppGen.Load(), every: rxReclaim, due: due})
		switch {
		case !w.started:
			// One goroutine for the process, which stays (parked when
			// idle): starting one per busy period would allocate.
			w.started = true
			w.wake = make(chan struct{}, 1)
			w.t = newFineTimer()
			w.arm(due)
			go w.run()
		case w.idle:
			w.idle = false
			w.arm(due)
			w.wake <- struct{}{}
		case due < w.next:
			w.arm(due)
		}
	}
	w.mu.Unlock()
}

// arm sets the watcher's clock to fire at due (since fineEpoch). Under mu.
func (w *watcher) arm(due time.Duration) {
	w.next = due
	w.t.reset(max(due-time.Since(fineEpoch), 0))
}

// run looks at the watched queue pairs as their looks fall due.
func (w *watcher) run() {
	for range w.t.C() {
		if w.tick(time.Since(fineEpoch)) {
			<-w.wake // armed by watch, which sends it
		}
	}
}

// tick looks at the queue pairs whose looks are due at now, drops those
// it is done with and sets the clock for the next look; it reports true,
// setting none, when nothing is left to watch.
func (w *watcher) tick(now time.Duration) (idle bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	keep := w.qps[:0]
	var next time.Duration
	for _, e := range w.qps {
		// A look falls due at e.due; it is taken early, with a look due
		// now, once half its interval has passed (and rxReclaim since the
		// last): so the looks at many queue pairs that loop fall on the
		// same ticks, not each on its own.
		if e.due <= now || e.due-e.every/2 <= now && e.due-e.every+rxReclaim <= now {
			if !w.look(&e) {
				continue
			}
			e.due = now + e.every
		}
		keep = append(keep, e)
		if next == 0 || e.due < next {
			next = e.due
		}
	}
	clear(w.qps[len(keep):])
	w.qps = keep
	if len(w.qps) == 0 {
		w.idle, w.next = true, 0
		return true
	}
	w.arm(next)
	return false
}

// look acts on one queue pair and reports whether to keep watching it,
// having set the interval to its next look.
func (w *watcher) look(e *watched) (keep bool) {
	q := e.q
	q.watchLooks.Add(1)
	if q.State() == StateError {
		q.watched.Store(false)
		q.handRx() // its receive goroutine ends
		return false
	}
	gen := q.rxAppGen.Load()
	if gen != e.seen {
		// Its waiter came back and left again since the last look: a
		// loop. Look again later, and the later the longer it loops.
		e.seen = gen
		e.every = min(2*e.every, rxReclaimMax)
		return true
	}
	// Not left since the last look: held by a waiter since then (who
	// will watch it again as it leaves), or left for good.
	q.watched.Store(false)
	if q.rxAppGen.Load() != gen {
		// A leave slipped in before the flag fell: keep watching, as its
		// watch call saw the flag still up.
		q.watched.Store(true)
		e.seen = q.rxAppGen.Load()
		e.every = rxReclaim
		return true
	}
	if !q.rxInline.Load() {
		q.handRx()
	}
	return false
}

// handRx gives the receive path back to the receive goroutine: it takes
// it if it is still free.
func (q *QP) handRx() {
	select {
	case q.rxHand <- struct{}{}:
	default:
	}
}
