package engine

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/gowarp/gowarp/wire"
)

// Failure and Terminate: how a queue pair goes to error, whichever side
// or path found the fault, sends or receives the Terminate that says why,
// and flushes its outstanding work.

// fail moves the queue pair to error without a Terminate; cause is what
// the user sees from Err. All outstanding work is flushed.
func (q *QP) fail(cause error) { q.failTerm(cause, nil, nil, 0) }

// failTerm moves the queue pair to error. cause is what the user sees from
// Err. When term is non-nil a Terminate reporting it, echoing the header of
// the FPDU that caused it (head, of a ULPDU of ulen bytes) if given, goes
// out before the connection closes. All outstanding work is flushed.
func (q *QP) failTerm(cause error, term *wire.TermError, head []byte, ulen int) {
	q.mu.Lock()
	if q.State() == StateError {
		q.mu.Unlock()
		return
	}
	wasReady := q.link != nil
	if q.abort != nil {
		// Connecting: the Connect or Accept under way fails and closes
		// its socket.
		q.abort()
		q.abort = nil
	}
	q.state.Store(int32(StateError))
	close(q.failed) // once: the state check above runs under q.mu
	if q.err == nil || q.err == ErrCQOverrun {
		q.err = cause // why it leaves the ready state, an overrun or not
	}
	q.flushLocked()
	q.emitFailureLocked(cause)
	if term != nil && wasReady {
		t := wire.NewTerminate(term, head, ulen, q.termScratch[:0])
		q.termPending = &t
		q.termDone = make(chan struct{})
		q.log.Debug("gowarp: sending Terminate", "err", term)
		if !q.txBusy {
			q.txBusy = true
			q.handTxLocked()
		} // else the holder of the transmit role frames it after its batch
		// A peer that does not read must not keep the connection open, nor
		// Close waiting.
		q.termTimer = time.AfterFunc(termTimeout, func() {
			q.link.Close()
			q.termOver()
		})
		q.mu.Unlock()
		return
	}
	busy := q.txBusy
	q.txCloses = busy
	q.mu.Unlock()
	q.wakeTx()
	switch {
	case q.link == nil:
	case busy:
		// The holder of the transmit role may have just written a
		// completion's last bytes: it must count them before the send
		// queue is flushed, and in Acked mode ask the open socket what the
		// peer acknowledged. So it flushes and closes; a write of its
		// blocked on a full socket, and a read, stop now.
		q.link.Conn().SetDeadline(time.Unix(1, 0))
	default:
		q.link.Close()
	}
}

// linkErr is the failure for err, the error that ended a read or write on
// the connection: ErrLinkTimeout when TCP gave up on an unresponsive peer
// (the link timeout set by the connection manager, or the system's own
// retransmission limit), ErrLinkLost otherwise. A connection that times
// out reports ETIMEDOUT, or the last soft error TCP met on the way: no
// route once the local link went down.
func linkErr(err error) error {
	if timedOut(err) {
		return fmt.Errorf("%w: %w", ErrLinkTimeout, err)
	}
	return fmt.Errorf("%w: %w", ErrLinkLost, err)
}

