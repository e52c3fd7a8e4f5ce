package engine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
)

// ErrCQOverrun means completions were lost because the queue was full. The
// queue pairs whose completions were lost report it from Err but stay
// ready: only the completions are gone, not the connection.
var ErrCQOverrun = errors.New("gowarp: completion queue overrun")

// CQ is a completion queue, shared by any number of queue pairs.
type CQ struct {
	mu sync.Mutex
	// ring holds the waiting completions; it grows, doubling, up to
	// depth as they pile up (see push), so that a deep queue that stays
	// shallow, as most do, costs what it holds: a session's 1,792
	// entries were 86 KB each.
	ring    []Completion
	depth   int
	head, n int
	overrun bool
	// ready is n > 0 || overrun, written under mu: an inline receiver
	// looks at it after every FPDU (nonEmpty), without the lock.
	ready atomic.Bool
	// notify holds a token while completions may be waiting, so one
	// waiter wakes per burst without a goroutine or allocation per entry.
	notify chan struct{}
	// qps are the queue pairs completing here.
	qps []*QP
	// inline is the queue pair a waiter is receiving on inline, to be rung
	// when a completion comes from elsewhere. It is atomic, not under mu,
	// as a waiter sets and clears it at every wait: push stores ready
	// before it loads inline and the waiter stores inline before it loads
	// ready, so one of them sees the other.
	inline atomic.Pointer[QP]
	events Emitter // reports the first overrun
}

func (cq *CQ) setInline(q *QP) { cq.inline.Store(q) }

func (cq *CQ) attach(q *QP) {
	cq.mu.Lock()
	cq.qps = append(cq.qps, q)
	cq.mu.Unlock()
}

func (cq *CQ) detach(q *QP) {
	cq.mu.Lock()
	if i := slices.Index(cq.qps, q); i >= 0 {
		cq.qps = slices.Delete(cq.qps, i, i+1)
	}
	cq.mu.Unlock()
}

// onlyLocked returns the one queue pair completing here, nil unless one.
func (cq *CQ) onlyLocked() *QP {
	if len(cq.qps) == 1 {
		return cq.qps[0]
	}
	return nil
}

// NewCQ returns a completion queue holding up to depth completions.
func NewCQ(depth int) *CQ {
	depth = max(depth, 1)
	return &CQ{ring: make([]Completion, min(depth, cqFirst)), depth: depth, notify: make(chan struct{}, 1)}
}

// cqFirst is the length of a queue's first ring (see CQ.ring).
const cqFirst = 64

// grow doubles a full ring, up to the queue's depth, keeping the
// completions in order; it reports false when the ring is the depth.
// cq.mu is held.
func (cq *CQ) grow() bool {
	if len(cq.ring) >= cq.depth {
		return false
	}
	r := make([]Completion, min(2*len(cq.ring), cq.depth))
	k := copy(r, cq.ring[cq.head:])
	copy(r[k:], cq.ring[:cq.head])
	cq.ring, cq.head = r, 0
	return true
}

// NewCQEvents returns a completion queue that reports its overrun to
// events.
func NewCQEvents(depth int, events Emitter) *CQ {
	cq := NewCQ(depth)
	cq.events = events
	return cq
}

// Cap returns the queue's depth.
func (cq *CQ) Cap() int { return cq.depth }

// push appends c; it reports false (and marks the queue overrun) when full.
// fromRx says the receive path produced it: a waiter receiving inline sees
// those itself; others ring it.
func (cq *CQ) push(c *Completion, fromRx bool) bool {
	cq.mu.Lock()
	if cq.n == len(cq.ring) && !cq.grow() {
		first := !cq.overrun
		cq.overrun = true
		cq.ready.Store(true)
		cq.mu.Unlock()
		w := cq.inline.Load()
		if first && cq.events != nil {
			cq.events(Event{Type: EventCQOverrun, QP: c.QP, CQ: cq, Err: ErrCQOverrun})
		}
		if w != nil {
			w.ring()
		}
		return false
	}
	i := cq.head + cq.n
	if i >= len(cq.ring) {
		i -= len(cq.ring)
	}
	cq.ring[i] = *c
	cq.n++
	cq.ready.Store(true)
	cq.mu.Unlock()
	if w := cq.inline.Load(); w != nil && !fromRx {
		w.ring()
	}
	select {
	case cq.notify <- struct{}{}:
	default:
	}
	return true
}

// Poll moves up to len(out) completions into out and returns how many. It
// never blocks.
func (cq *CQ) Poll(out []Completion) int {
	if !cq.ready.Load() {
		// Nothing waits, and no overrun to report: a poller spinning on
		// an empty queue takes no lock, which the receive path's push
		// would contend for, and a ping-pong's last poll before it
		// posts costs an atomic load, not three atomic operations.
		return 0
	}
	cq.mu.Lock()
	k := min(len(out), cq.n)
	for j := range k {
		out[j] = cq.ring[cq.head]
		cq.ring[cq.head] = Completion{}
		cq.head++
		if cq.head == len(cq.ring) {
			cq.head = 0
		}
	}
	cq.n -= k
	left := cq.n
	if left == 0 {
		// Start again at the ring's first slot: a queue that is drained
		// as it fills then touches a few cache lines, not the whole ring
		// in turn (with 256 queues of 1024 that was 12 MB cycled through
		// the caches, BenchmarkManyQPs N=256).
		cq.head = 0
		if !cq.overrun {
			cq.ready.Store(false)
		}
	}
	cq.mu.Unlock()
	if left > 0 {
		// Pass the wake-up on to another waiter.
		select {
		case cq.notify <- struct{}{}:
		default:
		}
	}
	return k
}

// Len returns the number of completions waiting.
func (cq *CQ) Len() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.n
}

// Wait blocks until at least one completion is waiting or ctx is done. It
// returns ErrCQOverrun once the queue has overrun.
//
// When the queue serves a single queue pair, the waiting goroutine
// receives on that queue pair's connection itself, as a TCP reader would:
// no hand-off from the receive goroutine, hence the lowest latency.
func (cq *CQ) Wait(ctx context.Context) error {
	for {
		cq.mu.Lock()
		n, over, only := cq.n, cq.overrun, cq.onlyLocked()
		cq.mu.Unlock()
		if over {
			return ErrCQOverrun
		}
		if n > 0 {
			return nil
		}
		var free chan struct{}
		if only != nil {
			if held, _ := only.receiveInline(ctx, cq, nil); held {
				if isDone(ctx.Done()) {
					return ctx.Err()
				}
				continue
			}
			free = only.rxFree
		}
		select {
		case <-cq.notify:
		case <-free:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// nonEmpty reports whether completions wait or the queue overran. An
// inline receiver calls it after every FPDU, so it takes no lock.
func (cq *CQ) nonEmpty() bool { return cq.ready.Load() }

// Notify returns a channel that receives a token when completions arrive,
// for use in a select. Drain with Poll after each token.
func (cq *CQ) Notify() <-chan struct{} { return cq.notify }
