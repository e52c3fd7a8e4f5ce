package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gowarp/gowarp"
)

// Handler serves one call. It reads the argument with ServerCall.Arg and
// the references with ServerCall.Ref, and answers with Reply (or by
// writing into ReplyBuffer's memory and calling Reply with it). A non-nil
// error goes to the caller with its message instead of a reply. ctx ends
// when the caller gives up, its deadline passes or the session ends; the
// call and its references are valid only until the handler returns.
type Handler func(ctx context.Context, c *ServerCall) error

// Server serves registered methods to any number of sessions.
type Server struct {
	dev  *gowarp.Device
	opts Options
	log  *slog.Logger

	mu       sync.RWMutex
	methods  map[string]*method
	sessions map[*session]struct{}
	closed   bool

	stats serverStats
}

type method struct {
	name   string
	h      Handler
	onPoll bool // runs on the session's poller (RegisterNonBlocking)
}

type serverStats struct {
	calls, msgBytes, readBytes, writeBytes, reads atomic.Uint64
}

// Stats are a server's counters since it started.
type Stats struct {
	Calls        uint64 // calls handled
	MessageBytes uint64 // bytes of call and reply messages, headers included
	ReadBytes    uint64 // bytes fetched from clients with RDMA Read
	Reads        uint64 // RDMA Reads issued
	WriteBytes   uint64 // bytes written into clients' heaps with RDMA Write
}

// NewServer returns a server with no methods yet.
func NewServer(dev *gowarp.Device, o Options) *Server {
	o = o.withDefaults()
	return &Server{dev: dev, opts: o, log: o.Logger, methods: map[string]*method{}, sessions: map[*session]struct{}{}}
}

// Register adds a method. Its handler may block: a call by value starts
// on the session's poller, which a watchdog replaces with a new goroutine
// if the handler has not returned within 50 µs; a call with references
// runs on a goroutine of its own.
func (s *Server) Register(name string, h Handler) { s.register(name, h, false) }

// RegisterNonBlocking adds a method whose handler never blocks: calls
// that pass no reference run it on the session's poller, between
// receiving the call and sending the reply, with no goroutine hand-off,
// and their replies leave in batches. A handler that waits would hold up
// every call of its session.
func (s *Server) RegisterNonBlocking(name string, h Handler) { s.register(name, h, true) }

func (s *Server) register(name string, h Handler, onPoll bool) {
	if len(name) == 0 || len(name) > maxMethod {
		panic(fmt.Sprintf("rpc: method name of %d bytes", len(name)))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.methods[name] = &method{name: name, h: h, onPoll: onPoll}
}

// RegisterFunc adds a method with a by-value argument and result.
func (s *Server) RegisterFunc(name string, f func(ctx context.Context, arg []byte) ([]byte, error)) {
	s.Register(name, func(ctx context.Context, c *ServerCall) error {
		r, err := f(ctx, c.Arg())
		if err != nil {
			return err
		}
		return c.Reply(r)
	})
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	return Stats{
		Calls: s.stats.calls.Load(), MessageBytes: s.stats.msgBytes.Load(),
		ReadBytes: s.stats.readBytes.Load(), Reads: s.stats.reads.Load(), WriteBytes: s.stats.writeBytes.Load(),
	}
}

// Serve accepts sessions on ln until ctx is done, the listener is closed
// or the server is closed. Each session is served on its own poller; a
// session that fails ends alone.
func (s *Server) Serve(ctx context.Context, ln *gowarp.Listener) error {
	for {
		req, err := ln.Accept(ctx)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			if err := s.open(ctx, req); err != nil {
				s.log.Info("rpc: session refused", "peer", req.RemoteAddr(), "err", err)
			}
		}()
	}
}

// Close ends every session; their handlers see their contexts end.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	ss := make([]*session, 0, len(s.sessions))
	for x := range s.sessions {
		ss = append(ss, x)
	}
	s.mu.Unlock()
	for _, x := range ss {
		x.close(ErrSessionClosed)
	}
	for _, x := range ss {
		<-x.gone
	}
	return nil
}

