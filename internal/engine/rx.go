package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// The receive driver: it owns the reads, the receive goroutine, the
// read-deadline doorbell and the hand-off of the receive path between the
// receive goroutine and an application goroutine receiving inline. The
// protocol is the core's (rxcore.go): each read goes where the core says
// and what it brings is handed to the core. The core can stop anywhere in
// an FPDU, so the path may change hands in the middle of one.

// rxLoop is the receive goroutine. It holds the receive path (rxMu) and
// blocks on the socket, except while an application goroutine waiting for
// this QP's completions receives on it itself (see receiveInline); it takes
// the path back when the watcher hands it over, the application having
// left it (see reclaim.go).
func (q *QP) rxLoop() {
	defer q.wg.Done()
	for {
		if q.State() == StateError {
			q.rxEnd()
			return
		}
		if q.rxMu.TryLock() {
			err := q.rx.background()
			q.rx.answerNow() // before the path changes hands, or the Terminate
			if !errors.Is(err, errRxYield) {
				if testHookRxFail != nil {
					testHookRxFail()
				}
				// Still holding the path: an inline receiver must not read
				// past the bad FPDU, nor over the header the Terminate echoes.
				q.rxFailed(err)
				q.rxMu.Unlock()
				return
			}
			q.rxMu.Unlock()
			select {
			case q.rxFree <- struct{}{}:
			default:
			}
			// The waiter that asked may not come (its completion came
			// first): the watcher hands the path back if none does.
			waitWatcher.watch(q)
		} // else a waiter holds it, and will hand it back as it leaves
		select {
		case <-q.rxHand:
			q.rxWakes.Add(1)
		case <-q.done:
			q.rxEnd()
			return
		}
	}
}

// rxEnd ends, as the receive goroutine stops, the holds of a placement
// that a waiter left in the middle of an FPDU, and the last waiter's
// context registration. The path is free, or its holder is in a read that
// the queue pair's failure or closing ends.
func (q *QP) rxEnd() {
	q.rxMu.Lock()
	q.rx.release()
	q.stopCtx()
	q.rxMu.Unlock()
}

// watchCtx makes ctx, whose Done is d, the one whose end rings the
// doorbell, in place of the last waiter's. A context is registered for
// the wait that brings it, and the registration ends as that wait does
// (unwatchCtx): a context made for one wait, cancelled as it returns,
// must not ring for nothing or start the goroutine that AfterFunc starts
// for an end it sees. A context that comes back for a second wait is
// taken for one that a loop waits with, and its registration stays until
// another comes: a loop pays for two registrations, not one per wait.
// Under rxMu.
func (q *QP) watchCtx(ctx context.Context, d <-chan struct{}) {
	switch {
	case d != q.waitDone:
		q.stopCtx()
		q.waitDone, q.waitKeep = d, false
	case q.waitStop == nil:
		q.waitKeep = true // its second wait
	default:
		return // registered
	}
	if d != nil {
		q.waitStop = context.AfterFunc(ctx, q.ringFn)
	}
}

// unwatchCtx ends, as a wait ends, the registration of a context made
// for it (see watchCtx). Under rxMu.
func (q *QP) unwatchCtx() {
	if !q.waitKeep {
		q.stopCtx()
	}
}

func (q *QP) stopCtx() {
	if q.waitStop != nil {
		q.waitStop()
		q.waitStop = nil
	}
}

// testHookRxFail, when set by a test before a queue pair starts, runs in
// the receive goroutine between a failed read and its handling.
var testHookRxFail func()

// errRxYield reports that the receive goroutine yielded the path.
var errRxYield = errors.New("engine: receive path yielded")

