package rping

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/gowarp/gowarp"
)

// ClientOptions are rping's client flags.
type ClientOptions struct {
	Size     int  // ping data size (-S; default 64)
	Count    int  // pings (-C; 0 pings until ctx is done)
	Validate bool // compare the echoed data with what was sent (-V)
	// Verbose receives rping's -v lines ("ping data: ..."); nil for none.
	Verbose io.Writer
	// Connect tunes the connection. rping's client asks for IRD = ORD = 1
	// and no peer-to-peer mode; the server reads from the client, so IRD
	// must be at least 1.
	// Its queue pair wakes a siw server that missed the first message
	// while accepting (see gowarp.ConnectOptions.NoNudge).
	Connect gowarp.ConnectOptions
	// Source is the local address the connection leaves from (rping's
	// -I: an IP address or a host name); empty for the system's choice.
	Source string
}

// ErrMismatch is returned by a validating client whose echoed data differs
// from what it sent (rping: "data mismatch!").
var ErrMismatch = errors.New("rping: data mismatch")

// Result sums up a session.
type Result struct {
	Pings   int           // completed pings
	Elapsed time.Duration // from the first advertisement to the last go-ahead
	MinRTT  time.Duration // fastest ping, advertisement to final go-ahead
	Nudges  int           // zero-length Writes the queue pair sent to wake the server (QP.Nudges)
}

// Ping connects to an rping server at addr (host:port) and pings it.
func Ping(ctx context.Context, dev *gowarp.Device, addr string, o ClientOptions) (Result, error) {
	if o.Size == 0 {
		o.Size = DefaultSize
	}
	if err := CheckSize(o.Size); err != nil {
		return Result{}, err
	}
	c, err := newConn(dev)
	if err != nil {
		return Result{}, err
	}
	defer c.close()
	acc := gowarp.LocalWrite | gowarp.RemoteRead | gowarp.RemoteWrite
	start, err := c.register(o.Size, acc)
	if err != nil {
		return Result{}, err
	}
	sink, err := c.register(o.Size, acc)
	if err != nil {
		return Result{}, err
	}
	// The receive is posted before the first Send can draw an answer.
	if err := c.postRecv(); err != nil {
		return Result{}, err
	}
	if err := connect(ctx, c.qp, addr, o); err != nil {
		return Result{}, err
	}
	var r Result
	t0 := time.Now()
	for ping := 0; o.Count == 0 || ping < o.Count; ping++ {
		if ctx.Err() != nil {
			break
		}
		ts := time.Now()
		FillPing(start.Bytes(), ping)
		clear(sink.Bytes())
		if err := c.sendInfo(Info{Buf: start.Addr(), RKey: uint32(start.STag()), Size: uint32(o.Size)}); err != nil {
			return r, err
		}
		// The server has read the start buffer.
		if _, err := c.recvInfo(ctx); err != nil {
			return r, ctxErr(ctx, fmt.Errorf("ping %d, waiting for the server's read: %w", ping, err))
		}
		if err := c.sendInfo(Info{Buf: sink.Addr(), RKey: uint32(sink.STag()), Size: uint32(o.Size)}); err != nil {
			return r, err
		}
		// The server has written the sink buffer.
		if _, err := c.recvInfo(ctx); err != nil {
			return r, ctxErr(ctx, fmt.Errorf("ping %d, waiting for the server's write: %w", ping, err))
		}
		rtt := time.Since(ts)
		if r.MinRTT == 0 || rtt < r.MinRTT {
			r.MinRTT = rtt
		}
		if o.Validate && !bytes.Equal(start.Bytes(), sink.Bytes()) {
			return r, fmt.Errorf("%w in ping %d: sent %.40q, got back %.40q", ErrMismatch, ping, start.Bytes(), sink.Bytes())
		}
		if o.Verbose != nil {
			fmt.Fprintf(o.Verbose, "ping data: %s\n", CString(sink.Bytes()))
		}
		r.Pings++
		r.Elapsed = time.Since(t0)
		r.Nudges = c.qp.Nudges()
	}
	// rping disconnects when its count is done; the server sees the close.
	dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.qp.Disconnect(dctx)
	return r, ctx.Err()
}

// connect connects qp to addr, from o.Source if set: dialed from it and
// handed over (QP.ConnectConn), as rping binds its client's rdma_cm id.
func connect(ctx context.Context, qp *gowarp.QP, addr string, o ClientOptions) error {
	if o.Source == "" {
		return qp.Connect(ctx, addr, o.Connect)
	}
	src, err := net.DefaultResolver.LookupNetIP(ctx, "ip", o.Source)
	if err != nil || len(src) == 0 {
		return fmt.Errorf("rping: source address %q: %w", o.Source, err)
	}
	from := src[0].Unmap()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))}
	if t := o.Connect.LinkTimeout; t > 0 {
		d.Timeout = t
	}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("rping: connect from %s: %w", from, err)
	}
	return qp.ConnectConn(ctx, conn, o.Connect)
}