// session is the server's end of one client's session.
type session struct {
	srv     *Server
	id      uint64
	pd      *gowarp.PD
	cq      *gowarp.CQ
	qp      *gowarp.QP
	maxMsg  int
	recvMR  *gowarp.MR
	sendMR  *gowarp.MR
	recvs   []gowarp.RecvWR
	calls   []ServerCall  // one per client slot
	sends   combiner      // replies
	credits atomic.Uint32 // receive buffers reposted for cancels, not yet told
	active  atomic.Int32  // calls begun whose replies are not posted yet (by goroutines)

	ctx    context.Context
	cancel context.CancelCauseFunc
	once   sync.Once
	gone   chan struct{}
	wg     sync.WaitGroup // handlers running on goroutines

	chunkMu sync.Mutex
	chunks  []*gowarp.MR
	all     []*gowarp.MR // every chunk, to deregister at the end

	// The poller's: held by the goroutine polling.
	lead   chan struct{}
	spares atomic.Int32    // goroutines waiting to take the poller's role
	batch  []gowarp.SendWR // replies of non-blocking handlers, one doorbell
	// batchMore says a call of the batch was sent with others in flight:
	// the batch goes to the flusher (see flusher).
	batchMore bool
	// kick wakes the flusher.
	kick chan struct{}
	next *ServerCall // a call the poller runs itself, after handing its role on
	// inline is a generation<<2 | state of the call the poller runs
	// itself; the watchdog starts a new poller if it runs too long. The
	// watchdog is a timer that re-arms itself while calls keep coming
	// (resetting a timer per call cost ~10 µs of latency: it wakes the
	// runtime's timer thread), checking the running call's age.
	inline      atomic.Uint64
	inlineStart atomic.Int64 // when the running call started, UnixNano
	watchdog    *time.Timer
	armed       atomic.Bool
	seen        atomic.Uint64 // the generation the watchdog last saw
}

const (
	inlineRunning = 1
	inlineHanded  = 2
	// handoffAfter is how long a handler called by value may run on the
	// poller before another goroutine takes over polling; the watchdog
	// looks every watchPeriod, so a blocking handler holds the poller up
	// for at most their sum (and the timer's lateness).
	handoffAfter = 50 * time.Microsecond
	watchPeriod  = 100 * time.Microsecond
)

// watch marks the start of call generation g on the poller and arms the
// watchdog if it sleeps.
func (x *session) watch(g uint64) {
	x.inlineStart.Store(time.Now().UnixNano())
	x.inline.Store(g<<2 | inlineRunning)
	if !x.armed.Load() && x.armed.CompareAndSwap(false, true) {
		x.watchdog.Reset(watchPeriod)
	}
}

// handOff is the watchdog: a call run on the poller for handoffAfter
// gets a new poller started (the lead token stays held, now by it); while
// calls keep coming the watchdog re-arms, and sleeps once they stop.
func (x *session) handOff() {
	if x.ctx.Err() != nil {
		x.armed.Store(false)
		return
	}
	v := x.inline.Load()
	if v&3 == inlineRunning {
		age := time.Duration(time.Now().UnixNano() - x.inlineStart.Load())
		if age < handoffAfter {
			x.watchdog.Reset(handoffAfter - age)
			return
		}
		if x.inline.CompareAndSwap(v, v&^3|inlineHanded) {
			x.wg.Add(1) // the running poller has not returned: the count is not zero
			go x.poll(false)
		}
	}
	if g := x.inline.Load() >> 2; g != x.seen.Swap(g) {
		x.watchdog.Reset(watchPeriod)
		return
	}
	x.armed.Store(false)
	// A call that started just now saw the watchdog armed: arm it again.
	if x.inline.Load()>>2 != x.seen.Load() && x.armed.CompareAndSwap(false, true) {
		x.watchdog.Reset(watchPeriod)
	}
}