// timedOut reports whether err is TCP giving up on an unresponsive peer.
func timedOut(err error) bool {
	return errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// termOver records that the pending Terminate was written or given up on.
// The timer stops, so that it does not keep the queue pair's memory for
// termTimeout after the Terminate left. q.mu must not be held.
func (q *QP) termOver() {
	q.termOnce.Do(func() {
		close(q.termDone)
		q.mu.Lock()
		t := q.termTimer
		q.mu.Unlock()
		if t != nil {
			t.Stop()
		}
	})
}

// flushLocked completes every outstanding work request: those with a
// status of their own get it, the rest WRFlushError. The send queue waits
// for the holder of the transmit role, if any (see releaseTxLocked).
func (q *QP) flushLocked() {
	if !q.txBusy {
		q.flushSQLocked()
	}
	q.orqHead = q.orqTail
	q.largeReads.Store(0)
	q.drainedLocked()
	for ; q.irqHead < q.irqTail; q.irqHead++ {
		e := &q.irq[q.irqHead%uint64(len(q.irq))]
		if e.region != nil {
			e.region.Unhold()
		}
		*e = irqEntry{}
	}
	for ; q.rqHead < q.rqTail; q.rqHead++ {
		e := &q.rq[q.rqHead%uint64(len(q.rq))]
		st := WRFlushError
		if q.rx.recvStatus != Success && q.rx.recv != nil && q.rx.recvIdx == q.rqHead {
			st = q.rx.recvStatus
		}
		for i := range e.nsge {
			e.sges[i].MR.Release()
		}
		c := Completion{ID: e.id, QP: q, Op: CompRecv, Status: st}
		if !q.cfg.RecvCQ.push(&c, false) {
			q.overrunLocked()
		}
		e.sges = [MaxSGE]SGE{}
	}
}

// flushSQLocked completes the send queue of a failed queue pair: first,
// as ever, the Sends and Writes whose bytes the socket took (Handed) or
// the peer acknowledged (Acked), then the rest as flushed. Nobody holds the
// transmit role, so what was written is known.
func (q *QP) flushSQLocked() {
	q.markSentLocked()
	for i := q.sqHead; i < q.sqTail; i++ {
		e := &q.sq[i%uint64(len(q.sq))]
		if !e.done {
			e.done = true
			if e.status == Success {
				e.status = WRFlushError
			}
		}
	}
	q.sqDone, q.sqTx = q.sqTail, q.sqTail
	q.retireLocked(false)
}

// releaseTxLocked gives up the transmit role. After a failure the holder
// flushes the send queue, its last write counted; it reports whether the
// holder must close the link, left open for it by the failure.
func (q *QP) releaseTxLocked() (closeLink bool) {
	q.txBusy = false
	q.drainedLocked()
	if q.State() != StateError {
		return false
	}
	q.flushSQLocked()
	closeLink, q.txCloses = q.txCloses, false
	return closeLink
}

// peerTerminated puts the queue pair in error for a received Terminate.
// The send-queue entry the Terminate's echoed header names, if still
// outstanding, completes with the matching remote error status.
func (q *QP) peerTerminated(pt *peerTerminate) {
	st := statusFor(&pt.t.Err)
	cause := fmt.Errorf("%w: %w", ErrPeerTerminated, pt)
	q.mu.Lock()
	// The error is recorded with the status, under one lock: the transmit
	// path may complete the entry before fail runs, and an application
	// that sees that completion must find the reason in Err.
	if (q.err == nil || q.err == ErrCQOverrun) && q.State() != StateError {
		q.err = cause
	}
	if h, ok := pt.t.DDPHeader(); ok {
		var rr *wire.ReadRequest
		if body, ok := pt.t.ReadRequest(); ok {
			rr = &body
		}
		for i := q.sqHead; i < q.sqTx; i++ {
			e := &q.sq[i%uint64(len(q.sq))]
			if !e.done && echoes(e, &h, rr) {
				e.status = st
				break
			}
		}
	}
	q.mu.Unlock()
	if testHookPeerTerm != nil {
		testHookPeerTerm(q)
	}
	q.fail(cause)
}

// testHookPeerTerm, when set by a test, runs between a received
// Terminate's status reaching the send entry it echoes and the queue
// pair's failure.
var testHookPeerTerm func(*QP)

// echoes reports whether h, with rr the echoed Read Request body if any,
// is the header of a message e sent.
func echoes(e *sqEntry, h *wire.Header, rr *wire.ReadRequest) bool {
	switch e.wr.Op {
	case OpWrite:
		return h.Opcode == wire.OpWrite && h.STag == e.wr.RKey && h.TO >= e.wr.RemoteAddr && h.TO <= e.wr.RemoteAddr+uint64(e.length)
	case OpFetchAdd, OpCmpSwap, OpAtomicWrite:
		return h.Opcode == wire.OpAtomicRequest && h.MSN == e.msn
	case OpWriteImm: // its Write or its Immediate Data
		return h.Opcode == wire.OpWrite && h.STag == e.wr.RKey && h.TO >= e.wr.RemoteAddr && h.TO <= e.wr.RemoteAddr+uint64(e.length) ||
			h.Opcode.Info().Send && h.MSN == e.msn
	case OpRead, OpFlush:
		if h.Opcode != wire.OpReadRequest {
			return false
		}
		if rr != nil {
			// The body names the Read's source. siw, when it finds the
			// error while building the response, rebuilds the echo from
			// its queue and puts the read size where the MSN belongs
			// (siw_send_terminate), so the MSN cannot be trusted then.
			return rr.SourceSTag == e.wr.RKey && rr.SourceTO >= e.wr.RemoteAddr && rr.SourceTO < e.wr.RemoteAddr+uint64(max(1, e.length))
		}
		return h.MSN >= e.msn && h.MSN < e.msn+uint32(max(1, len(e.sgl())))
	default:
		return h.Opcode.Info().Send && h.MSN == e.msn
	}
}

// statusFor maps a Terminate's error to the completion status of the
// work it reports.
func statusFor(e *wire.TermError) Status {
	switch {
	case e.Layer == wire.LayerRDMAP && e.Type == wire.RDMAPRemoteProtection,
		e.Layer == wire.LayerDDP && e.Type == wire.DDPTaggedBuffer:
		return RemoteAccessError
	case e.Layer == wire.LayerDDP && e.Type == wire.DDPUntaggedBuffer:
		return RemoteInvalidRequest
	case e.Layer == wire.LayerRDMAP && e.Type == wire.RDMAPRemoteOperation:
		return RemoteOperationError
	}
	return FatalError
}

// closeAfterTerm closes the connection once its Terminate is written. A
// peer may still be sending (the rest of the Write that broke the rules):
// a socket closed with bytes unread sends a reset, and the peer's write
// then fails with EPIPE before its receive path reads the Terminate, so
// the peer learned "connection lost", not why. So the connection is
// half-closed (a FIN after the Terminate) and what comes is read and
// dropped until the peer closes too, or termTimeout passes.
func (q *QP) closeAfterTerm() {
	c := q.link.Conn()
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil || c.SetReadDeadline(time.Now().Add(termTimeout)) != nil {
		q.link.Close()
		return
	}
	q.wg.Add(1)
	go func() {
		defer q.wg.Done()
		var buf [4096]byte
		for {
			if _, err := c.Read(buf[:]); err != nil {
				break
			}
		}
		q.link.Close()
	}()
}
