package gowarp

import (
	"context"
	"unsafe"

	"github.com/gowarp/gowarp/internal/engine"
)

// QP is a reliable-connected queue pair. Post work with PostSend and
// PostRecv (receives may be posted before the QP is connected); connect
// with Connect, or accept a ConnRequest on it.
type QP struct {
	q engine.QP // by value: a *QP is the engine's *QP (see wr.go)
}

func pubQP(q *engine.QP) *QP { return (*QP)(unsafe.Pointer(q)) }

// Params are what connection setup settled.
type Params struct {
	// CRC is whether every FPDU carries an MPA CRC32c.
	CRC bool
	// IRD is how many inbound RDMA Reads may be outstanding, ORD how many
	// outbound; 0 allows none.
	IRD, ORD int
	// Extensions is whether both sides offered RFC 7306's extensions
	// (ConnectOptions.Extensions): immediate data may be posted.
	Extensions bool
}

// Disconnect closes the connection gracefully: it stops new work, waits
// (until ctx is done) for queued sends to leave, closes the TCP connection
// and flushes whatever is left.
func (qp *QP) Disconnect(ctx context.Context) error { return qp.q.Disconnect(ctx) }

// Close tears the queue pair down at once, flushing all outstanding work,
// and waits for its goroutines to stop. If the queue pair is sending a
// Terminate (it found an error in the peer's input), Close first lets the
// Terminate reach the socket, so the peer learns why, waiting at most a
// second for a peer that does not read. While ProgressFunc's function
// runs, Close, called from it or from any other goroutine, returns at
// once without waiting (Go cannot tell the function's goroutine from
// another), and ProgressFunc finishes the close before it returns.
func (qp *QP) Close() error { return qp.q.Close() }

// State returns the queue pair's state.
func (qp *QP) State() State { return State(qp.q.State()) }

// Err returns why the queue pair left the ready state; while it is still
// ready, ErrCQOverrun if it lost a completion to a full queue, or nil.
func (qp *QP) Err() error { return qp.q.Err() }

// Done returns a channel that is closed when the queue pair enters the
// error state, for whatever reason: it found an error in the peer's input,
// the peer closed, terminated or went unheard, the connection failed, or
// the application called Close or Disconnect. Err then says why.
//
// Work outstanding then completes as flushed, which wakes CQ.Wait; but a
// queue pair with none, as on the side that only exposes memory to its
// peer's one-sided Reads and Writes, completes nothing, and Done is how
// its goroutine learns that the connection ended:
//
//	select {
//	case <-qp.Done():
//		log.Print("peer gone: ", qp.Err())
//	case <-ctx.Done():
//	}
//	qp.Close()
func (qp *QP) Done() <-chan struct{} { return qp.q.Failed() }

// Params returns what connection setup settled.
func (qp *QP) Params() Params {
	p := qp.q.Params()
	return Params{CRC: p.CRC, IRD: p.IRD, ORD: p.ORD, Extensions: p.Ext}
}

// PeerPrivateData returns the private data the peer sent while connecting.
func (qp *QP) PeerPrivateData() []byte { return qp.q.PeerPrivateData() }

// FPDUSize returns the size on the wire of a full FPDU on this connection
// now (the TCP segment, rounded down to 4 on links with real segments; on
// loopback the MSS less room for TCP's options, rounded down to 8, which
// grows as the MSS does), unless set by ConnectOptions.MaxFPDU; 0 before
// the queue pair is connected.
func (qp *QP) FPDUSize() int { return qp.q.FPDUSize() }

// Nudges returns how many zero-length Writes the queue pair sent to wake a
// peer that had not answered yet (see ConnectOptions.NoNudge).
func (qp *QP) Nudges() int { return qp.q.Nudges() }

// PostSend queues a send-queue work request.
func (qp *QP) PostSend(wr *SendWR) error { return qp.q.PostSend(engSendWR(wr)) }

// PostSendList queues work requests in order with one doorbell: their
// FPDUs leave together, in as few system calls as the socket allows. It
// returns how many were queued; on an error the rest were not.
func (qp *QP) PostSendList(wrs []SendWR) (int, error) { return qp.q.PostSendList(engSendWRs(wrs)) }

// PostRecv queues a receive buffer. Receives may be posted before the
// queue pair is connected.
func (qp *QP) PostRecv(wr *RecvWR) error { return qp.q.PostRecv(engRecvWR(wr)) }

// PostRecvList queues receive buffers in order under one lock. It returns
// how many were queued; on an error the rest were not.
func (qp *QP) PostRecvList(wrs []RecvWR) (int, error) { return qp.q.PostRecvList(engRecvWRs(wrs)) }

// Progress blocks until the queue pair has received at least one FPDU
// (placed a peer's Write, answered a Read, completed a receive…) or ctx is
// done, running the receive path on the calling goroutine when it can: the
// way to wait for one-sided Writes with the least latency, watching
// MR.Placed between calls. An FPDU received since the last call returned,
// on another goroutine, ends it at once, so none is missed between a look
// at MR.Placed and the call.
func (qp *QP) Progress(ctx context.Context) error { return qp.q.Progress(ctx) }

