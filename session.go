package gowarp

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gowarp/gowarp/internal/engine"
	"github.com/gowarp/gowarp/internal/failover"
)

// Sessions (C14): see the Session type and docs/failover.md.

// Session errors.
var (
	// ErrSessionClosed: the session was closed, by this side's
	// Session.Close or by the peer's (the error then says so).
	ErrSessionClosed = errors.New("gowarp: session closed")
	// ErrSessionTimeout: work could not be delivered within the session's
	// Deadline (no connection to the peer could carry it, or the peer
	// took none of it), or the session had no connection for that long.
	// Every outstanding work request then completes with it.
	ErrSessionTimeout = errors.New("gowarp: session deadline passed with work undelivered")
	// ErrSessionLost: the peer no longer knows the session (it closed it,
	// or restarted): a connection rejoining it was refused.
	ErrSessionLost = errors.New("gowarp: the peer does not know the session")
	// ErrNotSession: a connection request that does not carry a session
	// handshake reached a session listener, or a Connect's reply carried
	// none.
	ErrNotSession = errors.New("gowarp: not a session handshake")
	// ErrSessionMoved: the session was handed to another node with its
	// STag table (SessionListener.Export): this side's PostSend refuses
	// new work from the start of the export, and its outstanding
	// receives complete with it once the session has gone.
	ErrSessionMoved = errors.New("gowarp: the session moved to another node")
)

// SessionConfig tunes a session; the zero value is usable.
type SessionConfig struct {
	// SendDepth and RecvDepth bound the work requests outstanding on the
	// session (default 128 each).
	SendDepth, RecvDepth int
	// Window is how many of the peer's messages (Sends, Writes) this side
	// buffers before it has delivered them: the peer sends no more ahead
	// of this side's acknowledgements (default 16).
	Window int
	// MaxMessage is the largest Send payload this side receives (default
	// 64 KiB); the peer's PostSend refuses longer ones with ErrTooLong.
	MaxMessage int
	// Deadline bounds how long a work request may stay undelivered, and
	// how long the session may have no connection, before the session
	// fails with ErrSessionTimeout (default 10 s).
	Deadline time.Duration
	// HeartbeatTimeout (default 1 s) is how long a connection may stay
	// quiet: one the peer has sent nothing on for that long ends, and its
	// work fails over to another. The dialing side probes a connection
	// quiet for a quarter of that, and the peer answers; the accepting
	// side probes one quiet for half of it, which it is only when the
	// dialing side's probes stop. Traffic is proof enough: a busy
	// connection is not probed, and an idle one by one side only.
	// HeartbeatInterval (default 100 ms) is the least time between two
	// looks at the connections, and their timing's grain. An idle
	// session looks only when a probe or a timeout is due, at the
	// interval's next multiple, the instants every session of the
	// process keeps: its wake-ups come in batches.
	HeartbeatInterval, HeartbeatTimeout time.Duration
	// Connect is used for every connection of the session. Its
	// PrivateData and Extensions are the session's own (Writes travel as
	// Writes with immediate data); a zero LinkTimeout becomes twice the
	// heartbeat timeout.
	Connect ConnectOptions
	// Logger receives the session's fail-overs (default the device's).
	Logger *slog.Logger
	// Resolve, if set, is asked where the peer is now when a dial fails
	// while the session has no connection up, or when the peer rejects a
	// rejoin saying the session moved without saying where: it returns
	// the addresses to dial, one per path (the node the session moved to
	// with its table, see SessionListener.Export), or an error to keep
	// trying the old ones. An initiator's setting; it runs on the
	// session's redial goroutines, each call bounded by ctx.
	Resolve func(ctx context.Context, session uint64) ([]string, error)
}

func (c *SessionConfig) defaults(d *Device) {
	def := func(v *int, x int) {
		if *v <= 0 {
			*v = x
		}
	}
	def(&c.SendDepth, 128)
	def(&c.RecvDepth, 128)
	def(&c.Window, 16)
	c.Window = min(c.Window, 1024)
	def(&c.MaxMessage, 64<<10)
	defd := func(v *time.Duration, x time.Duration) {
		if *v <= 0 {
			*v = x
		}
	}
	defd(&c.Deadline, 10*time.Second)
	defd(&c.HeartbeatInterval, 100*time.Millisecond)
	defd(&c.HeartbeatTimeout, time.Second)
	if c.Connect.LinkTimeout == 0 {
		c.Connect.LinkTimeout = 2 * c.HeartbeatTimeout
	}
	c.Connect.Extensions = true
	if c.Logger == nil {
		c.Logger = d.log
	}
}

// SessionCompletion is one completed work request of a session.
type SessionCompletion struct {
	ID    uint64
	Op    CompletionOp // CompSend, CompWrite, CompRead or CompRecv
	Bytes int          // bytes sent, written, read or received
	// Err is nil on success; else it matches ErrSessionTimeout,
	// ErrSessionClosed or ErrSessionLost (the session failed) or, for a
	// receive too small for its message, LocalLengthError.
	Err error
}

// SessionStats count what a session has been through.
type SessionStats struct {
	Conns      int    // connections up now
	TxPath     int    // the path this side sends on; -1 if none
	Failovers  uint64 // times this side moved its sending to another connection
	Resent     uint64 // work requests sent again after a fail-over
	Duplicates uint64 // messages from the peer dropped as already received
	Joins      uint64 // connections that joined after the first
	Redirects  uint64 // times the peer sent this side to another node
	Resolved   uint64 // times SessionConfig.Resolve gave new addresses
	// LastFailover is when the last fail-over began: the connection was
	// found dead.
	LastFailover time.Time
}

// Internal work request IDs: kind in the top byte, the rest an index.
const (
	idKindShift = 56
	idData      = 1 // a Send or Write of the ring (unsignaled)
	idRead      = 2 // a Read of the ring; low bits its ring position
	idCtl       = 3 // a control message; low bits its control slot
	idRecv      = 4 // an internal receive; low bits its slot
	idMask      = 1<<idKindShift - 1
)

// Control slots of a connection: acks in turn, then one ping, one pong,
// and the Close sent as the session closes.
const (
	ackSlots  = 4
	pingSlot  = ackSlots
	pongSlot  = ackSlots + 1
	closeSlot = ackSlots + 2
	ctlSlots  = ackSlots + 3
)

// errPeerClosed ends a session whose peer closed it.
var errPeerClosed = fmt.Errorf("%w by the peer", ErrSessionClosed)