func (s *Server) open(ctx context.Context, req *gowarp.ConnRequest) error {
	h, err := parseHello(req.PrivateData())
	if err != nil {
		return errors.Join(err, req.Reject([]byte("not an rpc session")))
	}
	n := min(int(h.Slots), s.opts.Slots)
	msg := min(int(h.MaxMessage), s.opts.MaxMessage)
	x := &session{srv: s, id: rand.Uint64() | 1, pd: s.dev.AllocPD(), maxMsg: msg, gone: make(chan struct{}), lead: make(chan struct{}, 1), kick: make(chan struct{}, 1)}
	x.ctx, x.cancel = context.WithCancelCause(context.Background())
	x.sends.posted = x.posted
	nrecv := n + cancelCredits
	x.cq = s.dev.NewCQ(nrecv + 6*n + 16)
	if x.qp, err = x.pd.NewQP(gowarp.QPConfig{SendCQ: x.cq, RecvCQ: x.cq, SendDepth: 6 * n, RecvDepth: nrecv}); err != nil {
		return errors.Join(err, req.Reject(nil))
	}
	// A session refused before it is accepted leaves nothing behind.
	refuse := func(err error) error {
		x.qp.Close()
		for _, mr := range []*gowarp.MR{x.recvMR, x.sendMR} {
			if mr != nil {
				mr.Deregister()
			}
		}
		return errors.Join(err, req.Reject(nil))
	}
	if x.recvMR, err = x.pd.Register(make([]byte, nrecv*msg), gowarp.LocalWrite); err != nil {
		return refuse(err)
	}
	if x.sendMR, err = x.pd.Register(make([]byte, n*msg), gowarp.LocalWrite); err != nil {
		return refuse(err)
	}
	x.recvs = make([]gowarp.RecvWR, nrecv)
	for i := range x.recvs {
		x.recvs[i] = gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: x.recvMR, Offset: i * msg, Length: msg}}}
	}
	if _, err := x.qp.PostRecvList(x.recvs); err != nil {
		return refuse(err)
	}
	x.calls = make([]ServerCall, n)
	sendBuf := x.sendMR.Bytes()
	for i := range x.calls {
		c := &x.calls[i]
		c.sess, c.slot = x, i
		c.buf = sendBuf[i*msg : (i+1)*msg : (i+1)*msg]
		c.wr = gowarp.SendWR{Op: gowarp.OpSend, SGL: c.sge[:]}
		c.ctx.call = c
		for j := range c.refs {
			c.refs[j].done = make(chan gowarp.Status, 1)
			c.refs[j].idx = j
			c.refs[j].call = c
		}
	}
	reply := hello{Slots: uint16(n), MaxMessage: uint32(msg), Session: x.id}.append(nil)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The session joins the server's only once accepted: Close must not
	// close a queue pair that Accept is still setting up.
	if err := req.Accept(actx, x.qp, gowarp.ConnectOptions{PrivateData: reply, IRD: 16, ORD: 128}); err != nil {
		x.close(err)
		<-x.gone
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		x.close(ErrSessionClosed)
		<-x.gone
		return ErrSessionClosed
	}
	s.sessions[x] = struct{}{}
	s.mu.Unlock()
	x.watchdog = time.AfterFunc(time.Hour, x.handOff)
	x.watchdog.Stop()
	x.lead <- struct{}{}
	x.wg.Add(2)
	go x.poll(false)
	go x.flusher()
	return nil
}

// flusher posts the replies the poller queued for it. The engine receives
// one message per poll of the completion queue, so a poller that posted
// the reply of each call itself made one write per call however many
// calls came at once; handing the post to this goroutine lets the poller
// go on receiving meanwhile, and the replies of calls that arrive during
// a write share the next one. Only calls sent with others in flight
// (callMore) come here: a lone call's reply leaves at once, without the
// hand-off.
func (x *session) flusher() {
	defer x.wg.Done()
	for {
		select {
		case <-x.kick:
		case <-x.ctx.Done():
			return
		}
		if err := x.sends.post(x.qp, false); err != nil {
			x.close(err)
			return
		}
	}
}

