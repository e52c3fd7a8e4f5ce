package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gowarp/gowarp"
)

// Client is one session with a server: a queue pair, its receive pool,
// a slot per outstanding call and a heap whose buffers can be lent to
// calls by reference. Its methods are safe for concurrent use.
type Client struct {
	pd      *gowarp.PD
	cq      *gowarp.CQ
	qp      *gowarp.QP
	log     *slog.Logger
	session uint64
	maxMsg  int

	sendMR *gowarp.MR // per slot: a call message, then a cancel
	recvMR *gowarp.MR // per slot: a reply
	recvs  []gowarp.RecvWR
	slots  []clientSlot
	free   chan uint16
	seq    atomic.Uint64
	cancel atomic.Int32 // cancel messages the server has room for

	heap  heap
	sends combiner

	// lead is held by the one caller that polls the completion queue for
	// everyone: a waiting caller receives its own reply on its own
	// goroutine (the CQ's inline receive) when nobody else is polling, and
	// otherwise is handed it. No goroutine of the session's own.
	lead   chan struct{}
	wc     [64]gowarp.Completion // the leader's
	closed chan struct{}
	// done is canceled with the session: it stops a reaper's wait.
	done      context.Context
	stop      context.CancelFunc
	abandoned atomic.Int32 // calls given up on, whose replies are still to come
	once      sync.Once
	err       error // why the session ended; read after closed
}

// Slot states.
const (
	slotIdle      = iota
	slotWaiting   // posted, the caller waits
	slotGivingUp  // the caller gives up: it cancels and detaches, the slot still its own
	slotAbandoned // the caller gave up; the poller revokes and frees the slot on the reply
	slotDone      // the poller delivered the reply
)

type clientSlot struct {
	state   atomic.Uint32
	id      uint64
	method  string
	reply   []byte // the caller's buffer, then the reply in it
	err     error
	done    chan struct{}
	handles [MaxRefs]Handle
	windows [MaxRefs]*gowarp.MR
	nwin    int
	msg     []byte // the slot's message buffer
	cancel  []byte
	wr      gowarp.SendWR
	sge     [1]gowarp.SGE
}

// Dial connects a session to the server at addr (host:port).
func Dial(ctx context.Context, dev *gowarp.Device, addr string, o Options) (*Client, error) {
	o = o.withDefaults()
	c := &Client{pd: dev.AllocPD(), log: o.Logger, maxMsg: o.MaxMessage, closed: make(chan struct{}), lead: make(chan struct{}, 1)}
	n := o.Slots
	c.cq = dev.NewCQ(2*n + cancelCredits + 16)
	qp, err := c.pd.NewQP(gowarp.QPConfig{SendCQ: c.cq, RecvCQ: c.cq, SendDepth: n + cancelCredits + 8, RecvDepth: n})
	if err != nil {
		return nil, fmt.Errorf("rpc: dial: %w", err)
	}
	c.qp = qp
	failed := func(err error) (*Client, error) {
		qp.Close()
		c.release()
		return nil, err
	}
	if c.recvMR, err = c.pd.Register(make([]byte, n*o.MaxMessage), gowarp.LocalWrite); err != nil {
		return failed(fmt.Errorf("rpc: dial: %w", err))
	}
	c.recvs = make([]gowarp.RecvWR, n)
	for i := range c.recvs {
		c.recvs[i] = gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: c.recvMR, Offset: i * o.MaxMessage, Length: o.MaxMessage}}}
	}
	if _, err := qp.PostRecvList(c.recvs); err != nil {
		return failed(fmt.Errorf("rpc: dial: %w", err))
	}
	pd := hello{Slots: uint16(n), MaxMessage: uint32(o.MaxMessage)}.append(nil)
	if err := qp.Connect(ctx, addr, gowarp.ConnectOptions{PrivateData: pd, IRD: 128, ORD: 16}); err != nil {
		return failed(fmt.Errorf("rpc: dial: %w", err)) // Connect's error names addr
	}
	h, err := parseHello(qp.PeerPrivateData())
	if err != nil || int(h.Slots) > n || int(h.MaxMessage) > o.MaxMessage {
		return failed(fmt.Errorf("rpc: dial %s: server's hello: %w", addr, errors.Join(err, ErrMalformed)))
	}
	n, c.maxMsg, c.session = int(h.Slots), int(h.MaxMessage), h.Session
	c.cancel.Store(cancelCredits)
	sendBuf := make([]byte, n*(c.maxMsg+cancelLen))
	if c.sendMR, err = c.pd.Register(sendBuf, gowarp.LocalWrite); err != nil {
		return failed(fmt.Errorf("rpc: dial: %w", err))
	}
	c.slots = make([]clientSlot, n)
	c.free = make(chan uint16, n)
	for i := range c.slots {
		s := &c.slots[i]
		s.done = make(chan struct{}, 1)
		s.msg = sendBuf[i*c.maxMsg : (i+1)*c.maxMsg : (i+1)*c.maxMsg]
		off := n*c.maxMsg + i*cancelLen
		s.cancel = sendBuf[off : off+cancelLen : off+cancelLen]
		s.wr.Op = gowarp.OpSend
		s.wr.SGL = s.sge[:]
		c.free <- uint16(i)
	}
	c.heap.init(o.HeapSize)
	c.done, c.stop = context.WithCancel(context.Background())
	return c, nil
}