// Session is a reliable, ordered channel to one peer over several
// connections (paths, one per link or adapter) that survives the loss of
// any of them: DialSession opens one, a SessionListener accepts it. One
// connection at a time carries this side's traffic; when it fails (its
// heartbeat goes unanswered for SessionConfig.HeartbeatTimeout, or its
// queue pair fails), what was not acknowledged is sent again, in order,
// on another, and a dead path is dialed again in the background. What is
// guaranteed for which operation (docs/failover.md has the protocol):
//
//   - Sends are delivered exactly once and in order. Each carries a
//     16-byte fail-over header (session, sequence) in front of its bytes;
//     the receiving session takes it into a buffer of its own, drops a
//     sequence number it has seen (a resent duplicate), hands the bytes to
//     the application's next receive and acknowledges, cumulatively, what
//     it has delivered. The sender keeps every message until it is
//     acknowledged and, when a connection fails, resends them in order on
//     another.
//   - Writes are sent as Writes with immediate data whose immediate value
//     is their sequence number: they are acknowledged, ordered and resent
//     as Sends are, but a resent Write places its bytes again: that is
//     harmless only when nothing else wrote those bytes in between.
//   - Reads are resent when their connection failed before their response
//     came: they read the bytes again, the same bytes only when nothing
//     else wrote them in between.
//
// Each completion, on either side, reaches the application once, in the
// order of posting, on the session (Poll, Wait), never on a QP's CQ.
// Work that cannot be delivered within SessionConfig.Deadline completes
// with ErrSessionTimeout. Its methods are safe for concurrent use.
type Session struct {
	pd  *PD
	cfg SessionConfig
	// probeAfter is how long a connection stays quiet before it is
	// probed (see SessionConfig.HeartbeatTimeout).
	probeAfter time.Duration
	id         uint64
	tag        uint32
	initiator  bool
	paths      []string // the initiator's dial addresses, by path (under mu)
	log        *slog.Logger

	peerWindow uint64
	peerMax    int

	cq     *CQ // every connection's completions
	joins  chan *sconn
	ctx    context.Context // ends when the session closes
	cancel context.CancelFunc
	done   chan struct{} // closed when the session fails or closes
	wg     sync.WaitGroup

	mu     sync.Mutex
	err    error
	conns  []*sconn       // by path; nil or dead when down
	byQP   map[*QP]*sconn // every connection not yet released
	gen    uint64         // progress calls (see dead)
	dying  bool           // a dead connection may wait in byQP for its release
	tx     *sconn         // the connection this side sends on
	downAt time.Time      // since when no connection was up
	rearm  bool           // a pong came: the next heartbeat moves (see nextBeat)
	beats  uint64         // heartbeats run
	stats  SessionStats   // Failovers, Resent, Duplicates, Joins (Conns, TxPath: Stats derives them)
	wc     [64]Completion // the internal CQ's, polled under mu
	swr    SendWR         // scratch wire requests, under mu
	rwr    RecvWR         // ...
	sge    [1]SGE         // ...

	// Send ring: [head, posted) on the wire, [posted, tail) waiting.
	ring               []sendEntry
	head, posted, tail uint64
	nextSeq            uint64 // wire sequence of the next Send or Write
	peerAck            uint64 // every sequence up to it delivered
	hdrMR              *MR    // a header slot per ring entry

	// Receive side.
	rcvd, dlvd uint64     // accepted from the peer, delivered to the app
	pend       []rxMsg    // accepted, not delivered: (dlvd, rcvd]
	recvs      []recvSlot // the application's receives
	rHead      uint64
	rTail      uint64
	ackTo      *sconn       // where the peer's messages last came from
	forget     func()       // a listener's: drops the session from its table
	moving     bool         // an export is under way: PostSend refuses
	redialing  map[int]bool // the initiator's paths being dialed again

	// Completions for the application.
	comp         []SessionCompletion
	cHead, cTail uint64
	notify       chan struct{}
}

type sendEntry struct {
	wr    SendWR // SGL nil: the SGEs are in sges[1:1+n]
	sges  [MaxSGE]SGE
	n     int
	seq   uint64
	bytes int
	at    int64 // when posted (monotonic ns since the session began)
	abs   uint64
	done  bool // a Read whose response came
	sent  bool // on the wire once: posting it again is a resend
}

type recvSlot struct {
	id   uint64
	sges [MaxSGE]SGE
	n    int
}

type rxMsg struct {
	c     *sconn
	slot  int
	seq   uint64
	bytes int
	write bool
}

// sconn is one connection of a session.
type sconn struct {
	path int
	qp   *QP
	// mr is slots receive buffers of slotSize, then ctlSlots headers,
	// outside the Go heap: once release has deregistered it, its memory
	// is gone, and nothing may touch it (handle finds no connection for
	// a released one's completions; a connection holding undelivered
	// messages is not released).
	mr       *MR
	log      *slog.Logger
	slots    int
	slotSize int
	dead     bool
	held     int    // receive buffers held by undelivered messages
	deadGen  uint64 // the session's progress count when it was found dead
	lastAck  uint64 // the last ack sent on it
	ctlBusy  [ctlSlots]bool
	ackNext  int
	pingOut  bool
	// rx counts the messages taken in on it, rxSeen what the last
	// heartbeat saw, heardAt when that changed (or it joined): the peer
	// was heard from then.
	rx, rxSeen uint64
	heardAt    int64
	pingSeq    uint64 // the last probe's number: probes tried on it
	pongDue    bool
	pongSeq    uint64
	released   bool
	freed      bool // mr is deregistered, its memory gone
}

var sessionEpoch = time.Now()

func now() int64 { return int64(time.Since(sessionEpoch)) }