// postLater queues replies for the flusher.
func (x *session) postLater(wrs ...gowarp.SendWR) error {
	if err := x.sends.enqueue(wrs...); err != nil {
		return err
	}
	select {
	case x.kick <- struct{}{}:
	default:
	}
	return nil
}

// close ends the session: its queue pair goes, its handlers' contexts
// end; the memory is deregistered once they have returned.
func (x *session) close(why error) {
	x.once.Do(func() {
		x.qp.Close() // first: a reference waiting on the session's context may reuse its memory
		x.cancel(why)
		for i := range x.calls {
			x.calls[i].ctx.cancel(fmt.Errorf("%w: %w", ErrSessionClosed, why))
		}
		go func() {
			x.wg.Wait()
			x.srv.mu.Lock()
			delete(x.srv.sessions, x)
			x.srv.mu.Unlock()
			x.recvMR.Deregister()
			x.sendMR.Deregister()
			x.chunkMu.Lock()
			for _, mr := range x.all {
				mr.Deregister()
			}
			x.chunkMu.Unlock()
			close(x.gone)
		}()
	})
}

// poll is the session's poller: whoever holds x.lead waits on the CQ
// and dispatches. The last blocking call of a batch runs here, without
// waiting for a goroutine to start: a call by value under the watchdog
// (handOff), a call with references after the role went to a spare
// goroutine (started if none waits); this goroutine polls on afterwards
// only if the role is still its own.
func (x *session) poll(spare bool) {
	defer x.wg.Done()
	if spare {
		select {
		case x.lead <- struct{}{}:
			x.spares.Add(-1)
		case <-x.ctx.Done():
			x.spares.Add(-1)
			return
		}
	}
	var wc [64]gowarp.Completion
	for {
		if err := x.cq.Wait(x.ctx); err != nil {
			x.close(err)
			return
		}
		n := x.cq.Poll(wc[:])
		for k := range wc[:n] {
			w := &wc[k]
			if w.Op == gowarp.CompRead || w.Op == gowarp.CompWrite {
				x.opDone(w)
				continue
			}
			if err := w.Err(); err != nil {
				x.close(errors.Join(err, x.qp.Err()))
				return
			}
			if w.Op != gowarp.CompRecv {
				continue
			}
			if err := x.onMessage(int(w.ID), w.Bytes); err != nil {
				x.srv.log.Info("rpc: session ends", "session", x.id, "err", err)
				x.close(err)
				return
			}
		}
		if len(x.batch) > 0 {
			var err error
			if x.batchMore {
				err = x.postLater(x.batch...)
				clear(x.batch)
				x.batch, x.batchMore = x.batch[:0], false
			} else {
				err = x.flush()
			}
			if err != nil {
				x.close(err)
				return
			}
		}
		if c := x.next; c != nil && c.nrefs == 0 {
			// A call by value most often returns at once: run it here, and
			// let the watchdog hand the role on only if it has not
			// returned after handoffAfter.
			x.next = nil
			g := x.inline.Load()>>2 + 1
			x.watch(g)
			c.onPoller = true
			if !c.run(false, g) {
				return // the watchdog started another poller
			}
		} else if c != nil {
			// A call with references needs a poller for its Reads' completions.
			x.next = nil
			if x.spares.Load() == 0 {
				x.spares.Add(1)
				x.wg.Add(1)
				go x.poll(true)
			}
			<-x.lead
			c.run(false, 0)
			select {
			case x.lead <- struct{}{}:
			default:
				return // a spare polls now
			}
		}
	}
}

// opDone hands a Read's or Write's completion to the reference waiting.
func (x *session) opDone(w *gowarp.Completion) {
	slot, j := int(w.ID>>8), int(w.ID&0xff)
	if slot >= len(x.calls) || j >= MaxRefs {
		return
	}
	select {
	case x.calls[slot].refs[j].done <- w.Status:
	default: // nobody can be waiting: a second completion is the peer's fault
	}
}

