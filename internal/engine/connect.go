package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/gowarp/gowarp/internal/cm"
)

// The connection's life: setup through the connection manager (Connect,
// Accept), the start of the paths, the nudge for siw's accept window, and
// the end (Disconnect, Close).

// ConnectOptions tune connection setup, on either side. The root
// package's ConnectOptions, converted to this type without a copy, is the
// documented one; layout_test.go keeps the two alike field by field.
type ConnectOptions struct {
	PrivateData []byte
	CRC         bool
	MPARevision int
	IRD, ORD    int
	NoP2P       bool
	SendFirst   bool
	// SendFirstDelay: see the root package's ConnectOptions.
	SendFirstDelay time.Duration
	MaxFPDU        int
	NoNudge        bool
	NudgeEvery     time.Duration
	LinkTimeout    time.Duration
	Extensions     bool
	// SharedMemory and SharedMemoryRing: see link_shm.go.
	SharedMemory     bool
	SharedMemoryRing int
	Tenant           string
	BusyPoll         time.Duration
}

// NoReads as ConnectOptions.IRD or ORD asks for none: IRD 0 serves no
// RDMA Reads from the peer, ORD 0 issues none (as perftest and rdma_cm
// clients that do not read ask). It is negative so that the zero value
// of ConnectOptions keeps meaning the defaults.
const NoReads = -1

// DefaultBusyPoll is the busy poll the cache asks for (see
// ConnectOptions.BusyPoll and fdLink.ReadIdle). It is off unless asked
// for because it spends CPU on every wait that the peer does not end
// within it: 8 connections pinged every millisecond cost their process
// 85 µs of CPU per ping spinning, against 29 µs parked.
const DefaultBusyPoll = 100 * time.Microsecond

// sendFirstDelay is how long a responder with SendFirst waits after its
// MPA reply for the initiator to speak before it speaks itself: long
// enough for siw's initiator to have read the reply (which it reads in a
// work item queued as the reply arrives), and once per connection only.
const sendFirstDelay = 20 * time.Millisecond

// Nudges are sent for the first nudgeTicks × NudgeEvery of a connection.
const nudgeTicks = 20

func (o *ConnectOptions) cm() cm.Options {
	return cm.Options{Revision: o.MPARevision, CRC: o.CRC, IRD: o.IRD, ORD: o.ORD, PrivateData: o.PrivateData, NoP2P: o.NoP2P, LinkTimeout: o.LinkTimeout, Ext: o.Extensions, Shm: o.SharedMemory, ShmRing: o.SharedMemoryRing, Tenant: o.Tenant}
}

// CheckConnect reports what is wrong with o (too much private data, an
// unknown MPA revision, a bad tenant name) before any connection is made.
func CheckConnect(o *ConnectOptions) error { return cm.Check(o.cm()) }

// Connect connects an idle queue pair to a listening peer at addr
// (host:port): TCP, then MPA, then the QP is ready.
// A Close while it is under way makes it fail with ErrClosed.
func (q *QP) Connect(ctx context.Context, addr string, o ConnectOptions) error {
	ctx, cancel, err := q.connecting(ctx, "Connect")
	if err != nil {
		return err
	}
	defer cancel()
	c, err := cm.Dial(ctx, addr, o.LinkTimeout)
	if err != nil {
		if dialTimedOut(ctx, err) {
			err = fmt.Errorf("%w: %w", ErrLinkTimeout, err)
		}
		err = q.closedErr(fmt.Errorf("gowarp: connect%s: %w", unnamed(addr, err), err))
		q.Close()
		return err
	}
	return q.initiate(ctx, c, &o, addr)
}

// unnamed returns " "+addr, or nothing where err names the address
// already (a dial's *net.OpError does): an error names it once.
func unnamed(addr string, err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Addr != nil {
		return ""
	}
	return " " + addr
}

// ConnectConn is Connect over a connection the caller has opened (TCP,
// TLS, any stream): MPA, then the QP is ready. The queue pair owns c from
// the call on, and closes it on failure.
func (q *QP) ConnectConn(ctx context.Context, c net.Conn, o ConnectOptions) error {
	ctx, cancel, err := q.connecting(ctx, "ConnectConn")
	if err != nil {
		c.Close()
		return err
	}
	defer cancel()
	cm.SetNoDelay(c)
	peer := "peer"
	if a := c.RemoteAddr(); a != nil {
		peer = a.String()
	}
	return q.initiate(ctx, c, &o, peer)
}