func newSession(pd *PD, cfg SessionConfig, id uint64, initiator bool) (*Session, error) {
	cfg.defaults(pd.dev)
	probe := cfg.HeartbeatTimeout / 4
	if !initiator {
		probe = cfg.HeartbeatTimeout / 2 // see SessionConfig.HeartbeatTimeout
	}
	s := &Session{pd: pd, cfg: cfg, probeAfter: max(cfg.HeartbeatInterval, probe), id: id, tag: uint32(id), initiator: initiator, log: cfg.Logger,
		cq: pd.dev.NewCQ(4 * (cfg.SendDepth + cfg.RecvDepth + 8*cfg.Window + 64)), joins: make(chan *sconn, 8),
		done: make(chan struct{}), byQP: map[*QP]*sconn{},
		ring: make([]sendEntry, cfg.SendDepth), pend: make([]rxMsg, cfg.Window+1),
		recvs: make([]recvSlot, cfg.RecvDepth), comp: make([]SessionCompletion, cfg.SendDepth+cfg.RecvDepth),
		notify: make(chan struct{}, 1), downAt: time.Now()}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	var err error
	s.hdrMR, err = pd.Register(make([]byte, failover.HeaderLen*cfg.SendDepth), LocalWrite)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// hello is the handshake this side sends on a connection of path.
func (s *Session) hello(path int, flags uint8) []byte {
	return failover.Hello{Flags: flags, Window: uint16(s.cfg.Window), Session: s.id,
		MaxMessage: uint32(s.cfg.MaxMessage), Path: uint8(path)}.Append(nil)
}

// newConn makes a connection's queue pair and buffers, its receives posted.
func (s *Session) newConn(path int, peerWindow int) (*sconn, error) {
	// Receives: the peer's data (our window), its acks of ours (at most
	// its window of them in flight), a ping and a pong, and slack.
	slots := s.cfg.Window + peerWindow + 4
	size := failover.HeaderLen + s.cfg.MaxMessage
	qp, err := s.pd.NewQP(QPConfig{SendCQ: s.cq, RecvCQ: s.cq,
		SendDepth: s.cfg.SendDepth + 2*peerWindow + ctlSlots + 8, RecvDepth: slots})
	if err != nil {
		return nil, err
	}
	// Mapped outside the Go heap (mem.RegisterAnon): most of a slot is
	// never touched, as acks and pings take whole slots, and heap memory
	// would be zeroed, so touched, by its next owner once a session
	// closes. 300 sessions a side, closed and opened again twice, grew
	// RSS from 55 to 764 MB on the heap. A path that stays down, dialed
	// twice a second, maps and unmaps untouched pages.
	need := slots*size + ctlSlots*failover.HeaderLen
	mr, err := s.pd.registerAnon(need, LocalWrite)
	if err != nil {
		qp.Close()
		return nil, err
	}
	c := &sconn{path: path, qp: qp, mr: mr, log: s.log, slots: slots, slotSize: size}
	for i := range slots {
		if err := qp.PostRecv(&RecvWR{ID: idRecv<<idKindShift | uint64(i), SGL: []SGE{{MR: mr, Offset: i * size, Length: size}}}); err != nil {
			c.release()
			return nil, err
		}
	}
	// Known to the session before it connects: the peer may send on it
	// as soon as it is up, before the session's goroutine takes it in
	// (addConn), and those completions must find their connection.
	s.mu.Lock()
	s.byQP[qp] = c
	s.mu.Unlock()
	return c, nil
}

// drop releases a connection that never joined the session.
func (s *Session) drop(c *sconn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byQP, c.qp)
	c.dead = true
	// The session's goroutine may have released it first: a flush
	// completion of its failed connect marks it dead.
	c.release()
}

// release closes a connection's queue pair and frees its memory, or
// leaves that to the delivery of the last message waiting in it (held);
// its completions are all in the session's CQ once Close returns (under
// mu, or before the session knows c). It may be called again.
func (c *sconn) release() {
	if !c.released {
		c.released = true
		c.qp.Close()
	}
	if c.freed || c.held > 0 {
		return
	}
	c.freed = true
	if err := c.mr.Deregister(); err != nil {
		// Still held after its queue pair closed: left registered (and
		// mapped) rather than freed under an access.
		c.log.Warn("gowarp session: connection buffers not freed", "path", c.path, "err", err)
	}
}

// DialSession opens a session to a peer listening with ListenSession on
// every address of paths (ip:port, one per link: each is dialed through
// the adapter the device's topology places it on, see Device.Place). It
// returns once at least one path is connected; the others, and any that
// fail later, are dialed again in the background until the session
// closes.
func (pd *PD) DialSession(ctx context.Context, paths []string, cfg SessionConfig) (*Session, error) {
	if len(paths) == 0 || len(paths) > 255 {
		return nil, fmt.Errorf("%w: a session needs 1 to 255 paths", ErrBadConfig)
	}
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	s, err := newSession(pd, cfg, binary.LittleEndian.Uint64(idb[:])|1, true)
	if err != nil {
		return nil, err
	}
	s.paths = paths
	s.conns = make([]*sconn, len(paths))
	var first error
	up := 0
	for p := range paths {
		c, err := s.dial(ctx, p, 0)
		if err != nil {
			first = cmpErr(first, err)
			continue
		}
		s.mu.Lock()
		s.addConn(c)
		s.mu.Unlock()
		up++
	}
	if up == 0 {
		s.hdrMR.Deregister()
		return nil, fmt.Errorf("gowarp: session: no path connected: %w", first)
	}
	s.start()
	s.mu.Lock()
	for p := range paths {
		if s.conns[p] == nil {
			s.redial(p)
		}
	}
	s.mu.Unlock()
	return s, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// dial connects path p.
func (s *Session) dial(ctx context.Context, p int, flags uint8) (*sconn, error) {
	// We send at most our own window ahead of the peer's acks (the
	// smaller of the two windows), so we receive at most that many acks.
	c, err := s.newConn(p, s.cfg.Window)
	if err != nil {
		return nil, err
	}
	h, err := s.connect(ctx, c, p, flags)
	if err != nil {
		s.drop(c)
		return nil, err
	}
	s.mu.Lock()
	if s.peerWindow == 0 {
		s.peerWindow, s.peerMax = uint64(min(int(h.Window), s.cfg.Window)), int(h.MaxMessage)
	}
	s.mu.Unlock()
	return c, nil
}

// connect connects c on path p and returns the peer's hello, checked.
func (s *Session) connect(ctx context.Context, c *sconn, p int, flags uint8) (failover.Hello, error) {
	o := s.cfg.Connect
	o.PrivateData = s.hello(p, flags)
	s.mu.Lock()
	addr := ""
	if p < len(s.paths) {
		addr = s.paths[p]
	}
	s.mu.Unlock()
	if addr == "" {
		return failover.Hello{}, errPathGone
	}
	if err := c.qp.Connect(ctx, addr, o); err != nil {
		return failover.Hello{}, err
	}
	h, _, err := failover.ParseHello(c.qp.PeerPrivateData())
	if err != nil || h.Flags&failover.Reply == 0 || h.Session != s.id {
		return h, fmt.Errorf("%w: reply from %s: %v", ErrNotSession, addr, err)
	}
	if !c.qp.Params().Extensions {
		return h, fmt.Errorf("%w: %s did not agree to immediate data", ErrNotSession, addr)
	}
	return h, nil
}

// errPathGone: a path the session no longer has (the peer moved to a
// node with fewer addresses).
var errPathGone = errors.New("gowarp: session path gone")

// redial dials path p again in the background, with a growing pause
// between tries, until it joins or the session closes (under mu). A
// rejection that carries a redirect (the session moved to another node
// with its table) points the session's paths at the new node's
// addresses, and the dialing goes on there.
func (s *Session) redial(p int) {
	if s.redialing[p] {
		return
	}
	if s.redialing == nil {
		s.redialing = map[int]bool{}
	}
	s.redialing[p] = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		pause := 20 * time.Millisecond
		for {
			ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HeartbeatTimeout+s.cfg.Connect.LinkTimeout)
			c, err := s.dial(ctx, p, failover.Rejoin)
			cancel()
			if err == nil {
				select {
				case s.joins <- c: // addConn ends the redialing
				case <-s.ctx.Done():
					s.drop(c)
				}
				return
			}
			if errors.Is(err, errPathGone) {
				s.mu.Lock()
				delete(s.redialing, p)
				s.mu.Unlock()
				return
			}
			var rej *RejectedError
			switch {
			case errors.As(err, &rej) && string(rej.PrivateData) == closedReject:
				// The peer closed the session; its Close did not reach
				// this side before the connection's end.
				s.fail(errPeerClosed)
				return
			case errors.As(err, &rej):
				addrs, _, perr := failover.ParseRedirect(rej.PrivateData)
				switch {
				case perr != nil:
					s.fail(fmt.Errorf("%w: %w", ErrSessionLost, err))
					return
				case len(addrs) > 0:
					s.moveTo(addrs, false)
				case s.cfg.Resolve == nil:
					s.fail(fmt.Errorf("%w: the peer moved without saying where, and the session has no Resolve", ErrSessionLost))
					return
				default:
					s.resolve()
				}
				pause = 10 * time.Millisecond
			case s.cfg.Resolve != nil:
				if s.resolve() {
					pause = 10 * time.Millisecond
				}
			}
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, 500*time.Millisecond)
		}
	}()
}

