package gowarp

import (
	"context"
	"errors"
	"net"

	"github.com/gowarp/gowarp/internal/cm"
	"github.com/gowarp/gowarp/internal/engine"
)

// Connection setup errors.
var (
	ErrRejected        = cm.ErrRejected
	ErrMarkers         = cm.ErrMarkers
	ErrMPARevision     = cm.ErrRevision
	ErrMPAProtocol     = cm.ErrProtocol
	ErrPrivateDataLong = cm.ErrPrivateDataLong
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
		Logger: pd.dev.log,
	})
}

// Listener accepts iWARP connections on a TCP address.
type Listener struct {
	dev *Device
	ln  net.Listener
}

// Listen listens for connections on addr (host:port).
func (d *Device) Listen(addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &Listener{dev: d, ln: ln}, nil
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening.
func (l *Listener) Close() error { return l.ln.Close() }

// ConnRequest is an incoming connection waiting to be accepted or rejected.
type ConnRequest struct {
	c   net.Conn
	req *cm.Request
}

// PrivateData returns the private data the connecting peer sent.
func (r *ConnRequest) PrivateData() []byte { return r.req.PrivateData() }

// RemoteAddr returns the connecting peer's address.
func (r *ConnRequest) RemoteAddr() net.Addr { return r.c.RemoteAddr() }

// Accept waits for the next connection request. A connecting peer that
// sends no valid MPA request is dropped and logged, and Accept goes on
// waiting: a misbehaving client never stops a listener.
func (l *Listener) Accept(ctx context.Context) (*ConnRequest, error) {
	stop := context.AfterFunc(ctx, func() { l.ln.Close() })
	defer stop()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		engine.SetNoDelay(c)
		req, err := cm.ReadRequest(ctx, c)
		if err != nil {
			l.dev.log.Info("gowarp: dropped connection", "peer", c.RemoteAddr(), "err", err)
			c.Close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			continue
		}
		return &ConnRequest{c: c, req: req}, nil
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