// onMessage handles the message in receive buffer k.
func (x *session) onMessage(k, n int) error {
	if k >= len(x.recvs) {
		return fmt.Errorf("%w: completion for receive %d", ErrMalformed, k)
	}
	off := k * x.maxMsg
	b := x.recvMR.Bytes()[off : off+n]
	x.srv.stats.msgBytes.Add(uint64(n))
	if n > 0 && b[0] == kindCancel {
		id, err := parseCancel(b)
		if err != nil {
			return err
		}
		if i := int(id & 0xffff); i < len(x.calls) {
			c := &x.calls[i]
			if c.busy.Load() && c.id == id {
				c.ctx.cancel(ErrCanceled)
			}
		}
		if err := x.qp.PostRecv(&x.recvs[k]); err != nil {
			return err
		}
		x.credits.Add(1) // only once the buffer is back
		return nil
	}
	m, err := parseCall(b)
	if len(b) < callHeaderLen {
		return err
	}
	id := m.ID
	if err == nil && b[0] != kindCall {
		err = fmt.Errorf("%w: kind %d", ErrMalformed, b[0])
	}
	i := int(id & 0xffff)
	if i >= len(x.calls) || x.calls[i].busy.Load() {
		// A call in a slot whose handler still runs: the client cannot
		// have had the slot's reply, it broke the protocol.
		return fmt.Errorf("%w: call %#x in slot %d, busy or beyond %d", ErrMalformed, id, i, len(x.calls))
	}
	c := &x.calls[i]
	if c.replying.Load() {
		// The slot's last reply is still to be posted from the slot's
		// buffer; a client can have seen it only if that is happening
		// now. Wait for it rather than overwrite it.
		if err := x.awaitReply(c); err != nil {
			return err
		}
	}
	c.begin(id, k, m)
	if err != nil {
		c.finish(err, statusBadCall, true)
		return nil
	}
	x.srv.mu.RLock()
	meth := x.srv.methods[string(m.Method)]
	x.srv.mu.RUnlock()
	if meth == nil {
		c.finish(fmt.Errorf("no method %q", m.Method), statusUnknownMethod, true)
		return nil
	}
	c.method = meth
	for j := range m.NRefs {
		h := m.Ref(j)
		if h.Session != x.id || h.Call != id {
			c.finish(fmt.Errorf("%w: handle %d was granted to session %#x call %#x, not this one", ErrBadHandle, j, h.Session, h.Call), statusBadHandle, true)
			return nil
		}
		c.refs[j].grant(h)
	}
	c.nrefs = m.NRefs
	if m.Timeout > 0 {
		c.ctx.setDeadline(time.Now().Add(time.Duration(m.Timeout) * time.Microsecond))
	}
	x.srv.stats.calls.Add(1)
	if meth.onPoll && m.NRefs == 0 {
		c.run(true, 0)
		return nil
	}
	x.active.Add(1)
	if o := x.next; o != nil { // only the batch's last runs on the poller
		x.wg.Add(1)
		go func() {
			defer x.wg.Done()
			o.run(false, 0)
		}()
	}
	x.next = c
	return nil
}

// awaitReply waits until call c's reply has been posted: at once if it
// is in the poller's own batch, else by whoever posts it now (a client
// saw the reply, so that post is under way), or until the session ends.
func (x *session) awaitReply(c *ServerCall) error {
	if len(x.batch) > 0 {
		if err := x.flush(); err != nil {
			return err
		}
	}
	for spins := 0; c.replying.Load(); spins++ {
		if x.ctx.Err() != nil {
			return ErrSessionClosed
		}
		if spins < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond) // a poster blocked on a client that does not read
		}
	}
	return nil
}

// flush posts the replies of non-blocking handlers gathered by the poller.
func (x *session) flush() error {
	err := x.sends.post(x.qp, false, x.batch...)
	clear(x.batch)
	x.batch, x.batchMore = x.batch[:0], false
	return err
}