// start runs the session's goroutine.
func (s *Session) start() {
	s.wg.Add(1)
	go s.run()
}

// addConn takes a connection into the session (under mu): it replaces a
// connection of the same path, which the peer has given up on.
func (s *Session) addConn(c *sconn) {
	delete(s.redialing, c.path)
	if c.dead { // it failed before it joined
		s.maybeRelease(c)
		if s.initiator && s.err == nil && c.path < len(s.paths) {
			s.redial(c.path)
		}
		return
	}
	for len(s.conns) <= c.path {
		s.conns = append(s.conns, nil)
	}
	if old := s.conns[c.path]; old != nil && !old.dead {
		s.dead(old, "replaced by a new connection of its path")
	}
	if s.conns[c.path] != nil {
		s.stats.Joins++
	}
	s.conns[c.path] = c
	s.byQP[c.qp] = c
	c.heardAt = now()
	if s.tx == nil {
		s.tx = c
		s.posted = s.head // resend what is not acknowledged
		s.pump()
	}
}

// runHook, if set, is called by every session's goroutine before it
// waits for its next event: tests use it to hold a session still.
var runHook atomic.Pointer[func(*Session)]

// run is the session's goroutine: it takes every connection's
// completions, delivers, acknowledges, probes and fails over.
func (s *Session) run() {
	defer s.wg.Done()
	beat := time.NewTimer(s.cfg.HeartbeatInterval)
	defer beat.Stop()
	for {
		if h := runHook.Load(); h != nil {
			(*h)(s)
		}
		select {
		case <-s.cq.Notify():
			s.mu.Lock()
			s.progress()
			if s.rearm {
				s.rearm = false
				beat.Reset(s.nextBeat())
			}
			s.mu.Unlock()
		case c := <-s.joins:
			s.mu.Lock()
			if s.err != nil {
				s.mu.Unlock()
				delete(s.byQP, c.qp)
				c.release()
				continue
			}
			s.addConn(c)
			s.progress()
			s.mu.Unlock()
		case <-beat.C:
			s.mu.Lock()
			// What came first, first: a probe sent on a connection that
			// has ended closes it, and with it a peer's Close not yet taken.
			s.progress()
			s.heartbeat()
			s.progress()
			s.beats++
			beat.Reset(s.nextBeat())
			s.mu.Unlock()
		case <-s.ctx.Done():
			return
		}
	}
}

// progress handles every completion waiting, then delivers, acknowledges
// and completes what it can (under mu).
func (s *Session) progress() {
	s.gen++
	for s.err == nil {
		n := s.cq.Poll(s.wc[:])
		for i := range s.wc[:n] {
			s.handle(&s.wc[i])
		}
		if n < len(s.wc) {
			break
		}
	}
	if s.err != nil {
		return
	}
	// A connection that took messages in was heard from now: one clock
	// read per burst, not per message, and not as late as the next
	// heartbeat, which an idle session may not run for a while (see
	// nextBeat).
	var t int64
	for _, c := range s.conns {
		if c != nil && c.rx != c.rxSeen {
			if t == 0 {
				t = now()
			}
			c.rxSeen, c.heardAt = c.rx, t
		}
	}
	s.deliver()
	s.sendAcks()
	for _, c := range s.conns {
		if c != nil && !c.dead && c.pongDue && !c.ctlBusy[pongSlot] && s.ctl(c, pongSlot, failover.Pong, c.pongSeq) {
			c.pongDue = false
		}
	}
	s.complete()
	s.pump()
	if s.dying {
		s.dying = false
		for _, c := range s.byQP {
			if c.dead && c.deadGen < s.gen {
				// Dead before this call's polls: all it pushed is taken.
				s.maybeRelease(c)
			}
			if c.dead && !c.released {
				s.dying = true
			}
		}
	}
}

// handle acts on one completion of a connection.
func (s *Session) handle(wc *Completion) {
	c := s.byQP[wc.QP]
	if c == nil {
		return // of a connection released already
	}
	kind, idx := wc.ID>>idKindShift, wc.ID&idMask
	if wc.Status != Success {
		if !c.dead {
			s.dead(c, wc.Status.Error())
		}
		if kind == idCtl && idx < ctlSlots {
			c.ctlBusy[idx] = false
		}
		return
	}
	switch kind {
	case idCtl:
		if idx < ctlSlots {
			c.ctlBusy[idx] = false
		}
	case idRead:
		if idx < 1<<48 {
			e := &s.ring[idx%uint64(len(s.ring))]
			if e.abs == idx && idx >= s.head && idx < s.posted {
				e.done = true
			}
		}
	case idRecv:
		if idx < uint64(c.slots) {
			s.received(c, int(idx), wc)
		}
	}
}

// received handles a message the peer sent on c into receive slot.
func (s *Session) received(c *sconn, slot int, wc *Completion) {
	c.rx++
	if wc.WithImm { // a Write: its sequence number rides in Imm
		seq := s.rcvd + 1 + uint64(int64(int32(wc.Imm-uint32(s.rcvd+1))))
		s.accept(c, slot, seq, 0, true)
		return
	}
	b := c.mr.Bytes()[slot*c.slotSize : slot*c.slotSize+wc.Bytes]
	h, _, err := failover.ParseHeader(b)
	if err == nil && h.Session != s.tag {
		err = fmt.Errorf("%w: session %#x, want %#x", failover.ErrField, h.Session, s.tag)
	}
	if err != nil {
		s.log.Warn("gowarp session: bad message, dropping the connection", "path", c.path, "err", err)
		s.dead(c, err.Error())
		return
	}
	switch h.Kind {
	case failover.Data:
		s.accept(c, slot, h.Seq, wc.Bytes-failover.HeaderLen, false)
		return
	case failover.Ack:
		if h.Seq > s.peerAck && h.Seq <= s.nextSeq {
			s.peerAck = h.Seq
		}
	case failover.Ping:
		c.pongDue, c.pongSeq = true, h.Seq
		// The peer probes, so this side need not: its next look moves to
		// a probeAfter from now, rather than waking for nothing at the
		// one it set before (the accepting side of an idle session
		// woke about twice a second so).
		s.rearm = true
	case failover.Pong:
		if h.Seq == c.pingSeq {
			c.pingOut = false
			// The next probe is due a probeAfter from now, sooner than
			// the timeout the goroutine sleeps until.
			s.rearm = true
		}
	case failover.Close:
		// The peer closed the session: what came before the Close on
		// this connection is taken; hand what receives are posted for,
		// then end, rather than fail over to a peer that is gone.
		s.deliver()
		s.failLocked(errPeerClosed)
		return
	}
	s.repost(c, slot)
}