// ProgressFunc is Progress for a loop of waits and posts, as a
// ping-pong or a server's request loop is: it calls fn, then receives on
// the calling goroutine and calls fn again after the FPDUs received (at
// least once for any that came) and after this queue pair's Sends and
// Writes complete (their completions come from the transmit path, not
// from the peer's bytes), until fn returns false (ProgressFunc returns
// nil), ctx is done, or the queue pair fails (its error).
//
// fn runs in the receive path, holding it: no FPDU of this queue pair is
// placed or completed while fn runs, so a receive it reposts after its
// answer is there before the peer's next Send lands. It may post to any
// queue pair, poll completion queues and look at regions (MR.Placed), and
// should look at that state rather than count its calls. It may close this
// queue pair (Close, Disconnect), which then returns at once and is
// finished as ProgressFunc returns ErrClosed; it must not wait on this
// queue pair or its completion queues (Progress, CQ.Wait), which wait for
// the path it holds. In return, between fn's calls the path waits for the
// peer's next bytes without first reading an empty socket, a system call
// that each return from Progress costs: on loopback an 8-byte write_lat
// went from about 1.16 to 0.97 times a TCP ping-pong's latency.
func (qp *QP) ProgressFunc(ctx context.Context, fn func() bool) error {
	return qp.q.ProgressFunc(ctx, fn)
}

// Prepare checks wr and keeps it ready to post, pinning its regions until
// Release. wr.ID and the Signaled flag are ignored: Post supplies them.
func (qp *QP) Prepare(wr *SendWR) (*Prepared, error) {
	p, err := qp.q.Prepare(engSendWR(wr))
	if err != nil {
		return nil, err
	}
	return (*Prepared)(unsafe.Pointer(p)), nil
}

// Prepared is a work request checked, pinned and encoded once and posted
// many times: see QP.Prepare. Its regions cannot be deregistered until
// Release.
type Prepared struct {
	p engine.Prepared // by value: a *Prepared is the engine's
}

// Post posts the prepared work request with the given ID, signaled or not.
func (p *Prepared) Post(id uint64, signaled bool) error { return p.p.Post(id, signaled) }

// PostN posts the prepared work request n times with one doorbell, with
// IDs id, id+1, …; only the last is signaled, and only if signaled is set.
// It returns how many were queued.
func (p *Prepared) PostN(id uint64, n int, signaled bool) (int, error) {
	return p.p.PostN(id, n, signaled)
}

// Release unpins the prepared request's regions; later posts fail with
// ErrReleased. Work already posted is not affected: it pins them until it
// completes.
func (p *Prepared) Release() { p.p.Release() }

// State is a queue pair's state.
type State int32

// QP states.
const (
	StateIdle       State = iota // created, not connected
	StateConnecting              // MPA negotiation under way
	StateReady                   // connected: work flows
	StateClosing                 // disconnect requested, draining
	StateError                   // failed or closed: work is flushed
)

func (s State) String() string { return engine.State(s).String() }

// CompletionMode chooses when a signaled Send or Write completes.
type CompletionMode uint8

// Completion modes of signaled Sends and Writes.
const (
	// Handed completes a Send or Write once the socket has taken all its
	// bytes. The buffer may then be reused only if the application can
	// tolerate a retransmission carrying the new bytes (with CRC on, the
	// peer would see a CRC error); in practice: do not change it until a
	// later exchange with the peer shows the data arrived. If the
	// connection fails, what the socket took still completes
	// successfully; only work it did not take is flushed.
	Handed CompletionMode = iota
	// Acked completes a Send or Write once the kernel's send queue shows
	// every byte of it acknowledged by the peer's TCP. From then on the
	// buffer may be changed freely: TCP will never send it again. If the
	// connection fails, what was acknowledged by then completes
	// successfully, the rest is flushed (though it may have arrived).
	// It needs a TCP connection (Linux); over other streams (TLS) it
	// completes as Handed.
	Acked
)

func (m CompletionMode) String() string { return engine.CompletionMode(m).String() }

// QPConfig sizes a queue pair.
type QPConfig struct {
	SendCQ, RecvCQ *CQ
	// SendDepth and RecvDepth are the queue sizes (default 128 each).
	SendDepth, RecvDepth int
	// Completion chooses when signaled Sends and Writes complete: Handed
	// (the socket took the bytes, the default) or Acked (the peer's TCP
	// acknowledged them, after which the buffer may be changed).
	Completion CompletionMode
	// AsyncOnly transmits every post from the QP's transmit goroutine
	// rather than the posting goroutine (for comparison; slower).
	AsyncOnly bool
}

// NewQP returns an idle queue pair in the protection domain.
func (pd *PD) NewQP(c QPConfig) (*QP, error) {
	if c.SendDepth == 0 {
		c.SendDepth = 128
	}
	if c.RecvDepth == 0 {
		c.RecvDepth = 128
	}
	q, err := engine.NewQP(engine.Config{
		SendDepth: c.SendDepth, RecvDepth: c.RecvDepth,
		SendCQ: engCQ(c.SendCQ), RecvCQ: engCQ(c.RecvCQ),
		PD: pd.id, Table: pd.tbl.t,
		Completion: engine.CompletionMode(c.Completion), AsyncOnly: c.AsyncOnly,
		Logger: pd.dev.log, Events: pd.dev.emit, Owner: &qpOwner{dev: pd.dev},
	})
	if err != nil {
		return nil, err
	}
	return pubQP(q), nil
}

// engCQ returns the engine's CQ of cq, nil for nil.
func engCQ(cq *CQ) *engine.CQ {
	if cq == nil {
		return nil
	}
	return &cq.cq
}
