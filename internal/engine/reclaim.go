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
// back for a whole reclaim period does the receive goroutine take the path
// again, to place Writes, answer Reads and drain the socket. No event marks
// an application that has stopped waiting, so that takes a clock; but one
// clock, the watcher's, serves every queue pair, so waiting costs the same
// with 1 queue pair as with thousands (issue 7, defect 8: a timer per queue
// pair every 200 µs collapsed throughput with 64 active ones).
//
// The watcher also looks at the contexts of inline waiters, which block on
// their sockets without a deadline: a done context rings the waiter's
// doorbell. Reading a context's channel costs nothing per wait, unlike a
// read deadline set from the clock at every wait.

// rxReclaim is how long the receive path stays with an application that
// received on it inline before the receive goroutine takes it back.
const rxReclaim = 200 * time.Microsecond

// ctxPoll is how often the contexts of inline waiters are looked at while
// no receive path waits to be reclaimed.
const ctxPoll = 2 * time.Millisecond

// waitWatcher is the process's one watcher of left receive paths and
// waiting contexts.
var waitWatcher watcher

type watcher struct {
	mu      sync.Mutex
	qps     []watched
	started bool
	idle    bool          // the goroutine waits on wake: nothing is watched
	wake    chan struct{} // wakes it when something is
	slow    bool          // ticking every ctxPoll: no path waits to be reclaimed
	t       *time.Timer
	// fast counts the rxReclaim ticks since contexts were last looked at:
	// they are looked at every ctxPoll whatever the tick, so that the
	// ticks that reclaim cost one glance per inline waiter, not a lock
	// and a select (with hundreds of waiters that is most of the scan).
	fast     int
	ctxLooks int // contexts of inline waiters looked at (tests)
}

// watched is a queue pair under the watcher and the generation of its
// receive path last seen (rxAppGen). The generation is kept here, not in
// the QP: a write there at every look, beside the fields its receive path
// writes at every wait, took the line from the core running that path,
// once per queue pair and tick (issue 7: the watcher's cost grew with N).
type watched struct {
	q    *QP
	seen uint64
}

// ctxEvery is how many rxReclaim ticks pass between two looks at the
// contexts of inline waiters.
const ctxEvery = int(ctxPoll / rxReclaim)

// watch puts q under the watcher, if it is not already. Called by an
// inline waiter as it leaves, and as it starts waiting with a context that
// can be done.
func (w *watcher) watch(q *QP) {
	if q.watched.Load() {
		return
	}
	w.mu.Lock()
	if !q.watched.Load() {
		q.watched.Store(true)
		// seen: a leave just happened, or a wait began
		w.qps = append(w.qps, watched{q, q.rxAppGen.Load() - 1})
		switch {
		case !w.started:
			// One goroutine for the process, which stays (parked when
			// idle): starting one per busy period would allocate.
			w.started = true
			w.wake = make(chan struct{}, 1)
			w.t = time.NewTimer(rxReclaim)
			go w.run()
		case w.idle:
			w.idle = false
			w.wake <- struct{}{}
		case w.slow && !q.rxInline.Load():
			w.slow = false
			w.t.Reset(rxReclaim) // a path to reclaim: tick sooner
		}
	}
	w.mu.Unlock()
}

// run ticks while queue pairs are watched.
func (w *watcher) run() {
	for range w.t.C {
		if w.tick() {
			<-w.wake
			w.t.Reset(rxReclaim)
		}
	}
}

// tick scans once and sets the timer for the next scan; it reports true,
// setting none, when nothing is left to watch.
func (w *watcher) tick() (idle bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	full := w.slow || w.fast >= ctxEvery-1
	if full {
		w.fast = 0
	} else {
		w.fast++
	}
	reclaiming := w.scan(full)
	switch {
	case len(w.qps) == 0:
		w.idle, w.slow = true, false
		return true
	case reclaiming:
		w.slow = false
		w.t.Reset(rxReclaim)
	default:
		w.slow = true
		w.t.Reset(ctxPoll)
	}
	return false
}

// scan looks at every watched queue pair once and drops those it is done
// with; it reports whether a receive path still waits to be reclaimed.
// Inline waiters' contexts are looked at only if full.
func (w *watcher) scan(full bool) (reclaiming bool) {
	keep := w.qps[:0]
	for _, e := range w.qps {
		inline, ok := w.look(&e, full)
		if ok {
			keep = append(keep, e)
			if !inline {
				reclaiming = true
			}
		}
	}
	clear(w.qps[len(keep):])
	w.qps = keep
	return reclaiming
}

// look acts on one queue pair and reports whether to keep watching it,
// and whether a waiter held its path when looked at (rxInline, read once).
// An inline waiter's context is looked at only if full.
func (w *watcher) look(e *watched, full bool) (inline, keep bool) {
	q := e.q
	gen := q.rxAppGen.Load()
	inline = q.rxInline.Load()
	if !full && inline {
		// Its failure, if any, is seen at the next full look or after it
		// leaves: one cache line less per waiter and tick.
		e.seen = gen
		return true, true
	}
	if q.State() == StateError {
		q.watched.Store(false)
		q.handRx() // its receive goroutine ends
		return inline, false
	}
	if inline {
		w.ctxLooks++
		q.waitMu.Lock()
		if d := q.waitDone; d != nil {
			select {
			case <-d:
				q.ring()
			default:
			}
			q.waitMu.Unlock()
			e.seen = gen
			return true, true
		}
		q.waitMu.Unlock()
		// A waiter that cannot be cancelled needs no watching until it
		// leaves; leaving watches it again. Drop it the way an idle one
		// is dropped below, so a leave is never missed.
	} else if gen != e.seen {
		e.seen = gen // came back and left within the period: wait another
		return false, true
	}
	q.watched.Store(false)
	if q.rxAppGen.Load() != gen {
		// A leave slipped in before the flag fell: keep watching, as its
		// watch call saw the flag still up.
		q.watched.Store(true)
		e.seen = gen
		return q.rxInline.Load(), true // it left: tick at rxReclaim
	}
	if !q.rxInline.Load() {
		q.handRx()
	}
	return inline, false
}

// handRx gives the receive path back to the receive goroutine: it takes
// it if it is still free.
func (q *QP) handRx() {
	select {
	case q.rxHand <- struct{}{}:
	default:
	}
}