// accept takes message seq from c's slot: the next one is kept until it
// is delivered, one already received is dropped.
func (s *Session) accept(c *sconn, slot int, seq uint64, n int, write bool) {
	s.ackTo = c
	switch {
	case seq <= s.rcvd:
		s.stats.Duplicates++
		s.repost(c, slot)
	case seq == s.rcvd+1 && s.rcvd-s.dlvd < uint64(len(s.pend)):
		s.rcvd = seq
		s.pend[seq%uint64(len(s.pend))] = rxMsg{c: c, slot: slot, seq: seq, bytes: n, write: write}
		c.held++
	default:
		s.log.Warn("gowarp session: message out of order, dropping the connection", "path", c.path, "seq", seq, "want", s.rcvd+1)
		s.dead(c, "message out of order")
	}
}

// repost gives a receive buffer back to its connection.
func (s *Session) repost(c *sconn, slot int) {
	if c.dead {
		return
	}
	s.sge[0] = SGE{MR: c.mr, Offset: slot * c.slotSize, Length: c.slotSize}
	s.rwr = RecvWR{ID: idRecv<<idKindShift | uint64(slot), SGL: s.sge[:]}
	if err := c.qp.PostRecv(&s.rwr); err != nil {
		s.dead(c, err.Error())
	}
}

// deliver hands accepted messages to the application's receives, in order.
func (s *Session) deliver() {
	for s.dlvd < s.rcvd {
		m := &s.pend[(s.dlvd+1)%uint64(len(s.pend))]
		if !m.write {
			if s.rHead == s.rTail {
				return // no receive posted: the message waits, unacknowledged
			}
			r := &s.recvs[s.rHead%uint64(len(s.recvs))]
			s.rHead++
			src := m.c.mr.Bytes()[m.slot*m.c.slotSize+failover.HeaderLen:][:m.bytes]
			var err error
			for _, sge := range r.sges[:r.n] {
				k := min(len(src), sge.Length)
				if _, werr := sge.MR.WriteAt(src[:k], int64(sge.Offset)); werr != nil {
					err = LocalProtectionError
				}
				src = src[k:]
			}
			if len(src) > 0 {
				err = LocalLengthError
			}
			s.push(SessionCompletion{ID: r.id, Op: CompRecv, Bytes: m.bytes, Err: err})
		}
		s.dlvd = m.seq
		m.c.held--
		s.repost(m.c, m.slot)
		s.maybeRelease(m.c)
		m.c = nil
	}
}

// sendAcks acknowledges what was delivered, on the connection the peer's
// messages come on or, once that has ended, on another that is up: an
// acknowledgement sent on an ended connection may never have arrived, and
// a peer whose window is full sends nothing more (on any connection) to
// name a new one. The peer takes acknowledgements on any connection.
func (s *Session) sendAcks() {
	c := s.ackTo
	if c == nil || c.dead {
		c = s.tx
		for _, o := range s.conns {
			if c != nil && !c.dead {
				break
			}
			c = o
		}
		if c == nil || c.dead {
			return
		}
		s.ackTo = c
	}
	if s.dlvd <= c.lastAck {
		return
	}
	slot := c.ackNext
	if c.ctlBusy[slot] {
		return // all ack slots in flight: the next completion retries
	}
	if s.ctl(c, slot, failover.Ack, s.dlvd) {
		c.lastAck = s.dlvd
		c.ackNext = (slot + 1) % ackSlots
	}
}

// ctl sends a control message from c's control slot.
func (s *Session) ctl(c *sconn, slot int, k failover.Kind, seq uint64) bool {
	off := c.slots*c.slotSize + slot*failover.HeaderLen
	failover.Header{Kind: k, Session: s.tag, Seq: seq}.Put(c.mr.Bytes()[off:])
	s.sge[0] = SGE{MR: c.mr, Offset: off, Length: failover.HeaderLen}
	s.swr = SendWR{ID: idCtl<<idKindShift | uint64(slot), Op: OpSend, Flags: Signaled, SGL: s.sge[:]}
	if err := c.qp.PostSend(&s.swr); err != nil {
		if !errors.Is(err, ErrQueueFull) {
			s.dead(c, err.Error())
		}
		return false
	}
	c.ctlBusy[slot] = true
	return true
}

// heartbeat probes every connection and ends those whose probe went
// unanswered; it fails the session past its deadline.
func (s *Session) heartbeat() {
	t := now()
	up := 0
	for _, c := range s.conns {
		if c == nil || c.dead {
			continue
		}
		quiet := time.Duration(t - c.heardAt) // progress, just before, noted what was heard
		switch {
		case quiet > s.cfg.HeartbeatTimeout:
			s.dead(c, "heartbeat unanswered")
			continue
		case !c.pingOut && !c.ctlBusy[pingSlot] && quiet >= s.probeAfter:
			c.pingSeq++
			if s.ctl(c, pingSlot, failover.Ping, c.pingSeq) {
				c.pingOut = true
			}
		}
		up++
	}
	switch {
	case s.head < s.tail && time.Duration(t-s.ring[s.head%uint64(len(s.ring))].at) > s.cfg.Deadline:
		s.failLocked(fmt.Errorf("%w: work request %d undelivered for %v", ErrSessionTimeout, s.ring[s.head%uint64(len(s.ring))].wr.ID, s.cfg.Deadline))
	case up == 0 && time.Since(s.downAt) > s.cfg.Deadline:
		s.failLocked(fmt.Errorf("%w: no connection for %v", ErrSessionTimeout, s.cfg.Deadline))
	}
}

// nextBeat returns how long the session's goroutine sleeps before its
// next heartbeat (under mu): until the first probe or timeout is due when
// the session is idle, at least HeartbeatInterval, at most probeAfter (a
// work request posted meanwhile has its deadline looked at within that);
// HeartbeatInterval when anything waits for a retry or a connection. An
// idle session then wakes about once per probe, not every interval,
// which was the floor of its cost whatever the timeout (docs/failover.md).
func (s *Session) nextBeat() time.Duration {
	iv := s.cfg.HeartbeatInterval
	if s.err != nil || s.head < s.tail || s.dying || s.dlvd < s.rcvd {
		return iv
	}
	t := now()
	due, up := t+int64(s.probeAfter), false
	for _, c := range s.conns {
		if c == nil || c.dead {
			continue
		}
		up = true
		if c.pongDue || c.ctlBusy[pingSlot] && !c.pingOut || s.ackTo == c && s.dlvd > c.lastAck {
			return iv // a control message to send again
		}
		if !c.pingOut {
			due = min(due, c.heardAt+int64(s.probeAfter))
		}
		due = min(due, c.heardAt+int64(s.cfg.HeartbeatTimeout)+1) // quiet > HeartbeatTimeout
	}
	if !up {
		return iv
	}
	d := max(iv, time.Duration(due-t))
	// Wake on the interval's grid, as the sessions of the process all
	// do: they then look at the same instants, and the runtime wakes
	// once for a batch of them, not once per session.
	if r := time.Duration((t + int64(d)) % int64(iv)); r != 0 {
		d += iv - r
	}
	return d
}