// initiate runs the initiator's MPA exchange on c and starts the queue pair.
func (q *QP) initiate(ctx context.Context, c net.Conn, o *ConnectOptions, peer string) error {
	r, err := cm.Initiate(ctx, c, o.cm())
	if err != nil {
		c.Close()
		err = setupErr(err)
		err = q.closedErr(fmt.Errorf("gowarp: connect %s: %w", peer, err))
		q.Close()
		return err
	}
	return q.begin(c, r, o, true)
}

// Accept accepts a connection request read by a listener on this idle
// queue pair, sending the MPA reply. A Close while it is under way makes
// it fail with ErrClosed and closes the request's connection. On a queue
// pair that is not idle it fails at once and leaves the connection open:
// the request may still be answered. With ctx already done it sends
// nothing, closes the connection and leaves the queue pair idle.
func (q *QP) Accept(ctx context.Context, req *cm.Request, o ConnectOptions) error {
	cctx, cancel, err := q.connecting(ctx, "Accept")
	if err != nil {
		if err == ctx.Err() {
			req.Conn().Close() // given up before the reply: the peer's Connect fails
		}
		return err
	}
	ctx = cctx
	defer cancel()
	c := req.Conn()
	r, err := req.Accept(ctx, o.cm())
	if err != nil {
		c.Close()
		err = setupErr(err)
		err = q.closedErr(err)
		q.Close()
		return err
	}
	return q.begin(c, r, &o, false)
}

// dialTimedOut reports whether err is the dial's own bound (the link
// timeout: no answer to the SYNs), not ctx's end. The socket's deadline,
// ctx's if that is the earlier, may fire before ctx says it is done.
func dialTimedOut(ctx context.Context, err error) bool {
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return false
	}
	return ctx.Err() == nil
}

// setupErr is err of the MPA exchange, matching ErrLinkTimeout when the
// link timeout ended it: the request or reply went unacknowledged.
func setupErr(err error) error {
	if timedOut(err) {
		return fmt.Errorf("%w: %w", ErrLinkTimeout, err)
	}
	return err
}

// connecting moves an idle queue pair to connecting and returns ctx with
// a cancel that a Close calls too: it stops the dial and the MPA exchange
// (cm sets a past deadline on the socket when ctx is done).
func (q *QP) connecting(ctx context.Context, call string) (context.Context, context.CancelFunc, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s := q.State(); s != StateIdle {
		if q.err != nil {
			return nil, nil, fmt.Errorf("%w: %s on a queue pair in state %s: %w", ErrBadState, call, s, q.err)
		}
		return nil, nil, fmt.Errorf("%w: %s on a queue pair in state %s", ErrBadState, call, s)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err // nothing tried: the queue pair stays idle
	}
	ctx, cancel := context.WithCancel(ctx)
	q.abort = cancel
	q.state.Store(int32(StateConnecting))
	return ctx, cancel, nil
}

// closedErr returns err, saying why if the queue pair was closed or failed
// meanwhile: the cause (ErrClosed after a Close) is what callers match.
// Callers look before they close the queue pair themselves, or every
// failed connect would read as closed.
func (q *QP) closedErr(err error) error {
	if cause := q.Err(); cause != nil && cause != err {
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return err
}

func (q *QP) begin(c net.Conn, r cm.Result, o *ConnectOptions, initiator bool) error {
	q.mu.Lock()
	q.peerData = append([]byte(nil), r.PrivateData...)
	q.mu.Unlock()
	p := Params{CRC: r.CRC, IRD: r.IRD, ORD: r.ORD, SendRTR: r.SendRTR, MaxFPDU: o.MaxFPDU, Ext: r.Ext, BusyPoll: o.BusyPoll}
	p.HoldTx, p.SpeakAfter = holdTx(r.HoldTx, o)
	if initiator && !o.NoNudge {
		p.Nudge = cmp.Or(o.NudgeEvery, 200*time.Millisecond)
	}
	if err := q.Start(q.newLink(c, &r, o), p); err != nil {
		c.Close()
		r.Shm.Unmap()
		return err
	}
	return nil
}

// PeerPrivateData returns the private data the peer sent while connecting.
func (q *QP) PeerPrivateData() []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.peerData
}