// Session returns the session's identity, chosen by the server.
func (c *Client) Session() uint64 { return c.session }

// Call calls method with arg passed by value and appends the result to
// reply[:0], returning it. The argument must fit in a message (see
// Options.MaxMessage); larger ones go by reference with Do.
func (c *Client) Call(ctx context.Context, method string, arg, reply []byte) ([]byte, error) {
	cl := Call{Method: method, Arg: arg, Reply: reply}
	err := c.Do(ctx, &cl)
	return cl.Reply, err
}

// Call is one call: the method, the argument passed by value, spans of
// the client's heap passed by reference, and the buffer the result is
// appended to.
type Call struct {
	Method string
	Arg    []byte
	Refs   []Span
	Reply  []byte
}

// Do performs a call and waits for its reply, until ctx is done. The
// spans in cl.Refs are lent to the server for this call only: each is
// registered as a region of its own with just the rights it needs, and
// is out of the server's reach before Do returns, whatever the outcome.
// When ctx ends first, Do tells the server (best effort) and returns
// ctx's error; the session and its other calls carry on.
func (c *Client) Do(ctx context.Context, cl *Call) error {
	if len(cl.Refs) > MaxRefs {
		return fmt.Errorf("rpc: %s: %d references, at most %d", cl.Method, len(cl.Refs), MaxRefs)
	}
	if len(cl.Method) == 0 || len(cl.Method) > maxMethod {
		return fmt.Errorf("rpc: method name of %d bytes", len(cl.Method))
	}
	if n := callLen(cl.Method, len(cl.Refs), len(cl.Arg)); n > c.maxMsg {
		return fmt.Errorf("%w: call of %d bytes, messages hold %d", ErrTooLarge, n, c.maxMsg)
	}
	// A done context sends nothing, even with a slot free.
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rpc: %s: %w", cl.Method, err)
	}
	var timeout uint32
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d)
		if left <= 0 {
			return fmt.Errorf("rpc: %s: %w", cl.Method, context.DeadlineExceeded)
		}
		timeout = uint32(min(left.Microseconds()+1, math.MaxUint32))
	}
	var i uint16
	select {
	case i = <-c.free:
	default:
		select {
		case i = <-c.free:
		case <-ctx.Done():
			return fmt.Errorf("rpc: %s: %w", cl.Method, ctx.Err())
		case <-c.closed:
			return c.closedErr()
		}
	}
	s := &c.slots[i]
	s.id = c.seq.Add(1)<<16 | uint64(i)
	s.method, s.reply, s.err = cl.Method, cl.Reply[:0], nil
	for j, sp := range cl.Refs {
		if err := c.lend(s, j, sp); err != nil {
			c.revoke(s)
			c.free <- i
			return fmt.Errorf("rpc: %s: %w", cl.Method, err)
		}
	}
	m := appendCallHeader(s.msg[:0], s.id, timeout, cl.Method, s.handles[:len(cl.Refs)], len(cl.Arg))
	m = append(m, cl.Arg...)
	others := len(c.free) < len(c.slots)-1
	if others {
		setCallFlags(m, callMore)
	}
	s.sge[0] = gowarp.SGE{MR: c.sendMR, Offset: int(i) * c.maxMsg, Length: len(m)}
	s.wr.ID = s.id
	s.state.Store(slotWaiting)
	if err := c.sends.post(c.qp, others, s.wr); err != nil {
		// Calls of other callers may have been in the batch: all fail.
		c.fail(err)
	}