// dead ends connection c: its queue pair is closed (its completions all
// reach the CQ, where progress finds them), and if this side sent on it,
// what it sent and was not acknowledged goes again on another.
func (s *Session) dead(c *sconn, why string) {
	if c.dead {
		return
	}
	c.dead, c.deadGen, s.dying = true, s.gen, true
	c.qp.Close()
	if s.ackTo == c {
		s.ackTo = nil
	}
	if s.tx == c {
		s.tx = nil
		s.stats.Failovers++
		s.stats.LastFailover = time.Now()
		for _, o := range s.conns {
			if o != nil && !o.dead && o.qp.State() == StateReady {
				s.tx = o
				break
			}
		}
		s.log.Info("gowarp session: connection lost, failing over", "path", c.path, "why", why, "to", s.txPath())
		s.posted = s.head // send again what is not acknowledged, in order
	}
	if s.tx == nil && !s.anyUp() {
		s.downAt = time.Now()
	}
	if s.initiator && s.conns[c.path] == c && s.err == nil && c.path < len(s.paths) {
		s.redial(c.path)
	}
	// Released (its buffers deregistered, its completions ignored) by the
	// next progress, once the CQ is drained: a message it took in before
	// it ended, a peer's Close among them, may still be in the CQ.
}

// txPath is the path this side sends on, -1 if none (under mu).
func (s *Session) txPath() int {
	if s.tx == nil {
		return -1
	}
	return s.tx.path
}

func (s *Session) anyUp() bool {
	for _, c := range s.conns {
		if c != nil && !c.dead {
			return true
		}
	}
	return false
}

// maybeRelease frees a dead connection whose buffers hold nothing
// undelivered; its completions have all been taken by then or are
// flushes of nothing.
func (s *Session) maybeRelease(c *sconn) {
	if !c.dead || c.held > 0 || c.freed {
		return
	}
	c.release()
	// Its completions still in the CQ are failures of work it no longer
	// has: handle finds no connection for them.
	delete(s.byQP, c.qp)
}

// pump posts waiting work on the connection this side sends on, in
// order, as far as the peer's window allows.
func (s *Session) pump() {
	for s.tx != nil && s.posted < s.tail && s.err == nil {
		e := &s.ring[s.posted%uint64(len(s.ring))]
		if e.seq != 0 && e.seq > s.peerAck+s.peerWindow {
			return // the peer's window is full
		}
		if e.wr.Op == OpRead && e.done {
			s.posted++
			continue
		}
		s.swr = e.wr
		switch e.wr.Op {
		case OpSend:
			s.swr.SGL = e.sges[:1+e.n]
			s.swr.ID = idData<<idKindShift | e.abs&idMask
		case OpWrite:
			s.swr.Op, s.swr.Imm = OpWriteImm, uint32(e.seq)
			s.swr.SGL = e.sges[1 : 1+e.n]
			s.swr.ID = idData<<idKindShift | e.abs&idMask
		case OpRead:
			s.swr.SGL = e.sges[1 : 1+e.n]
			s.swr.ID = idRead<<idKindShift | e.abs&idMask
		}
		s.swr.Flags = e.wr.Flags &^ Signaled
		if e.wr.Op == OpRead {
			s.swr.Flags |= Signaled
		}
		if err := s.tx.qp.PostSend(&s.swr); err != nil {
			if !errors.Is(err, ErrQueueFull) {
				s.dead(s.tx, err.Error())
			}
			return
		}
		if e.sent {
			s.stats.Resent++
		}
		e.sent = true
		s.posted++
	}
}

// complete hands the application the completions of the ring's head, in
// order: a Send or Write once the peer acknowledged it, a Read once its
// response came.
func (s *Session) complete() {
	for s.head < s.posted {
		e := &s.ring[s.head%uint64(len(s.ring))]
		if e.wr.Op == OpRead && !e.done || e.wr.Op != OpRead && e.seq > s.peerAck {
			return
		}
		if e.wr.Flags&Signaled != 0 {
			s.push(SessionCompletion{ID: e.wr.ID, Op: compOp(e.wr.Op), Bytes: e.bytes})
		}
		s.retire(e)
		s.head++
	}
}

// retire ends a send entry's pins (see PostSend) and drops its references.
func (s *Session) retire(e *sendEntry) {
	engine.UnpinSGL(engSGEs(e.sges[1 : 1+e.n]))
	e.sges = [MaxSGE]SGE{}
}

func compOp(o WROp) CompletionOp {
	switch o {
	case OpWrite:
		return CompWrite
	case OpRead:
		return CompRead
	}
	return CompSend
}