// Start moves an idle or connecting queue pair to ready over link, with
// the negotiated parameters, and starts its receive and transmit paths.
func (q *QP) Start(link Link, p Params) error {
	q.mu.Lock()
	s := q.State()
	if s != StateIdle && s != StateConnecting {
		err := q.err
		q.mu.Unlock()
		if err != nil {
			return fmt.Errorf("%w: cannot start a queue pair in state %s: %w", ErrBadState, s, err)
		}
		return fmt.Errorf("%w: cannot start a queue pair in state %s", ErrBadState, s)
	}
	q.readyLocked(link, p)
	q.txFn = q.txLoop
	// Under mu: a Close (whose fail takes mu) either finds the queue pair
	// idle and Start refusing, or waits for these goroutines.
	q.wg.Add(1)
	if p.Nudge > 0 {
		q.wg.Add(1)
	}
	q.mu.Unlock()
	go q.rxLoop()
	if p.Nudge > 0 {
		go q.nudgeLoop(p.Nudge)
	}
	if p.HoldTx && p.SpeakAfter > 0 {
		time.AfterFunc(p.SpeakAfter, q.speak)
	}
	if p.SendRTR != 0 {
		q.kick()
	}
	return nil
}

// readyLocked sets the queue pair up over link with the negotiated
// parameters and makes it ready, starting no goroutine: what Start does
// before it starts the paths, and all the core tests need.
func (q *QP) readyLocked(link Link, p Params) {
	p.IRD = min(max(p.IRD, 0), 128)
	p.ORD = min(max(p.ORD, 0), 128)
	q.params = p
	q.link = link
	if b, ok := link.(interface {
		setBusyPoll(time.Duration, *atomic.Bool, *atomic.Int32)
	}); ok && p.BusyPoll > 0 {
		// A spinning reader stops when the doorbell rings, and does not
		// spin while a large Read's response streams in.
		b.setBusyPoll(p.BusyPoll, &q.bell, &q.largeReads)
	}
	q.orq = make([]orqEntry, p.ORD)
	q.irq = make([]irqEntry, p.IRD)
	q.tx.init(q, link)
	q.rx.init(q)
	if !p.HoldTx {
		q.peerUp.Store(true)
	}
	q.abort = nil
	q.state.Store(int32(StateReady))
}

// holdTx returns Params.HoldTx and SpeakAfter for a connection whose
// handshake says hold (a responder without peer-to-peer mode).
func holdTx(hold bool, o *ConnectOptions) (bool, time.Duration) {
	if !hold || !o.SendFirst {
		return hold, 0
	}
	if d := cmp.Or(o.SendFirstDelay, sendFirstDelay); d > 0 {
		return true, d
	}
	return false, 0
}

// speak lets a responder with SendFirst transmit although the initiator
// has not spoken yet (Params.SpeakAfter).
func (q *QP) speak() {
	// Closing too: a Disconnect waits for the sends queued before it.
	if s := q.State(); (s == StateReady || s == StateClosing) && q.peerUp.CompareAndSwap(false, true) {
		q.kick()
	}
}

// nudgeLoop wakes a peer that may have missed what this side sent while
// it was accepting (siw: docs/interop.md §1). While the peer has sent
// nothing, each tick at which this side has sent something and nothing
// more since the last tick frames a zero-length Write; the bytes it
// brings make such a peer read the ones it missed. It gives up after
// nudgeTicks ticks: by then a responder has long finished accepting.
func (q *QP) nudgeLoop(every time.Duration) {
	defer q.wg.Done()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last uint64
	for range nudgeTicks {
		select {
		case <-q.done:
			return
		case <-tick.C:
		}
		if q.heard.Load() || q.State() != StateReady {
			return
		}
		q.mu.Lock()
		sent := q.tx.built
		if sent == 0 || sent != last || q.txBusy {
			last = sent
			q.mu.Unlock()
			continue
		}
		q.nudgeDue = true
		q.kickLocked()
	}
}

