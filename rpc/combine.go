package rpc

import (
	"runtime"
	"sync"

	"github.com/gowarp/gowarp"
)

// combiner gathers work requests posted at once by many goroutines into
// one PostSendList: while one goroutine posts (a system call), others
// queue theirs, and it posts those too before it leaves. On loopback a
// write costs as much as the peer's receive, so at 64 calls in flight
// one write per call was most of the CPU time.
type combiner struct {
	mu     sync.Mutex
	q      []gowarp.SendWR
	spare  []gowarp.SendWR
	busy   bool
	failed error
	// postList stands in for the queue pair's PostSendList in tests.
	postList func([]gowarp.SendWR) (int, error)
	// posted, if set, is told of each list once the queue pair has taken
	// it, by whichever goroutine posted it.
	posted func([]gowarp.SendWR)
}

// enqueue queues wrs for the next post, by whoever posts next.
func (b *combiner) enqueue(wrs ...gowarp.SendWR) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failed != nil {
		return b.failed
	}
	b.q = append(b.q, wrs...)
	return nil
}

// post queues wrs and posts everything queued unless another goroutine is
// posting already, in which case it posts them. With others set, more
// posts are likely to come at once (other calls in flight): the poster
// first lets the goroutines ready to run queue theirs, so that they
// share its system call. Without it, goroutines woken together by one
// poll of the completion queue ran one after another, each with a write
// of its own (on 2 cores, one message per write at 16 calls in flight).
// An error means some work was not posted: the session must end.
func (b *combiner) post(qp *gowarp.QP, others bool, wrs ...gowarp.SendWR) error {
	b.mu.Lock()
	if b.failed != nil {
		err := b.failed
		b.mu.Unlock()
		return err
	}
	b.q = append(b.q, wrs...)
	if b.busy {
		b.mu.Unlock()
		return nil
	}
	b.busy = true
	if others {
		b.mu.Unlock()
		runtime.Gosched()
		b.mu.Lock()
	}
	for len(b.q) > 0 {
		batch := b.q
		b.q = b.spare[:0]
		b.mu.Unlock()
		var err error
		if b.postList != nil {
			_, err = b.postList(batch)
		} else {
			_, err = qp.PostSendList(batch)
		}
		if err == nil && b.posted != nil {
			b.posted(batch)
		}
		clear(batch)
		b.mu.Lock()
		b.spare = batch[:0]
		if err != nil {
			b.failed, b.busy = err, false
			b.q = b.q[:0]
			b.mu.Unlock()
			return err
		}
	}
	b.busy = false
	b.mu.Unlock()
	return nil
}