// push queues a completion for the application (under mu); the ring has
// room for every outstanding work request.
func (s *Session) push(c SessionCompletion) {
	s.comp[s.cTail%uint64(len(s.comp))] = c
	s.cTail++
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// PostSend posts a Send (OpSend), Write (OpWrite) or Read (OpRead) on the
// session. A Send carries at most MaxSGE-1 SGEs (the fail-over header
// takes one) and the peer's MaxMessage bytes; other operations and flags
// beyond Signaled, Solicited and Fence are ErrBadOp. Its SGEs are checked
// as a queue pair's post checks them (ErrLocalAccess), and their regions
// stay pinned until it completes (Deregister fails with ErrRegionBusy).
// Its buffers must stay unchanged until then: the session may send them
// again until the peer has acknowledged them.
func (s *Session) PostSend(wr *SendWR) error {
	if wr == nil {
		return ErrNilWR
	}
	n, max := len(wr.SGL), MaxSGE
	switch wr.Op {
	case OpSend:
		max--
	case OpWrite, OpRead:
	default:
		return fmt.Errorf("%w: %v on a session", ErrBadOp, wr.Op)
	}
	if n > max {
		return ErrTooManySGE
	}
	// Checked now, as a queue pair's post checks it: the session posts
	// it later, and again on another connection after a fail-over. A bad
	// SGE found then failed the connection, and the next, and every one
	// after (2,700 fail-overs in 2 s) until the deadline.
	bytes, err := engine.CheckWR(engSendWR(wr))
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.moving {
		return fmt.Errorf("%w: an export is under way", ErrSessionMoved)
	}
	if wr.Op == OpSend && bytes > s.peerMax {
		return fmt.Errorf("%w: a Send of %d bytes, the peer takes %d", ErrTooLong, bytes, s.peerMax)
	}
	if s.tail-s.head == uint64(len(s.ring)) || s.full() {
		return ErrQueueFull
	}
	// Pinned until it completes: no region goes while it may be sent again.
	if err := engine.PinSGL(engSGEs(wr.SGL)); err != nil {
		return err
	}
	abs := s.tail
	slot := abs % uint64(len(s.ring))
	e := &s.ring[slot]
	*e = sendEntry{wr: *wr, n: n, bytes: bytes, at: now(), abs: abs}
	e.wr.SGL = nil
	copy(e.sges[1:], wr.SGL)
	if wr.Op != OpRead {
		s.nextSeq++
		e.seq = s.nextSeq
	}
	if wr.Op == OpSend {
		off := int(slot) * failover.HeaderLen
		failover.Header{Kind: failover.Data, Session: s.tag, Seq: e.seq}.Put(s.hdrMR.Bytes()[off:])
		e.sges[0] = SGE{MR: s.hdrMR, Offset: off, Length: failover.HeaderLen}
	}
	s.tail++
	s.pump()
	return nil
}

// full reports whether outstanding work and completions not yet polled
// fill the completion ring: one more post could overrun it.
func (s *Session) full() bool {
	return (s.tail-s.head)+(s.rTail-s.rHead)+(s.cTail-s.cHead) >= uint64(len(s.comp))
}

// PostRecv posts a receive: the next Send from the peer is copied into
// its SGEs. The session holds the peer's messages in buffers of its own
// until a receive is posted (up to its Window of them; the peer waits
// for more).
func (s *Session) PostRecv(wr *RecvWR) error {
	if wr == nil {
		return ErrNilWR
	}
	if len(wr.SGL) > MaxSGE {
		return ErrTooManySGE
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.rTail-s.rHead == uint64(len(s.recvs)) || s.full() {
		return ErrQueueFull
	}
	r := &s.recvs[s.rTail%uint64(len(s.recvs))]
	r.id, r.n = wr.ID, copy(r.sges[:], wr.SGL)
	s.rTail++
	if s.dlvd < s.rcvd {
		s.deliver()
		s.sendAcks()
	}
	return nil
}

// Poll moves up to len(out) completions into out and returns how many;
// it never blocks.
func (s *Session) Poll(out []SessionCompletion) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for n < len(out) && s.cHead < s.cTail {
		out[n] = s.comp[s.cHead%uint64(len(s.comp))]
		s.comp[s.cHead%uint64(len(s.comp))] = SessionCompletion{}
		s.cHead++
		n++
	}
	return n
}

// Wait blocks until a completion is waiting, ctx is done (its error) or
// the session has failed or closed with none left (its Err).
func (s *Session) Wait(ctx context.Context) error {
	for {
		s.mu.Lock()
		n, err := s.cTail-s.cHead, s.err
		s.mu.Unlock()
		if n > 0 {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
		}
	}
}

// Notify returns a channel that receives a token when completions
// arrive; drain with Poll after each.
func (s *Session) Notify() <-chan struct{} { return s.notify }

// Err returns why the session failed or closed, nil while it works.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// ID returns the session's id, the same on both sides.
func (s *Session) ID() uint64 { return s.id }

// Stats returns the session's counters.
func (s *Session) Stats() SessionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.TxPath = s.txPath()
	for _, c := range s.conns {
		if c != nil && !c.dead {
			st.Conns++
		}
	}
	return st
}

// Conns returns the queue pair of each path now up (nil for a path that
// is down), to look at (QP.Adapter, Params): the session owns them.
func (s *Session) Conns() []*QP {
	s.mu.Lock()
	defer s.mu.Unlock()
	qps := make([]*QP, len(s.conns))
	for i, c := range s.conns {
		if c != nil && !c.dead {
			qps[i] = c.qp
		}
	}
	return qps
}

// fail ends the session with err: every outstanding work request and
// receive completes with it, every connection closes.
func (s *Session) fail(err error) {
	s.mu.Lock()
	s.failLocked(err)
	s.mu.Unlock()
}

func (s *Session) failLocked(err error) {
	if s.err != nil {
		return
	}
	s.err = err
	switch {
	case err == errPeerClosed:
		s.log.Info("gowarp session closed by the peer", "id", s.id)
	case errors.Is(err, ErrSessionClosed):
		// The application's own Close: nothing went wrong.
		s.log.Debug("gowarp session closed", "id", s.id)
	case errors.Is(err, ErrSessionMoved):
		s.log.Info("gowarp session moved", "id", s.id, "err", err)
	default:
		s.log.Warn("gowarp session failed", "id", s.id, "err", err)
	}
	for ; s.head < s.tail; s.head++ {
		e := &s.ring[s.head%uint64(len(s.ring))]
		s.push(SessionCompletion{ID: e.wr.ID, Op: compOp(e.wr.Op), Err: err})
		s.retire(e)
	}
	s.posted = s.tail
	for ; s.rHead < s.rTail; s.rHead++ {
		s.push(SessionCompletion{ID: s.recvs[s.rHead%uint64(len(s.recvs))].id, Op: CompRecv, Err: err})
	}
	// What was taken in and not delivered never will be: its
	// connections' memory goes with them, dropped ones' included.
	for q := s.dlvd + 1; q <= s.rcvd; q++ {
		if m := &s.pend[q%uint64(len(s.pend))]; m.c != nil {
			m.c.held = 0
			m.c.dead = true
			m.c.release()
			m.c = nil
		}
	}
	for _, c := range s.byQP {
		c.dead = true
		c.release()
	}
	clear(s.byQP)
	s.tx, s.ackTo = nil, nil
	close(s.done)
	if s.forget != nil {
		go s.forget() // it takes the listener's lock, which is taken before ours
	}
}

// Close ends the session: outstanding work completes with
// ErrSessionClosed and every connection closes. The peer is told on each
// connection up, and its session ends too, with ErrSessionClosed (a
// listening side that closed a session also refuses the dialer's rejoin
// saying so, should the connection's end overtake the message); a
// listening peer that missed the message times out (ErrSessionTimeout).
// It waits for the session's goroutines.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.err == nil {
		for _, c := range s.byQP {
			if !c.dead { // closeSlot is free: this runs once
				s.ctl(c, closeSlot, failover.Close, 0)
			}
		}
		s.failLocked(ErrSessionClosed)
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	for {
		select {
		case c := <-s.joins:
			s.drop(c)
			continue
		default:
		}
		break
	}
	_ = s.hdrMR.Deregister()
	return nil
}

// SessionListener accepts sessions: see PD.ListenSession.
type SessionListener struct {
	pd       *PD
	cfg      SessionConfig
	lns      []*Listener
	mu       sync.Mutex
	sessions map[uint64]*Session
	// moved are the sessions exported (Export), each with the redirect
	// that a connection rejoining it is rejected with.
	moved map[uint64][]byte
	// closed are the sessions this side's application closed, and when:
	// a rejoin is told so (closedReject), not that the session is
	// unknown, in case the Close it was sent did not reach the peer.
	closed map[uint64]time.Time
	// closedOrder are closed's entries in the order noted, which is
	// their time's: the expired ones are its head.
	closedOrder []closedNote
	exporting   bool // Export is under way: no new session
	accepted    chan *Session
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup
}