// posted frees the slots of replies the queue pair has taken.
func (x *session) posted(wrs []gowarp.SendWR) {
	for i := range wrs {
		if s := int(wrs[i].ID & 0xffff); s < len(x.calls) {
			x.calls[s].replying.Store(false)
		}
	}
}

// getChunk lends a registered staging buffer for fetches.
func (x *session) getChunk() (*gowarp.MR, error) {
	x.chunkMu.Lock()
	defer x.chunkMu.Unlock()
	if n := len(x.chunks); n > 0 {
		mr := x.chunks[n-1]
		x.chunks = x.chunks[:n-1]
		return mr, nil
	}
	mr, err := x.pd.Register(make([]byte, fetchChunk), gowarp.LocalWrite)
	if err != nil {
		return nil, err
	}
	x.all = append(x.all, mr)
	return mr, nil
}

func (x *session) putChunk(mr *gowarp.MR) {
	x.chunkMu.Lock()
	x.chunks = append(x.chunks, mr)
	x.chunkMu.Unlock()
}

// ServerCall is one call being served.
type ServerCall struct {
	sess *session
	slot int
	busy atomic.Bool // from the call's arrival until its handler returns
	// replying is set from the handler's return until the queue pair has
	// taken the reply: the slot's buffer and work request are the reply's
	// until then, and a next call in the slot waits (awaitReply). The
	// engine may read the buffer a little longer (a transmit left to
	// another goroutine), but only a client that sends into the slot
	// before its reply came can see that reply changed: its own.
	replying atomic.Bool
	// onPoller says the poller runs the call itself: its reply goes to
	// the flusher if the client has more calls in flight.
	onPoller bool
	id       uint64
	recv     int // the receive buffer holding the call
	msg      callMsg
	method   *method
	refs     [MaxRefs]Ref
	nrefs    int
	gen      atomic.Uint64 // bumped when the call ends: its references die
	ctx      callCtx

	buf     []byte // the slot's reply message
	replied int    // reply length, -1 for none yet
	wr      gowarp.SendWR
	sge     [1]gowarp.SGE
}

func (c *ServerCall) begin(id uint64, recv int, m callMsg) {
	c.busy.Store(true)
	c.id, c.recv, c.msg, c.method, c.nrefs, c.replied = id, recv, m, nil, 0, -1
	c.ctx.reset()
}

// Method returns the method's name.
func (c *ServerCall) Method() string { return c.method.name }

// Arg returns the argument passed by value; it is valid until the
// handler returns.
func (c *ServerCall) Arg() []byte { return c.msg.Arg }

// NumRefs returns the number of references the call carries.
func (c *ServerCall) NumRefs() int { return c.nrefs }

// Ref returns the call's i-th reference.
func (c *ServerCall) Ref(i int) (*Ref, error) {
	if i < 0 || i >= c.nrefs {
		return nil, fmt.Errorf("%w: reference %d of %d", ErrBadHandle, i, c.nrefs)
	}
	return &c.refs[i], nil
}

// Open returns the reference a raw handle names, for handles that
// travelled inside an argument. Only a handle granted to this session
// for a call still being served is accepted; anything else — forged,
// from another session, or from a call that has ended — is refused
// before any RDMA Read.
func (c *ServerCall) Open(h Handle) (*Ref, error) {
	x := c.sess
	if h.Session != x.id {
		return nil, fmt.Errorf("%w: handle of session %#x, this is %#x", ErrBadHandle, h.Session, x.id)
	}
	i := int(h.Call & 0xffff)
	if i >= len(x.calls) {
		return nil, fmt.Errorf("%w: handle of call %#x", ErrBadHandle, h.Call)
	}
	o := &x.calls[i]
	if !o.busy.Load() || o.id != h.Call {
		return nil, fmt.Errorf("%w: call %#x has ended", ErrHandleExpired, h.Call)
	}
	for j := range o.nrefs {
		if o.refs[j].h == h {
			return &o.refs[j], nil
		}
	}
	return nil, fmt.Errorf("%w: call %#x was granted no such handle", ErrBadHandle, h.Call)
}

