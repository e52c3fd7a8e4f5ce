package rping

import (
	"context"
	"errors"
	"fmt"

	"github.com/gowarp/gowarp"
)

// ErrDisconnected is returned when the peer leaves between pings, which
// ends a server's session normally.
var ErrDisconnected = errors.New("rping: peer disconnected")

// conn is one end of an rping connection: the queue pair, its completion
// queue, and the two 16-byte message buffers rping registers (the receive
// buffer with local write, the send buffer with no rights).
type conn struct {
	pd   *gowarp.PD
	qp   *gowarp.QP
	cq   *gowarp.CQ
	recv *gowarp.MR
	send *gowarp.MR
	mrs  []*gowarp.MR // every region registered for the connection (register)

	wc     [8]gowarp.Completion
	queued []gowarp.Completion
	// norecv is why the receive could not be reposted: the queue pair
	// failed after the last message arrived.
	norecv error
}

// sqDepth and the receive depth are rping's (RPING_SQ_DEPTH, max_recv_wr).
const sqDepth = 16

func newConn(dev *gowarp.Device) (*conn, error) {
	c := &conn{pd: dev.AllocPD(), cq: dev.NewCQ(2 * sqDepth)}
	var err error
	if c.qp, err = c.pd.NewQP(gowarp.QPConfig{SendCQ: c.cq, RecvCQ: c.cq, SendDepth: sqDepth, RecvDepth: 2}); err != nil {
		return nil, err
	}
	if c.recv, err = c.register(InfoLen, gowarp.LocalWrite); err != nil {
		c.close()
		return nil, err
	}
	if c.send, err = c.register(InfoLen, 0); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// register registers n bytes for the connection; close deregisters them.
func (c *conn) register(n int, acc gowarp.Access) (*gowarp.MR, error) {
	mr, err := c.pd.Register(make([]byte, n), acc)
	if err == nil {
		c.mrs = append(c.mrs, mr)
	}
	return mr, err
}

// postRecv posts the one receive for the peer's next message.
func (c *conn) postRecv() error {
	return c.qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: c.recv, Length: InfoLen}}})
}

// sendInfo Sends an advertisement (or, zero, a "go ahead").
func (c *conn) sendInfo(i Info) error {
	i.Append(c.send.Bytes()[:0])
	return c.qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpSend, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: c.send, Length: InfoLen}}})
}

// wait returns the next completion of kind op. Successful Send
// completions met on the way are consumed; any failed completion ends the
// wait with an error that says why the queue pair failed.
func (c *conn) wait(ctx context.Context, op gowarp.CompletionOp) (gowarp.Completion, error) {
	for {
		for len(c.queued) > 0 {
			w := c.queued[0]
			c.queued = c.queued[1:]
			if err := w.Err(); err != nil {
				return w, c.failure(w, err)
			}
			switch {
			case w.Op == op:
				return w, nil
			case w.Op == gowarp.CompSend:
			default:
				return w, fmt.Errorf("rping: unexpected %v completion while waiting for %v", w.Op, op)
			}
		}
		if n := c.cq.Poll(c.wc[:]); n > 0 {
			c.queued = c.wc[:n]
			continue
		}
		if err := c.cq.Wait(ctx); err != nil {
			return gowarp.Completion{}, err
		}
	}
}

// failure explains a failed completion by the queue pair's error: a
// flush because the peer closed the connection is ErrDisconnected.
func (c *conn) failure(w gowarp.Completion, err error) error {
	qerr := c.qp.Err()
	if errors.Is(err, gowarp.WRFlushError) && errors.Is(qerr, gowarp.ErrPeerClosed) {
		return ErrDisconnected
	}
	if qerr != nil {
		return fmt.Errorf("rping: %v completion: %w (%w)", w.Op, err, qerr)
	}
	return fmt.Errorf("rping: %v completion: %w", w.Op, err)
}

// recvInfo waits for the peer's next message, reposts the receive and
// decodes the message.
func (c *conn) recvInfo(ctx context.Context) (Info, error) {
	if c.norecv != nil {
		if errors.Is(c.qp.Err(), gowarp.ErrPeerClosed) {
			return Info{}, ErrDisconnected
		}
		return Info{}, c.norecv
	}
	w, err := c.wait(ctx, gowarp.CompRecv)
	if err != nil {
		return Info{}, err
	}
	if w.Bytes != InfoLen {
		return Info{}, fmt.Errorf("%w, size %d", ErrBadMessage, w.Bytes)
	}
	info, _ := ParseInfo(c.recv.Bytes())
	if err := c.postRecv(); err != nil {
		// Verbs would take the receive and flush it; report the failure
		// when the next message is awaited.
		c.norecv = fmt.Errorf("rping: reposting the receive: %w", err)
	}
	return info, nil
}

// close closes the queue pair and deregisters the connection's regions:
// a persistent server (-P) serves any number of clients, and a region
// left registered stays in the device's STag table for good.
func (c *conn) close() {
	c.qp.Close()
	for _, mr := range c.mrs {
		mr.Deregister() // the queue pair is closed: nothing pins it
	}
	c.mrs = nil
}
