package gowarp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

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

// QP is a reliable-connected queue pair. Post work with PostSend and
// PostRecv; receives may be posted before the QP is connected.
type QP struct {
	*engine.QP
	pd       *PD
	mu       sync.Mutex
	peerData []byte
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
		SendCQ: c.SendCQ, RecvCQ: c.RecvCQ,
		PD: pd.id, Table: pd.dev.table,
		Completion: c.Completion, AsyncOnly: c.AsyncOnly,
		Logger: pd.dev.log,
	})
	if err != nil {
		return nil, err
	}
	return &QP{QP: q, pd: pd}, nil
}

// PeerPrivateData returns the private data the peer sent while connecting.
func (q *QP) PeerPrivateData() []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.peerData
}

// ConnectOptions tune connection setup (both Connect and Accept).
type ConnectOptions struct {
	// PrivateData goes to the peer in the MPA request or reply: at most
	// 508 bytes (252 to interoperate with siw).
	PrivateData []byte
	// CRC asks for MPA CRC32c on every FPDU; the peer may ask too.
	CRC bool
	// MPARevision is 1 or 2 (default 2, with IRD/ORD negotiation).
	MPARevision int
	// IRD and ORD bound inbound and outbound RDMA Reads in flight (default 16).
	IRD, ORD int
	// NoP2P keeps Connect from asking for peer-to-peer mode; the
	// connecting side must then send first. Default: P2P with an RTR
	// message when the revision is 2, so either side may send first.
	NoP2P bool
	// MaxFPDU sets the size of full FPDUs on the wire; 0 sizes them to the
	// TCP segment.
	MaxFPDU int
}

func (o *ConnectOptions) cm() cm.Options {
	return cm.Options{Revision: o.MPARevision, CRC: o.CRC, IRD: o.IRD, ORD: o.ORD, PrivateData: o.PrivateData, NoP2P: o.NoP2P}
}

func (o *ConnectOptions) params(r cm.Result) engine.Params {
	return engine.Params{CRC: r.CRC, IRD: r.IRD, ORD: r.ORD, SendRTR: r.SendRTR, HoldTx: r.HoldTx, MaxFPDU: o.MaxFPDU}
}

// Connect connects an idle QP to a listening peer at addr (host:port).
func (q *QP) Connect(ctx context.Context, addr string, o ConnectOptions) error {
	if q.State() != StateIdle {
		return fmt.Errorf("gowarp: Connect on a queue pair in state %s", q.State())
	}
	q.SetConnecting()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		q.Close()
		return fmt.Errorf("gowarp: connect %s: %w", addr, err)
	}
	setNoDelay(c)
	r, err := cm.Initiate(ctx, c, o.cm())
	if err != nil {
		c.Close()
		q.Close()
		return fmt.Errorf("gowarp: connect %s: %w", addr, err)
	}
	return q.start(c, r, &o)
}

func (q *QP) start(c net.Conn, r cm.Result, o *ConnectOptions) error {
	q.mu.Lock()
	q.peerData = append([]byte(nil), r.PrivateData...)
	q.mu.Unlock()
	if err := q.Start(engine.NewLink(c), o.params(r)); err != nil {
		c.Close()
		return err
	}
	return nil
}

func setNoDelay(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
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
		setNoDelay(c)
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
	if qp.State() != StateIdle {
		return fmt.Errorf("gowarp: Accept on a queue pair in state %s", qp.State())
	}
	qp.SetConnecting()
	res, err := r.req.Accept(ctx, o.cm())
	if err != nil {
		r.c.Close()
		qp.Close()
		return err
	}
	return qp.start(r.c, res, &o)
}

// Reject refuses the request, sending private data with the rejection.
func (r *ConnRequest) Reject(privateData []byte) error {
	err := r.req.Reject(privateData)
	return errors.Join(err, r.c.Close())
}