// receive reads once, where the core asks, and hands what came to the
// core; or, if it holds the next FPDU's first bytes already, lets it go
// on with them. rang reports the doorbell: the read deadline had passed.
func (r *rxState) receive() (rang bool, err error) {
	if r.q.State() == StateError {
		return false, net.ErrClosed // failed meanwhile: place nothing more
	}
	if r.staged() {
		return false, r.advance(0)
	}
	r.answerNow() // the read may wait
	iov := r.next()
	var k int
	var rerr error
	if r.idle != nil && !r.direct && r.w == 0 {
		// Nothing staged: wait for the peer without the staging buffer
		// (see staging.go). The bytes land at the start of whichever
		// buffer r holds when they come, where iov pointed. An inline
		// waiter takes them where they are read (moreIdle).
		var more func(int) ([]byte, bool)
		if r.q.rxInline.Load() {
			more = r.more
		}
		k, _, rerr = r.idle.ReadIdle(r.buf, r.put, r.get, more)
		if k > 0 {
			r.lastIdle = k
		}
		if err := r.moreErr; err != nil {
			r.moreErr = nil
			return false, err
		}
		if k == 0 && rerr == nil {
			return false, nil // moreIdle took all
		}
	} else {
		k, rerr = r.q.link.Readv(iov)
	}
	if err := r.advance(k); err != nil {
		return false, err // what the bytes that came say first
	}
	if rerr == nil {
		return false, nil
	}
	if errors.Is(rerr, os.ErrDeadlineExceeded) {
		r.q.rxDL = time.Unix(1, 0) // whoever set it, the deadline has passed
		return true, nil
	}
	return false, rerr
}

// moreIdle takes n bytes read by ReadIdle for an inline waiter, where
// they were read, and says whether to read on: while the waiter's wait
// goes on, the doorbell has not rung and the next read is again one of
// nothing staged. It returns the buffer for that read.
func (r *rxState) moreIdle(n int) ([]byte, bool) {
	r.lastIdle = n
	if err := r.advance(n); err != nil {
		r.moreErr = err
		return r.buf, false
	}
	q := r.q
	if s := q.State(); s != StateReady && s != StateClosing || r.staged() || q.bell.Load() || r.waitOver() {
		return r.buf, false
	}
	r.answerNow() // the read may wait
	r.next()
	if r.direct || r.w != 0 {
		return r.buf, false
	}
	return r.buf, true
}

// waitOver reports whether an inline waiter's wait is over: its CQ has a
// completion, or (Progress) an FPDU came since it took the path, or
// (ProgressFunc) its function, called after each FPDU, said so.
func (r *rxState) waitOver() bool {
	if r.waitCQ != nil {
		return r.waitCQ.nonEmpty()
	}
	if r.waitFn != nil {
		if r.fpdus != r.waitFrom || r.q.fnDue.Load() {
			r.waitFrom = r.fpdus
			r.fnOver = !r.q.callFn(r.waitFn)
		}
		return r.fnOver
	}
	return r.fpdus != r.waitFrom
}

// ProgressFunc runs the receive path on the calling goroutine as Progress
// does, calling fn first and then after the FPDUs received, until fn
// returns false (ProgressFunc returns nil) or ctx is done. fn runs where
// the bytes are read, holding the receive path: it may post, poll, look
// at regions and close this QP (see closeLater), not wait on this QP or
// its CQs. The wait it does not return from lets the reader, having
// emptied the socket, wait for the next bytes without reading it again
// (see fdLink.doReadIdle): the least latency a loop of waits and posts
// can have.
//
// fn is also called after a completion of this QP's that came from
// elsewhere than the receive path (a Send or Write the socket took, whose
// bytes no FPDU answers), so a loop that waits for its own work's
// completions ends.
func (q *QP) ProgressFunc(ctx context.Context, fn func() bool) error {
	defer q.closeLeft()
	q.fnWait.Store(true)
	defer q.fnWait.Store(false)
	q.fnDue.Store(true) // its first call, where the path is held
	return q.progress(ctx, fn)
}

