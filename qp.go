package gowarp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/gowarp/gowarp/internal/cm"
	"github.com/gowarp/gowarp/internal/engine"
)

// Connection setup errors.
var (
	// ErrRejected: the peer rejected the connection (see RejectedError).
	ErrRejected = cm.ErrRejected
	// ErrMarkers: the peer asked for MPA markers, which gowarp lacks.
	ErrMarkers = cm.ErrMarkers
	// ErrMPARevision: an MPA revision other than 1 or 2 was asked for,
	// or the peer answered with another revision than the one asked.
	ErrMPARevision = cm.ErrRevision
	// ErrMPAProtocol: the peer's MPA request or reply is malformed or out
	// of turn.
	ErrMPAProtocol = cm.ErrProtocol
	// ErrPrivateDataLong: more private data than an MPA frame holds.
	ErrPrivateDataLong = cm.ErrPrivateDataLong
	// ErrInsufficientIRD: the peer's IRD/ORD cannot be met (RFC 6581's
	// "insufficient IRD"): its ORD exceeds the most inbound Reads this
	// side can take, or this side asked for IRD NoReads and the
	// responder still wants to read.
	ErrInsufficientIRD = cm.ErrInsufficientIRD
)

// RejectedError is the error of a rejected Connect; it carries the peer's
// private data and matches ErrRejected.
type RejectedError = cm.RejectedError

// QP is a reliable-connected queue pair. Post work with PostSend and
// PostRecv (receives may be posted before the QP is connected); connect
// with Connect, or accept a ConnRequest on it.
type QP = engine.QP

// ConnectOptions tune connection setup, on either side.
type ConnectOptions = engine.ConnectOptions

// NoReads as ConnectOptions.IRD or ORD asks for none, which the zero value
// cannot say (it means the default, 16): IRD 0 serves no RDMA Reads from
// the peer, ORD 0 issues none, as perftest's and most rdma_cm clients
// that do not read ask. MPA revision 2 carries the 0 to the peer (RFC
// 6581); on an ORD 0 connection PostSend refuses a Read with ErrZeroORD,
// and a peer's Read Request arriving at IRD 0 is answered with a
// Terminate (RDMAP remote operation error, wire.ErrRDMAPStream). A peer
// whose reply asks to read from a connection that said IRD NoReads fails
// Connect with ErrInsufficientIRD. QP.Params reports what was settled.
const NoReads = engine.NoReads

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
	return engine.NewQP(engine.Config{
		SendDepth: c.SendDepth, RecvDepth: c.RecvDepth,
		SendCQ: c.SendCQ, RecvCQ: c.RecvCQ,
		PD: pd.id, Table: pd.dev.table,
		Completion: c.Completion, AsyncOnly: c.AsyncOnly,
		Logger: pd.dev.log, Events: pd.dev.emit,
	})
}

// Listener accepts iWARP connections on a TCP address. Each incoming
// connection's MPA request is read on its own goroutine, so a peer that
// connects and stays silent holds up nobody.
type Listener struct {
	dev  *Device
	ln   net.Listener
	reqs chan *ConnRequest
	done chan struct{}
	once sync.Once
	err  error // why the accept loop ended; read after reqs is closed
}

// handshakeTimeout bounds the wait for an MPA request on an accepted
// connection (siw waits 5 s).
const handshakeTimeout = 5 * time.Second

// Listen listens for connections on addr (host:port).
func (d *Device) Listen(addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &Listener{dev: d, ln: ln, reqs: make(chan *ConnRequest, 64), done: make(chan struct{})}
	go l.acceptLoop()
	return l, nil
}

func (l *Listener) acceptLoop() {
	defer close(l.reqs)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			l.err = err
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.handshake(c)
		}()
	}
}

// handshake reads one connection's MPA request and queues it for Accept.
func (l *Listener) handshake(c net.Conn) {
	engine.SetNoDelay(c)
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		select {
		case <-l.done:
			c.Close()
		default:
		}
	})
	defer stop()
	req, err := cm.ReadRequest(ctx, c)
	if err != nil {
		l.dev.log.Info("gowarp: dropped connection", "peer", c.RemoteAddr(), "err", err)
		c.Close()
		return
	}
	select {
	case l.reqs <- &ConnRequest{c: c, req: req}:
	case <-l.done:
		c.Close()
	}
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening; requests not yet accepted are dropped.
func (l *Listener) Close() error {
	err := l.ln.Close()
	l.once.Do(func() {
		close(l.done)
		go func() { // drop what was queued
			for r := range l.reqs {
				r.c.Close()
			}
		}()
	})
	return err
}

// ConnRequest is an incoming connection waiting to be accepted or rejected.
type ConnRequest struct {
	c   net.Conn
	req *cm.Request
}

// PrivateData returns the private data the connecting peer sent.
func (r *ConnRequest) PrivateData() []byte { return r.req.PrivateData() }

// ReadLimits returns the IRD and ORD the connecting peer asked for in its
// MPA revision 2 request (rdma_cm's responder_resources and
// initiator_depth); ok is false for a revision 1 request, which carries
// none.
func (r *ConnRequest) ReadLimits() (ird, ord int, ok bool) {
	f := &r.req.Frame
	if f.Revision != 2 || !f.Enhanced {
		return 0, 0, false
	}
	return int(f.IRD), int(f.ORD), true
}

// RemoteAddr returns the connecting peer's address.
func (r *ConnRequest) RemoteAddr() net.Addr { return r.c.RemoteAddr() }

// Accept waits for the next connection request, until ctx is done or the
// listener is closed. A connecting peer that sends no valid MPA request is
// dropped and logged: a misbehaving client never stops a listener.
func (l *Listener) Accept(ctx context.Context) (*ConnRequest, error) {
	select {
	case r, ok := <-l.reqs:
		if !ok {
			return nil, fmt.Errorf("gowarp: listener: %w", l.err)
		}
		select {
		case <-l.done:
			r.c.Close()
			return nil, net.ErrClosed
		default:
		}
		return r, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Accept accepts the request on qp, an idle queue pair, sending the reply.
func (r *ConnRequest) Accept(ctx context.Context, qp *QP, o ConnectOptions) error {
	return qp.Accept(ctx, r.c, r.req, o)
}

// Reject refuses the request, sending private data with the rejection.
func (r *ConnRequest) Reject(privateData []byte) error {
	err := r.req.Reject(privateData)
	return errors.Join(err, r.c.Close())
}
