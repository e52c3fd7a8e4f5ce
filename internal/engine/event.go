package engine

import "errors"

// EventType says what an asynchronous event reports, in the manner of
// libibverbs' ibv_event_type and rdma_cm's disconnect event.
type EventType uint8

const (
	// EventQPFatal: this side moved the queue pair to error: it found an
	// error in the peer's input and sent a Terminate (Err matches
	// ErrTerminated and the Terminate's *wire.TermError), or the
	// connection failed (ErrLinkLost). IBV_EVENT_QP_FATAL.
	EventQPFatal EventType = iota + 1
	// EventPeerTerminated: the peer sent a Terminate; Err matches
	// ErrPeerTerminated and the peer's *wire.TermError.
	EventPeerTerminated
	// EventPeerClosed: the peer closed the connection (Err is
	// ErrPeerClosed). RDMA_CM_EVENT_DISCONNECTED.
	EventPeerClosed
	// EventCQOverrun: a completion found CQ full and was lost; CQ.Wait
	// reports ErrCQOverrun from then on. QP is the queue pair whose
	// completion was lost. IBV_EVENT_CQ_ERR.
	EventCQOverrun
	// EventLastWQE: the queue pair has left the ready state, for any
	// reason (Err says which, ErrClosed for Close and Disconnect), and
	// every work request it held has completed, most as flushed: nothing
	// of it will complete any more, and its regions are no longer pinned
	// by it. IBV_EVENT_QP_LAST_WQE_REACHED.
	EventLastWQE
)

func (t EventType) String() string {
	switch t {
	case EventQPFatal:
		return "qp-fatal"
	case EventPeerTerminated:
		return "peer-terminated"
	case EventPeerClosed:
		return "peer-closed"
	case EventCQOverrun:
		return "cq-overrun"
	case EventLastWQE:
		return "last-wqe"
	}
	return "event?"
}

// Event is an asynchronous event: something that happened to a queue pair
// or completion queue outside any call of the application's.
type Event struct {
	Type EventType
	QP   *QP   // the queue pair concerned
	CQ   *CQ   // EventCQOverrun: the queue that overran
	Err  error // why, for the queue pair events
}

// Emitter receives events. It is called with the engine's locks held and
// must never block (a full buffer drops the event).
type Emitter func(Event)

// emitFailureLocked reports the queue pair's move to error for cause,
// after the flush: the failure itself (none for a local close), then that
// the last work request has completed. q.mu is held.
func (q *QP) emitFailureLocked(cause error) {
	emit := q.cfg.Events
	if emit == nil {
		return
	}
	switch {
	case errors.Is(cause, ErrClosed):
	case errors.Is(cause, ErrPeerClosed):
		emit(Event{Type: EventPeerClosed, QP: q, Err: cause})
	case errors.Is(cause, ErrPeerTerminated):
		emit(Event{Type: EventPeerTerminated, QP: q, Err: cause})
	default:
		emit(Event{Type: EventQPFatal, QP: q, Err: cause})
	}
	emit(Event{Type: EventLastWQE, QP: q, Err: cause})
}