// callFn calls a ProgressFunc's function, and again while it was owed
// another call meanwhile (kickFn), marking it as running for Close (see
// closeLater).
func (q *QP) callFn(fn func() bool) bool {
	for {
		q.fnDue.Store(false)
		if ok := q.callFnOnce(fn); !ok || !q.fnDue.Load() {
			return ok
		}
	}
}

func (q *QP) callFnOnce(fn func() bool) bool {
	q.inFn.Store(true)
	defer q.inFn.Store(false)
	return fn()
}

// kickFn has a running ProgressFunc call its function again for a
// completion that came from elsewhere than the receive path, which calls
// it after FPDUs only. The flag is set before inFn is looked at, and
// callFn clears inFn before it looks at the flag: either the function's
// caller sees the flag and calls it again, or the doorbell stops the
// wait it returns to (waitOver sees the flag). Under q.mu.
func (q *QP) kickFn() {
	if q.fnWait.Load() {
		q.fnDue.Store(true)
		if !q.inFn.Load() && q.link != nil {
			q.ring()
		}
	}
}

// closeLeft finishes, as ProgressFunc returns, a Close called while its
// function ran.
func (q *QP) closeLeft() {
	if q.closeLater.Load() {
		q.Close()
	}
}

// answerNow starts the transmit path for the Read Responses the core
// queued, if any (see answerDue).
func (r *rxState) answerNow() {
	if r.answerDue() {
		r.q.kick()
	}
}

// background runs the receive path until asked to yield or until it fails.
func (r *rxState) background() error {
	q := r.q
	for {
		if q.rxYield.Load() {
			r.yielded()
			return errRxYield
		}
		before := r.fpdus
		rang, err := r.receive()
		if err != nil {
			return err
		}
		if r.fpdus != before {
			select {
			case q.rxTick <- struct{}{}:
			default:
			}
		}
		if rang {
			if q.rxYield.Load() {
				r.yielded()
				return errRxYield
			}
			q.bell.Store(false)
			q.rearm() // a stale doorbell
		}
	}
}

func (r *rxState) yielded() {
	r.q.rxYield.Store(false)
	r.q.bell.Store(false)
	r.q.rearm()
}

// rxFailed acts on the error that ended the receive path.
func (q *QP) rxFailed(err error) {
	var f *fault
	var pt *peerTerminate
	q.rx.release()
	switch {
	case errors.As(err, &f):
		q.log.Debug("gowarp: protocol error in peer input", "err", err)
		q.mu.Lock()
		if f.status != Success && q.rx.recv != nil {
			q.rx.recvStatus = f.status
		}
		q.mu.Unlock()
		q.failTerm(fmt.Errorf("%w: %w", ErrTerminated, err), f.term, q.rx.head[:q.rx.hlen], q.rx.ulen)
	case errors.As(err, &pt):
		q.log.Debug("gowarp: peer sent Terminate", "err", err)
		q.peerTerminated(pt)
	case errors.Is(err, io.EOF):
		// If TCP ended the connection itself and a write took the error,
		// the read sees only the end: it must not overtake the writer's
		// error with "peer closed".
		if !q.failAborted(linkErr(syscall.ECONNABORTED), true) {
			q.fail(ErrPeerClosed)
		}
	case errors.Is(err, net.ErrClosed):
		q.fail(ErrClosed)
	default:
		q.fail(linkErr(err))
	}
}

// aborter is a Link that can tell, at end-of-file, whether the
// connection ended without the peer's FIN.
type aborter interface {
	// Aborted reports whether TCP ended the connection (a timeout, a
	// reset) and the error it recorded for it was already taken.
	Aborted() bool
}

// abortWait bounds how long a read or write that met an aborted
// connection waits for the other, which took its error, to fail the queue
// pair with it.
var abortWait = time.Second // a var for tests