// ReplyBuffer returns an empty slice whose capacity is the room for a
// reply by value; a handler may build its reply in it and pass it to
// Reply without a copy.
func (c *ServerCall) ReplyBuffer() []byte { return c.buf[replyHeaderLen:replyHeaderLen] }

// Reply sets the call's result, by value. A result larger than a message
// is ErrTooLarge: write it through a writable reference instead.
func (c *ServerCall) Reply(p []byte) error {
	if len(p) > len(c.buf)-replyHeaderLen {
		return fmt.Errorf("%w: reply of %d bytes, messages hold %d", ErrTooLarge, len(p), len(c.buf)-replyHeaderLen)
	}
	c.replied = copy(c.buf[replyHeaderLen:], p)
	return nil
}

// run runs the handler and sends its reply. watched is the generation
// of the watchdog's watch when the poller runs the call itself (0 if not):
// run ends the watch as soon as the handler returns, before the reply's
// system call, and reports whether the poller's role is still this
// goroutine's.
func (c *ServerCall) run(onPoll bool, watched uint64) (lead bool) {
	x := c.sess
	defer func() {
		if p := recover(); p != nil {
			if watched != 0 {
				lead = x.unwatch(watched)
			}
			x.srv.log.Error("rpc: handler panicked", "method", c.method.name, "panic", p, "stack", string(debug.Stack()))
			c.finish(fmt.Errorf("%s panicked: %v", c.method.name, p), statusInternal, onPoll)
		}
	}()
	err := c.method.h(&c.ctx, c)
	lead, watched = x.unwatch(watched), 0
	var st uint8
	if err != nil {
		st = errStatus(err)
		if cerr := c.ctx.Err(); st == statusError && cerr != nil && errors.Is(err, cerr) {
			st = statusCanceled
			if cerr == context.DeadlineExceeded {
				st = statusDeadline
			}
		}
	}
	c.finish(err, st, onPoll)
	return lead
}

// unwatch ends watch g; false if the watchdog handed the role on first.
func (x *session) unwatch(g uint64) bool {
	if g == 0 {
		return true
	}
	if x.inline.CompareAndSwap(g<<2|inlineRunning, g<<2) {
		return true
	}
	return false
}

// finish ends the call: references die, the receive buffer goes back,
// the slot is free, and the reply (or the error) leaves.
func (c *ServerCall) finish(err error, status uint8, onPoll bool) {
	x := c.sess
	c.gen.Add(1)
	for j := range c.nrefs {
		c.refs[j].end()
	}
	n := max(c.replied, 0)
	if err != nil {
		n = copy(c.buf[replyHeaderLen:], err.Error())
	} else if c.replied < 0 {
		n = 0
	}
	appendReplyHeader(c.buf[:0], c.id, status, uint16(x.credits.Swap(0)), n)
	x.srv.stats.msgBytes.Add(uint64(replyHeaderLen + n))
	c.sge[0] = gowarp.SGE{MR: x.sendMR, Offset: c.slot * x.maxMsg, Length: replyHeaderLen + n}
	c.wr.ID = c.id
	c.ctx.cancel(context.Canceled)
	recv := c.recv
	c.replying.Store(true) // before busy is cleared: onMessage looks at busy first
	c.busy.Store(false)
	if err := x.qp.PostRecv(&x.recvs[recv]); err != nil {
		x.close(err)
		return
	}
	if onPoll {
		x.batch = append(x.batch, c.wr)
		x.batchMore = x.batchMore || c.msg.More
		return
	}
	others := x.active.Add(-1) > 0
	later := c.onPoller && c.msg.More
	c.onPoller = false
	var perr error
	if later {
		perr = x.postLater(c.wr)
	} else {
		perr = x.sends.post(x.qp, others, c.wr)
	}
	if perr != nil {
		x.close(perr)
	}
}