wait:
	for {
		select {
		case <-s.done:
			break wait
		case c.lead <- struct{}{}:
			c.pollFor(ctx, s)
			<-c.lead
			if s.state.Load() == slotDone {
				<-s.done
				break wait
			}
		case <-c.closed:
			// The session ended; fail may have passed this slot by before
			// it was posted.
			if s.state.CompareAndSwap(slotWaiting, slotDone) {
				s.err = c.closedErr()
			} else {
				<-s.done
			}
			break wait
		case <-ctx.Done():
			if s.state.CompareAndSwap(slotWaiting, slotGivingUp) {
				// The slot stays this caller's until its cancel has the
				// call's id and its windows are detached: a reply freeing
				// it sooner let the slot's next call be canceled and its
				// windows detached.
				c.sendCancel(s)
				// The server may be reading or writing a window at this
				// moment. Deregistered, the window would make that access
				// an invalid STag, which the engine answers by ending the
				// session and every other call on it; detached, the access
				// reaches a sink, and the memory is out of reach all the
				// same. The windows go with the call's reply.
				c.detach(s)
				if s.state.CompareAndSwap(slotGivingUp, slotAbandoned) {
					if c.abandoned.Add(1) == 1 {
						go c.reap()
					}
					return fmt.Errorf("rpc: %s: %w", cl.Method, ctx.Err())
				}
				<-s.done // the reply came meanwhile; the slot is freed below
				s.err = fmt.Errorf("rpc: %s: %w", cl.Method, ctx.Err())
				break wait
			}
			<-s.done // the reply is being delivered
			break wait
		}
	}
	err := s.err
	if err == nil {
		cl.Reply = s.reply
	}
	c.revoke(s)
	s.reply, s.err = nil, nil
	s.state.Store(slotIdle)
	c.free <- i
	return err
}

// lend registers span sp as the j-th window of slot s.
func (c *Client) lend(s *clientSlot, j int, sp Span) error {
	if sp.buf == nil || sp.buf.c != c {
		return fmt.Errorf("%w: span of another client's heap", ErrBadHandle)
	}
	if sp.buf.freed.Load() {
		return fmt.Errorf("%w: span of a freed buffer", ErrBadHandle)
	}
	acc := gowarp.RemoteRead
	if sp.write {
		acc |= gowarp.RemoteWrite
	}
	b := sp.buf.data[sp.off : sp.off+sp.n]
	if sp.n == 0 {
		s.windows[j], s.handles[j] = nil, Handle{Writable: sp.write, Session: c.session, Call: s.id}
		s.nwin = j + 1
		return nil
	}
	mr, err := c.pd.Register(b, acc)
	if err != nil {
		return err
	}
	s.windows[j] = mr
	s.nwin = j + 1
	s.handles[j] = Handle{STag: uint32(mr.STag()), Writable: sp.write, Addr: mr.Addr(), Len: uint64(sp.n), Session: c.session, Call: s.id}
	return nil
}

// detach detaches a slot's windows (gowarp.MR.Detach). One whose
// accesses in progress do not end (a peer stopped in the middle of an
// FPDU) may still be written: the session ends, which ends them, and the
// window is deregistered.
func (c *Client) detach(s *clientSlot) {
	for _, mr := range s.windows[:s.nwin] {
		if mr == nil {
			continue
		}
		if err := mr.Detach(context.Background()); err != nil {
			c.log.Error("rpc: a window of a call given up on stays in use", "stag", mr.STag(), "err", err)
			c.fail(fmt.Errorf("rpc: a window of a call given up on: %w", err))
			c.revoke(s)
			return
		}
	}
}

// revoke deregisters a slot's windows. A window the peer is still being
// answered a Read from is busy until the answer has left; it is retried
// until then, so that no window outlives the call.
func (c *Client) revoke(s *clientSlot) {
	for j := range s.nwin {
		mr := s.windows[j]
		if mr == nil {
			continue
		}
		for tries := 0; ; tries++ {
			err := mr.Deregister()
			if err == nil || !errors.Is(err, gowarp.ErrRegionBusy) {
				break
			}
			if tries > 200000 { // 10 s: a broken engine, not a peer
				c.log.Error("rpc: window stays busy", "stag", mr.STag())
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
		s.windows[j] = nil
	}
	s.nwin = 0
}

// sendCancel tells the server the caller gave up, if it has a receive
// buffer to spare for that; otherwise the server finds out when its
// handler's deadline, if any, passes.
func (c *Client) sendCancel(s *clientSlot) {
	for {
		n := c.cancel.Load()
		if n <= 0 {
			return
		}
		if c.cancel.CompareAndSwap(n, n-1) {
			break
		}
	}
	appendCancel(s.cancel[:0], s.id)
	i := int(s.id & 0xffff)
	wr := gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: c.sendMR, Offset: len(c.slots)*c.maxMsg + i*cancelLen, Length: cancelLen}}}
	// Through the combiner, behind the call: the call may still wait there
	// for a poster that yielded, and a cancel that overtook it would find
	// nothing to cancel.
	_ = c.sends.post(c.qp, false, wr) // a session that is gone needs no cancel
}

// reap polls while calls that were given up on still wait for their
// replies and no caller does: their slots come back even if no call
// follows.
func (c *Client) reap() {
	select {
	case c.lead <- struct{}{}:
	case <-c.closed:
		return
	}
	defer func() { <-c.lead }()
	for c.abandoned.Load() > 0 {
		select {
		case <-c.closed:
			return
		default:
		}
		if err := c.cq.Wait(c.done); err != nil {
			if c.done.Err() == nil {
				c.fail(err)
			}
			return
		}
		if !c.dispatch() {
			return
		}
	}
}