// failAborted reports whether TCP ended the connection itself (it timed
// out, or was reset) and the error it recorded went to another system
// call than the caller's, the kernel giving it to one only: the read that
// sees end-of-file, or the write that sees EPIPE, while the other side of
// the queue pair holds ETIMEDOUT or ECONNRESET. That side fails the queue
// pair with it in a moment; failAborted waits for it, up to abortWait,
// and fails with fallback after that. A writer (wait false) does not
// wait but leaves a timer to do so: it may be the reader itself, as the
// receive path answers Read Requests and starts queued work inline, and
// it waited abortWait for itself (TestAbortedWriteFromReceive).
func (q *QP) failAborted(fallback error, wait bool) bool {
	a, ok := q.link.(aborter)
	if !ok || !a.Aborted() {
		return false
	}
	if q.abortWaits.Add(1) > 1 {
		// The other side is here too, waiting for this one: neither holds
		// more than the end (a reset after the peer's FIN records EPIPE,
		// which the write took). Waiting on each other cost a second
		// (a session's fail-over after its peer moved paused so).
		q.fail(fallback)
		return true
	}
	if !wait {
		// The reader, on its way to the end, comes here second and
		// fails the queue pair at once, unless it took the error itself.
		time.AfterFunc(abortWait, func() { q.fail(fallback) })
		return true
	}
	t := time.NewTimer(abortWait)
	select {
	case <-q.failed:
	case <-t.C:
		q.fail(fallback)
	}
	t.Stop()
	return true
}

// receiveInline runs the receive path on the calling goroutine, blocking
// on the socket, until cq has a completion (cq not nil), fn (called when
// owed a call, fnDue, and after the FPDUs received) says no more (over),
// or, with neither, an FPDU has been received (Progress); or ctx is done.
// It is how a goroutine waiting for this QP receives with no hand-off from
// the receive goroutine: the latency of a plain TCP reader. It reports
// held false, having asked the receive goroutine to yield, when that
// goroutine holds the path; the caller then waits on rxFree. The read
// blocks in the netpoller with no deadline; the doorbell (ring) wakes it
// for a completion from elsewhere, or for ctx being done (see watchCtx),
// so a wait costs no clock reading, deadline or allocation.
func (q *QP) receiveInline(ctx context.Context, cq *CQ, fn func() bool) (held, over bool) {
	if s := q.State(); s != StateReady && s != StateClosing {
		return false, false
	}
	if !q.rxMu.TryLock() {
		q.rxYield.Store(true)
		q.ring()
		return false, false
	}
	q.rxInline.Store(true)
	if cq != nil {
		cq.setInline(q)
	}
	// A context that can be done rings the doorbell when it is
	// (context.AfterFunc), so the wait needs no clock. (A ring for a
	// waiter that has left is looked at and re-armed.)
	d := ctx.Done()
	q.watchCtx(ctx, d)
	r := &q.rx
	// What the waiter waits for, as data rather than a function, which
	// kept in r would escape and cost an allocation per wait.
	r.waitCQ, r.waitFn, r.fnOver, r.waitFrom = cq, fn, false, r.fpdus
	var failed error
	// ctx is looked at when the doorbell stops the read, not after every
	// FPDU, through its Done channel (its Err takes a lock).
	for live := !isDone(d); live && !r.waitOver(); {
		if s := q.State(); s != StateReady && s != StateClosing {
			break
		}
		rang, err := r.receive()
		if err != nil {
			failed = err
			break
		}
		if rang {
			// The doorbell: a completion came from elsewhere, or ctx is
			// done. Look again.
			q.bell.Store(false)
			q.rearm()
			live = !isDone(d)
		}
	}
	over = r.fnOver
	r.waitCQ, r.waitFn = nil, nil
	r.answerNow()
	if cq != nil {
		cq.setInline(nil)
	}
	if failed != nil {
		q.rxFailed(failed) // holding the path, as in rxLoop
	} else if s := q.State(); s != StateReady && s != StateClosing {
		r.release() // failed meanwhile: no one will finish the FPDU
	}
	q.unwatchCtx()
	q.rxInline.Store(false)
	q.rxAppGen.Add(1)
	q.rxMu.Unlock()
	waitWatcher.watch(q) // the receive goroutine takes the path back if this waiter does not return
	return true, over
}