// ListenSession accepts sessions on lns (an adapter's Listener for each
// link, typically): a connection whose handshake names a new session
// makes one, which Accept returns; one naming a session already accepted
// joins it (a path connected late, or again after a failure), replacing
// that path's connection. A request without a session handshake, or
// rejoining a session this side does not know, is rejected. The session
// listener owns lns: Close closes them.
func (pd *PD) ListenSession(cfg SessionConfig, lns ...*Listener) *SessionListener {
	l := pd.newSessionListener(cfg, 16)
	l.serve(lns)
	return l
}

func (pd *PD) newSessionListener(cfg SessionConfig, backlog int) *SessionListener {
	cfg.defaults(pd.dev)
	l := &SessionListener{pd: pd, cfg: cfg, sessions: map[uint64]*Session{}, moved: map[uint64][]byte{}, closed: map[uint64]time.Time{}, accepted: make(chan *Session, backlog)}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// serve accepts on lns until the listener closes.
func (l *SessionListener) serve(lns []*Listener) {
	l.lns = lns
	for _, ln := range lns {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				req, err := ln.Accept(l.ctx)
				if err != nil {
					return
				}
				l.join(req)
			}
		}()
	}
}

// join takes a connection request into its session.
// adopt makes s one of the listener's sessions, under its id, until it
// ends. l.mu is held.
func (l *SessionListener) adopt(s *Session) {
	s.forget = func() {
		l.mu.Lock()
		if l.sessions[s.id] == s {
			delete(l.sessions, s.id)
		}
		if closedHere(s.Err()) {
			l.noteClosed(s.id)
		}
		l.mu.Unlock()
	}
	l.sessions[s.id] = s
}

// closedReject is what a rejoin of a session this side closed is
// rejected with.
const closedReject = "session closed"

// closedHere reports whether err ended a session by its own side's Close.
func closedHere(err error) bool { return errors.Is(err, ErrSessionClosed) && err != errPeerClosed }

// noteClosed remembers session id as closed here, for as long as its
// peer may try to rejoin it (its deadline, at most: a minute), and forgets
// those closed longer ago. l.mu is held.
func (l *SessionListener) noteClosed(id uint64) { l.noteClosedAt(id, time.Now()) }

func (l *SessionListener) noteClosedAt(id uint64, now time.Time) {
	keep := time.Minute + 2*l.cfg.Deadline
	// Forget the expired from the oldest on: a close costs O(1), not a
	// walk of every session closed in the last minute (80,000 of them
	// at 1,000 closes a second).
	i := 0
	for ; i < len(l.closedOrder) && now.Sub(l.closedOrder[i].at) > keep; i++ {
		if e := l.closedOrder[i]; l.closed[e.id].Equal(e.at) {
			delete(l.closed, e.id) // unless noted again since
		}
	}
	l.closedOrder = append(l.closedOrder[i:], closedNote{id, now})
	l.closed[id] = now
}

// closedNote is an entry of SessionListener.closed.
type closedNote struct {
	id uint64
	at time.Time
}

func (l *SessionListener) join(req *ConnRequest) {
	h, _, err := failover.ParseHello(req.PrivateData())
	if err == nil && h.Flags&failover.Reply != 0 {
		err = failover.ErrField
	}
	if err != nil {
		l.cfg.Logger.Warn("gowarp session listener: not a session handshake", "from", req.RemoteAddr(), "err", err)
		_ = req.Reject(nil)
		return
	}
	l.mu.Lock()
	if rd, ok := l.moved[h.Session]; ok {
		l.mu.Unlock()
		_ = req.Reject(rd)
		return
	}
	s := l.sessions[h.Session]
	isNew := false
	if s != nil && s.Err() != nil {
		if closedHere(s.Err()) {
			l.noteClosed(s.id)
		}
		delete(l.sessions, h.Session)
		s = nil
	}
	if s == nil {
		if _, ok := l.closed[h.Session]; ok && h.Flags&failover.Rejoin != 0 {
			l.mu.Unlock()
			_ = req.Reject([]byte(closedReject))
			return
		}
		if h.Flags&failover.Rejoin != 0 {
			l.mu.Unlock()
			_ = req.Reject([]byte("unknown session"))
			return
		}
		if l.exporting {
			l.mu.Unlock()
			_ = req.Reject([]byte("sessions moving"))
			return
		}
		if s, err = newSession(l.pd, l.cfg, h.Session, false); err != nil {
			l.mu.Unlock()
			_ = req.Reject(nil)
			return
		}
		s.peerWindow, s.peerMax = uint64(h.Window), int(h.MaxMessage)
		l.adopt(s)
		isNew = true
	}
	l.mu.Unlock()
	c, err := s.newConn(int(h.Path), int(h.Window))
	if err == nil {
		o := s.cfg.Connect
		o.PrivateData = s.hello(int(h.Path), failover.Reply)
		ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
		err = req.Accept(ctx, c.qp, o)
		cancel()
		if err == nil && !c.qp.Params().Extensions {
			err = fmt.Errorf("%w: the peer did not offer immediate data", ErrNotSession)
		}
		if err != nil {
			s.drop(c)
		}
	} else {
		_ = req.Reject(nil)
	}
	if err != nil {
		if s.Err() != nil {
			// The session ended meanwhile (its peer closed it, say) and
			// closed the queue pair of the path it was adding: nothing
			// went wrong here.
			l.cfg.Logger.Info("gowarp session listener: accept abandoned, the session ended", "from", req.RemoteAddr(), "err", err)
		} else {
			l.cfg.Logger.Warn("gowarp session listener: accept failed", "from", req.RemoteAddr(), "err", err)
		}
		if isNew {
			l.mu.Lock()
			delete(l.sessions, h.Session)
			l.mu.Unlock()
			s.Close()
		}
		return
	}
	if isNew {
		s.mu.Lock()
		s.addConn(c)
		s.mu.Unlock()
		s.start()
		select {
		case l.accepted <- s:
		case <-l.ctx.Done():
			s.Close()
		}
		return
	}
	select {
	case s.joins <- c:
	case <-s.ctx.Done():
		s.drop(c)
	}
}

// Accept waits for the next new session, until ctx is done or the
// listener is closed (net.ErrClosed).
func (l *SessionListener) Accept(ctx context.Context) (*Session, error) {
	select {
	case s := <-l.accepted:
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Close stops accepting and closes the listeners; sessions accepted go
// on (without new connections from then on).
func (l *SessionListener) Close() error {
	l.cancel()
	for _, ln := range l.lns {
		ln.Close()
	}
	l.wg.Wait()
	return nil
}