// Nudges returns how many zero-length Writes the queue pair sent to wake
// a peer that had not answered yet (see ConnectOptions.NoNudge).
func (q *QP) Nudges() int { return int(q.nudges.Load()) }

// Disconnect closes the connection gracefully: it stops new work, waits
// (until ctx is done) for queued sends to leave, closes the TCP
// connection and flushes whatever is left.
func (q *QP) Disconnect(ctx context.Context) error {
	q.mu.Lock()
	if q.State() == StateReady {
		q.state.Store(int32(StateClosing))
	}
	for {
		q.dcLooks.Add(1)
		idle := q.sqTx == q.sqTail && !q.txBusy && q.orqHead == q.orqTail
		if idle || q.State() == StateError {
			break
		}
		// The paths that could make it idle (the transmit role let go, the
		// last Read answered, a failure) close the channel: no ticking.
		if q.drained == nil {
			q.drained = make(chan struct{})
		}
		ch := q.drained
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			q.Close()
			return ctx.Err()
		case <-ch:
		}
		q.mu.Lock()
	}
	q.mu.Unlock()
	q.fail(ErrClosed)
	q.Close()
	return nil
}

// drainedLocked wakes Disconnect calls waiting for the queue pair to have
// nothing in flight, to look again.
func (q *QP) drainedLocked() {
	if q.drained != nil {
		close(q.drained)
		q.drained = nil
	}
}

// Close tears the queue pair down at once, flushing all outstanding work,
// and waits for its goroutines to stop. If the queue pair is sending a
// Terminate (it found an error in the peer's input), Close first lets the
// Terminate reach the socket, so the peer learns why: that waits at most
// termTimeout (1 s) from the error, for a peer that does not read.
func (q *QP) Close() error {
	q.fail(ErrClosed)
	q.mu.Lock()
	term, link := q.termDone, q.link
	q.mu.Unlock()
	inFn := q.inFn.Load()
	if term != nil && !inFn {
		<-term
	}
	q.closing.Do(func() {
		close(q.done)
		q.cfg.SendCQ.detach(q)
		if q.cfg.RecvCQ != q.cfg.SendCQ {
			q.cfg.RecvCQ.detach(q)
		}
	})
	if link != nil {
		link.Close()
	}
	if inFn {
		// Called from a ProgressFunc's function (or while one runs),
		// which holds the receive path the goroutines below wait for:
		// ProgressFunc finishes the close as it returns. The flag is set
		// before inFn is looked at again, and ProgressFunc clears inFn
		// before it looks at the flag, so one of the two sees the other:
		// a function that returned meanwhile leaves the close to us.
		q.closeLater.Store(true)
		if q.inFn.Load() {
			return nil
		}
	}
	q.mu.Lock()
	q.txGone = true // no transmit goroutine starts while we wait
	q.mu.Unlock()
	q.wg.Wait()
	q.mu.Lock()
	if q.txBusy && q.txHanded {
		// Handed to the transmit goroutine, which stopped first: nobody
		// holds the role, so its send-queue flush falls to us.
		q.txHanded = false
		q.releaseTxLocked()
	}
	q.mu.Unlock()
	q.forget()
	return nil
}

// forget drops what a closed queue pair still points at of the memory its
// work used: pieces and regions in the receive path's state, the sinks in
// the ORQ's slots. A closed queue pair lives on in the device's events,
// which an application may never read, and in its own maps: it must not
// keep the buffers of regions deregistered since (with a server's last
// 256 clients' in its event buffer, that was hundreds of MB). A receive
// path still held (a waiter on its way out) keeps its state.
func (q *QP) forget() {
	if q.rxMu.TryLock() {
		r := &q.rx
		r.release() // its holds end (held cleared), if a failure left any
		clear(r.iov[:cap(r.iov)])
		clear(r.dst[:cap(r.dst)])
		r.iov, r.dst, r.di = r.iov[:0], r.dst[:0], 0
		r.fileChk = fileCheck{}
		r.recv, r.recvWQE = nil, rqEntry{}
		q.rxMu.Unlock()
	}
	q.mu.Lock()
	if !q.txBusy {
		clear(q.orq)
	}
	q.mu.Unlock()
}