// Progress blocks until the queue pair has received at least one FPDU
// (placed a peer's Write, answered a Read, completed a receive…) or ctx is
// done, running the receive path on the calling goroutine when it can: the
// way to wait for one-sided Writes with the least latency, watching
// MR.Placed between calls. An FPDU received since the last call returned,
// on another goroutine, ends it at once, so none is missed between a look
// at MR.Placed and the call.
func (q *QP) Progress(ctx context.Context) error { return q.progress(ctx, nil) }

// progress is Progress (fn nil: until an FPDU has come) and ProgressFunc
// (until fn, called after the FPDUs received, says no more).
func (q *QP) progress(ctx context.Context, fn func() bool) error {
	// fn is called only where the path is held (receiveInline), never
	// beside the receive goroutine: what it posts and looks at cannot
	// race the placements of the FPDUs that come meanwhile (an echo
	// server that reposts its receive after its answer would otherwise
	// meet the next request first). FPDUs that goroutine took owe fn a
	// call (fnDue), as a completion from elsewhere does.
	for {
		if err := q.notReady(); err != nil {
			return err
		}
		// FPDUs the receive goroutine received since the last tick was
		// taken may be what the caller waits for, and the count below
		// starts after them: a waiter that took the path as that
		// goroutine yielded it waited for one more FPDU, forever.
		select {
		case <-q.rxTick:
			if fn == nil {
				return nil
			}
			q.fnDue.Store(true)
		default:
		}
		// The FPDUs received are counted under the path, from when
		// receiveInline holds it.
		if held, over := q.receiveInline(ctx, nil, fn); held {
			if isDone(ctx.Done()) {
				return ctx.Err()
			}
			if fn == nil || over {
				return nil
			}
			continue
		}
		select {
		case <-q.rxFree:
		case <-q.failed: // the receive goroutine failed instead of yielding
		case <-q.rxTick:
			if fn == nil {
				return nil
			}
			q.fnDue.Store(true)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// notReady returns why the queue pair can no longer receive (its error,
// or ErrNotReady), or nil while it can.
func (q *QP) notReady() error {
	if s := q.State(); s == StateReady || s == StateClosing {
		return nil
	}
	if err := q.Err(); err != nil {
		return err
	}
	return ErrNotReady
}

// isDone reports whether d, a context's Done channel, is closed; nil
// never is. Cheaper than the context's Err, which takes a lock.
func isDone(d <-chan struct{}) bool {
	select {
	case <-d:
		return true
	default:
		return false
	}
}

// ring asks the holder of the receive path to look up: the receive
// goroutine to yield (with rxYield set), an inline receiver to check
// whether what it waits for has come. bell keeps the ring from being lost
// when the receiver re-arms its deadline at the same moment.
func (q *QP) ring() {
	q.rings.Add(1)
	q.bell.Store(true)
	q.link.Conn().SetReadDeadline(time.Unix(1, 0))
}

// ctxRing rings the doorbell for a waiter's context that is done.
func (q *QP) ctxRing() {
	q.ctxRings.Add(1)
	q.ring()
}

// rearm clears the read deadline after the doorbell rang, unless it rang
// again meanwhile. The holder of the path keeps the deadline it set in
// rxDL, to skip clearing it again.
func (q *QP) rearm() {
	if q.rxDL.IsZero() && !q.bell.Load() {
		return
	}
	q.rxDL = time.Time{}
	q.link.Conn().SetReadDeadline(time.Time{})
	if q.bell.Load() {
		q.rxDL = time.Unix(1, 0)
		q.link.Conn().SetReadDeadline(q.rxDL)
	}
}