// pollFor polls the completion queue, delivering replies to whoever
// waits for them, until slot s has its reply, ctx ends or the session
// fails.
func (c *Client) pollFor(ctx context.Context, s *clientSlot) {
	for s.state.Load() != slotDone {
		select {
		case <-c.closed:
			return
		default:
		}
		if err := c.cq.Wait(ctx); err != nil {
			if ctx.Err() == nil {
				c.fail(err)
			}
			return
		}
		if !c.dispatch() {
			return
		}
	}
}

// dispatch delivers the completions waiting; false if the session failed.
func (c *Client) dispatch() bool {
	n := c.cq.Poll(c.wc[:])
	for k := range c.wc[:n] {
		w := &c.wc[k]
		if err := w.Err(); err != nil {
			c.fail(errors.Join(err, c.qp.Err()))
			return false
		}
		if w.Op != gowarp.CompRecv {
			continue
		}
		if err := c.onReply(int(w.ID), w.Bytes); err != nil {
			c.fail(err)
			return false
		}
	}
	return true
}

// onReply delivers the reply in receive buffer k and reposts the buffer.
func (c *Client) onReply(k, n int) error {
	if k >= len(c.recvs) {
		return fmt.Errorf("%w: completion for receive %d", ErrMalformed, k)
	}
	off := k * c.maxMsg
	r, err := parseReply(c.recvMR.Bytes()[off : off+n])
	if err != nil {
		return err
	}
	i := int(r.ID & 0xffff)
	if i >= len(c.slots) || c.slots[i].id != r.ID {
		return fmt.Errorf("%w: reply to call %#x, which is not outstanding", ErrMalformed, r.ID)
	}
	if r.Credits > 0 {
		c.cancel.Add(int32(r.Credits))
	}
	s := &c.slots[i]
	// The receive goes back before the caller learns of the reply: the
	// caller may send its next call at once, and its reply needs a buffer.
	var deliver bool
	switch {
	case s.state.CompareAndSwap(slotWaiting, slotDone):
		if r.Status == statusOK {
			s.reply = append(s.reply[:0], r.Payload...)
		} else {
			s.err = &Error{Method: s.method, Status: r.Status, Msg: string(r.Payload)}
		}
		deliver = true
	case s.state.CompareAndSwap(slotGivingUp, slotDone):
		deliver = true // the caller that gives up frees the slot
	case s.state.CompareAndSwap(slotAbandoned, slotIdle):
		// The server is done with the call: its detached windows go.
		c.revoke(s)
		s.reply = nil
		c.abandoned.Add(-1)
	default:
		return fmt.Errorf("%w: second reply to call %#x", ErrMalformed, r.ID)
	}
	if err := c.qp.PostRecv(&c.recvs[k]); err != nil {
		return err
	}
	if deliver {
		s.done <- struct{}{}
	} else {
		c.free <- uint16(i)
	}
	return nil
}

// release deregisters the session's message buffers, once its queue
// pair is closed (nothing pins them then): a process that opens and closes
// sessions would otherwise keep every closed one's buffers registered.
func (c *Client) release() {
	for _, mr := range []*gowarp.MR{c.sendMR, c.recvMR} {
		if mr != nil {
			if err := mr.Deregister(); err != nil {
				c.log.Error("rpc: a closed session's buffer stays registered", "stag", mr.STag(), "err", err)
			}
		}
	}
}

// fail ends the session: every outstanding call gets err.
func (c *Client) fail(err error) {
	c.once.Do(func() {
		c.err = err
		close(c.closed)
		c.stop()
		c.qp.Close()
		defer c.release() // after the windows of the calls given up on
		for i := range c.slots {
			s := &c.slots[i]
			switch {
			case s.state.CompareAndSwap(slotWaiting, slotDone):
				s.err = c.closedErr()
				s.done <- struct{}{}
			case s.state.CompareAndSwap(slotAbandoned, slotDone):
				// No reply will come: the detached windows go now.
				c.revoke(s)
			}
		}
	})
}

func (c *Client) closedErr() error {
	if c.err != nil {
		return fmt.Errorf("%w: %w", ErrSessionClosed, c.err)
	}
	return ErrSessionClosed
}

// Err returns why the session ended, or nil while it is up.
func (c *Client) Err() error {
	select {
	case <-c.closed:
		return c.closedErr()
	default:
		return nil
	}
}

// Close ends the session; outstanding calls fail with ErrSessionClosed.
func (c *Client) Close() error {
	c.fail(nil)
	return nil
}
