// Package engine is gowarp's queue-pair engine: QP state, the transmit and
// receive paths over a Link, the inbound and outbound Read queues (IRQ and
// ORQ), placement into registered memory and completion generation.
//
// A QP has one receive goroutine and, while it has work whose write would
// block or completions that wait for acknowledgements, a transmit
// goroutine. A post runs the transmit path in the caller's goroutine when
// nothing is queued ahead of it and the socket takes the bytes without
// blocking; otherwise the transmit goroutine carries on. Whoever holds the transmit role (txBusy)
// is the only writer to the socket.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// State is a queue pair's state.
type State int32

const (
	StateIdle       State = iota // created, not connected
	StateConnecting              // MPA negotiation under way
	StateReady                   // connected: work flows
	StateClosing                 // disconnect requested, draining
	StateError                   // failed or closed: work is flushed
)

func (s State) String() string {
	return [...]string{"idle", "connecting", "ready", "closing", "error"}[s]
}

// CompletionMode chooses when a signaled Send or Write completes.
type CompletionMode uint8

const (
	// Handed completes a Send or Write once the socket has taken all its
	// bytes. The buffer may then be reused only if the application can
	// tolerate a retransmission carrying the new bytes (with CRC on, the
	// peer would see a CRC error); in practice: do not change it until a
	// later exchange with the peer shows the data arrived. If the
	// connection fails, what the socket took still completes successfully;
	// only work it did not take is flushed.
	Handed CompletionMode = iota
	// Acked completes a Send or Write once the kernel's send queue shows
	// every byte of it acknowledged by the peer's TCP (SIOCOUTQ). From then
	// on the buffer may be changed freely: TCP will never send it again.
	// If the connection fails, what was acknowledged by then completes
	// successfully, the rest is flushed (though it may have arrived).
	Acked
)

func (m CompletionMode) String() string {
	if m == Acked {
		return "acked"
	}
	return "handed"
}

// Errors of the queue pair.
var (
	ErrNotReady       = errors.New("gowarp: queue pair is not connected")
	ErrQueueFull      = errors.New("gowarp: work queue is full")
	ErrTooManySGE     = fmt.Errorf("gowarp: more than %d scatter/gather entries", MaxSGE)
	ErrBadOp          = errors.New("gowarp: invalid work request opcode")
	ErrNilWR          = errors.New("gowarp: nil work request")
	ErrLocalAccess    = errors.New("gowarp: local memory access violation")
	ErrPeerTerminated = errors.New("gowarp: peer terminated the connection")
	ErrTerminated     = errors.New("gowarp: terminated the connection")
	ErrPeerClosed     = errors.New("gowarp: peer closed the connection")
	ErrClosed         = errors.New("gowarp: queue pair closed")
	ErrLinkLost       = errors.New("gowarp: connection lost")
	ErrLinkTimeout    = fmt.Errorf("%w: no answer from the peer within the link timeout", ErrLinkLost)
	ErrTooLong        = errors.New("gowarp: message longer than 4 GiB")
	ErrBadState       = errors.New("gowarp: queue pair is in the wrong state for this call")
	ErrBadConfig      = errors.New("gowarp: invalid queue pair configuration")
	ErrZeroORD        = errors.New("gowarp: RDMA Read on a connection whose ORD is 0")
	ErrBadAtomic      = errors.New("gowarp: an atomic operation takes one 8-byte SGE and an 8-byte aligned remote address")
	ErrNotSupported   = errors.New("gowarp: operation not supported by the peer (RFC 7306 extensions not negotiated)")
)

// Config fixes a queue pair's resources at creation.
type Config struct {
	SendDepth, RecvDepth int
	SendCQ, RecvCQ       *CQ
	PD                   uint32
	Table                *mem.Table
	Completion           CompletionMode
	// AsyncOnly makes every post hand its work to the transmit goroutine
	// instead of transmitting in the caller's goroutine (for comparison).
	AsyncOnly bool
	Logger    *slog.Logger
	// Events, if set, receives the queue pair's asynchronous events.
	Events Emitter
	// Owner is the caller's own record of the queue pair (the root
	// package keeps its adapter there); the engine only hands it back.
	Owner any
}

// Params are what MPA negotiation settled.
type Params struct {
	CRC bool
	// IRD is how many inbound Reads may be outstanding, ORD outbound;
	// 0 allows none.
	IRD, ORD int
	// SendRTR is the ready-to-receive message this side (the initiator in
	// peer-to-peer mode) sends first; zero for none.
	SendRTR wire.RTR
	// HoldTx makes the responder send nothing until the initiator's first
	// FPDU arrives (RFC 5044 §7.1.2), or until SpeakAfter has passed if
	// that is positive (ConnectOptions.SendFirst).
	HoldTx     bool
	SpeakAfter time.Duration
	// MaxFPDU is the size on the wire of a full FPDU; 0 sizes FPDUs to
	// the TCP segment, as siw does.
	MaxFPDU int
	// Ext: both sides offered RFC 7306's extensions (immediate data,
	// atomics) while connecting; without it none is sent or taken.
	Ext bool
	// Nudge, when not zero, makes the queue pair wake a peer that has
	// sent nothing yet with zero-length Writes, after each Nudge of quiet
	// (see ConnectOptions.NoNudge).
	Nudge time.Duration
	// BusyPoll is how long a read that finds the socket empty reads it
	// again before it waits (see ConnectOptions.BusyPoll); 0: not at all.
	BusyPoll time.Duration
}

type sqEntry struct {
	wr     SendWR // wr.SGL is nil: the SGEs are in sges, or in pre
	sges   [MaxSGE]SGE
	nsge   int
	pre    *shape     // a Prepared's shape, whose pin it keeps (shape.copies)
	tmpl   headerTmpl // the encoded header of the first FPDU
	length int
	endOff uint64 // stream offset past the last byte, once framed
	framed bool
	done   bool
	status Status
	// Reads: one Read Request per SGE; readsLeft counts unanswered ones.
	readsLeft int
	msn       uint32 // Sends and Reads: MSN of the (first) message
	// Flushes: placement type and range length (PostFlush).
	flushType wire.FlushType
	flushLen  uint64
}

type rqEntry struct {
	id     uint64
	sges   [MaxSGE]SGE
	nsge   int
	length int
}

// quietRead is the size from which a Read under way, either way, stops
// the busy poll. Its response streams for longer than a spin lasts, and
// reads that spin meanwhile, we think (inferred, not measured), contend
// for the socket's lock with the kernel delivering the stream (a reader
// holding it sends the arriving segments to the socket's backlog) and, at
// the responder, with the writes of the response. 1 MiB cache ReadAt at 2 in
// flight, busy polling: 3,383 MB/s (0.89 x perf read_bw in the same
// rounds) before, 3,576 (0.92 x) with only the requester quiet, 3,756
// (1.01 x) with both (medians of 8 interleaved rounds); 4 KiB, whose
// Reads never count, the same within the noise.
const quietRead = 64 << 10

// orqEntry is one outstanding outbound Read Request.
type orqEntry struct {
	sq       *sqEntry
	sge      SGE
	sinkSTag uint32
	sinkTO   uint64
	placed   int
	atomic   bool // an Atomic Request, answered by an Atomic Response
}

// irqEntry is one inbound Read Request waiting to be answered.
type irqEntry struct {
	region   *mem.Region
	sem      mem.Semantics // of the key the Read named (Detached: from the sink)
	srcOff   uint64
	size     int
	sinkSTag uint32
	sinkTO   uint64
	sent     int
	// An Atomic Request, carried out: its response's identifier and value.
	atomic bool
	reqID  uint32
	orig   uint64
}

// QP is a reliable-connected queue pair.
type QP struct {
	cfg    Config
	params Params
	link   Link
	log    *slog.Logger

	mu    sync.Mutex
	state atomic.Int32
	err   error

	sq []sqEntry
	// sqHead <= sqDone <= sqTx <= sqTail: retired, marked sent, framed, posted.
	sqHead, sqDone, sqTx, sqTail uint64

	rq             []rqEntry
	rqHead, rqTail uint64

	orq              []orqEntry
	orqHead, orqTail uint64
	// largeReads counts the Reads of at least quietRead bytes under way:
	// outbound ones until their response has all come, inbound ones until
	// their response is framed. While there are any the link does not
	// busy-poll (see fdLink.doReadIdle).
	largeReads atomic.Int32

	irq              []irqEntry
	irqHead, irqTail uint64

	shapes [shapeSlots]shape

	termPending *wire.Terminate
	termScratch [64]byte
	// termDone is made when a Terminate is queued and closed once it has
	// been written, or given up on (link lost, or termTimeout passed):
	// until then Close leaves the socket open.
	termDone  chan struct{}
	termOnce  sync.Once
	termTimer *time.Timer // gives up on the Terminate; under mu

	// Transmit role: held by one goroutine at a time.
	txBusy   bool
	txHanded bool // the role was passed to the transmit goroutine
	// txCloses: the queue pair failed while the role was held; its holder
	// flushes the send queue and closes the link when it lets go.
	txCloses bool
	// txRun: the transmit goroutine runs. It is started when the role
	// is handed to it, or acknowledgements are to be watched, and ends
	// when it has nothing left to do (see txLoop). txGone: the queue pair
	// is closing, and no transmit goroutine starts any more.
	txRun bool
	// txHeld: the link holds back bytes the transmit path wrote, until
	// the peer's window has room for what the socket holds unsent (see
	// fdLink.Writev): the transmit goroutine looks again every heldPoll.
	txHeld   bool
	heldPoll time.Duration
	txGone   bool
	txFn     func()        // q.txLoop, made once by Start; nil: no goroutines (readyLocked)
	ackT     *fineTimer    // the transmit goroutine's, made once in Acked mode
	ackWait  time.Duration // the transmit goroutine's next wait for acknowledgements
	// drained, made by a waiting Disconnect, is closed when the transmit
	// role is let go, the ORQ empties or the queue pair fails.
	drained chan struct{}
	txWake  chan struct{}
	tx      txState

	rx     rxState
	peerUp atomic.Bool // the peer's first FPDU has arrived
	heard  atomic.Bool // the peer has sent an FPDU's first bytes

	nudgeDue bool         // a zero-length Write is to be framed; under mu
	nudges   atomic.Int32 // zero-length Writes sent to wake the peer

	// The receive path is held by the receive goroutine or, inline, by a
	// goroutine waiting for this QP (rxMu). rxYield asks the receive
	// goroutine to let go; it signals rxFree when it has. rxAppGen counts
	// the times an inline receiver let go; rxTick reports progress made by the
	// receive goroutine to Progress.
	rxMu     sync.Mutex
	rxYield  atomic.Bool
	bell     atomic.Bool
	rxAppGen atomic.Uint64
	rxFree   chan struct{}
	rxTick   chan struct{}
	// rxHand gives the path back to the receive goroutine (the watcher,
	// reclaim.go); rxInline is set while a waiter holds it; waitDone is
	// the last inline waiter's ctx.Done, if any, and waitStop ends the
	// registration that rings the doorbell when it is done (ringFn),
	// all under rxMu (see watchCtx). watched is the watcher's flag: q is
	// in its list.
	rxHand chan struct{}
	// abortWaits counts the sides (read, write) in failAborted.
	abortWaits atomic.Int32
	rxInline   atomic.Bool
	waitDone   <-chan struct{}
	waitStop   func() bool
	waitKeep   bool // waitDone's registration outlives its wait (see watchCtx)
	ringFn     func()
	watched    atomic.Bool
	rxDL       time.Time    // the read deadline the holder of the path last set
	rxWakes    atomic.Int64 // times the receive goroutine woke to take the path (tests)
	watchLooks atomic.Int64 // times the watcher looked at the queue pair (tests)
	rings      atomic.Int64 // times its doorbell rang (tests)
	ctxRings   atomic.Int64 // of them, by a waiter's context (tests)
	dcLooks    atomic.Int64 // times Disconnect looked whether the queue pair is idle (tests)
	rxStaged   atomic.Bool  // the receive path holds a staging buffer (tests)

	peerData []byte
	// abort, under mu, cancels a Connect or Accept under way.
	abort context.CancelFunc

	done    chan struct{}
	failed  chan struct{} // closed when the queue pair enters the error state
	wg      sync.WaitGroup
	closing sync.Once
	// inFn is set while a ProgressFunc's function runs; closeLater, when
	// Close was called meanwhile and left the rest to ProgressFunc.
	inFn       atomic.Bool
	closeLater atomic.Bool
	// fnWait is set while a ProgressFunc runs; fnDue, while its function
	// is owed a call it has not had: its first, or one for FPDUs the
	// receive goroutine took or a completion from elsewhere than the
	// receive path (see kickFn), made where the path is held.
	fnWait atomic.Bool
	fnDue  atomic.Bool
}

// NewQP returns an idle queue pair.
func NewQP(cfg Config) (*QP, error) {
	if cfg.SendDepth < 1 || cfg.RecvDepth < 1 {
		return nil, fmt.Errorf("%w: queue depths must be at least 1", ErrBadConfig)
	}
	if cfg.SendCQ == nil || cfg.RecvCQ == nil || cfg.Table == nil {
		return nil, fmt.Errorf("%w: a queue pair needs completion queues and an STag table", ErrBadConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	q := &QP{
		cfg:    cfg,
		log:    cfg.Logger,
		sq:     make([]sqEntry, min(cfg.SendDepth, ringStart)),
		rq:     make([]rqEntry, min(cfg.RecvDepth, ringStart)),
		txWake: make(chan struct{}, 1),
		rxFree: make(chan struct{}, 1),
		rxTick: make(chan struct{}, 1),
		rxHand: make(chan struct{}, 1),
		done:   make(chan struct{}),
		failed: make(chan struct{}),
	}
	q.ringFn = q.ctxRing // made once: a context's registration takes no new one
	cfg.SendCQ.attach(q)
	if cfg.RecvCQ != cfg.SendCQ {
		cfg.RecvCQ.attach(q)
	}
	return q, nil
}

// State returns the queue pair's state.
func (q *QP) State() State { return State(q.state.Load()) }

// Err returns why the queue pair left the ready state; while it is still
// ready, ErrCQOverrun if it lost a completion to a full queue, or nil.
func (q *QP) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// Failed returns a channel closed when the queue pair enters the error
// state (failTerm), Err set by then.
func (q *QP) Failed() <-chan struct{} { return q.failed }

// Params returns the negotiated connection parameters.
func (q *QP) Params() Params { return q.params }

// Owner returns Config.Owner.
func (q *QP) Owner() any { return q.cfg.Owner }

// Table returns the STag table the queue pair looks peers' STags up in.
func (q *QP) Table() *mem.Table { return q.cfg.Table }

// FPDUSize returns the size on the wire of a full FPDU on this connection
// now (the TCP segment, rounded down to 4 on links with real segments; on
// loopback the MSS less room for TCP's options, rounded down to 8, which
// grows as the MSS does), unless set; 0 before Start.
func (q *QP) FPDUSize() int {
	if q.State() == StateIdle || q.State() == StateConnecting {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.tx.seg
}

// Link returns the queue pair's link, nil before Start.
func (q *QP) Link() Link { return q.link }

// PostSend queues a send-queue work request.
func (q *QP) PostSend(wr *SendWR) error {
	if wr == nil {
		return ErrNilWR
	}
	q.mu.Lock()
	if err := q.postSendLocked(wr); err != nil {
		q.mu.Unlock()
		return err
	}
	q.kickLocked()
	return nil
}

// PostSendList queues work requests in order with one doorbell: their
// FPDUs leave together, in as few system calls as the socket allows. It
// returns how many were queued; on an error the rest were not.
func (q *QP) PostSendList(wrs []SendWR) (int, error) {
	q.mu.Lock()
	for i := range wrs {
		if err := q.postSendLocked(&wrs[i]); err != nil {
			if i > 0 {
				q.kickLocked()
			} else {
				q.mu.Unlock()
			}
			return i, err
		}
	}
	q.kickLocked()
	return len(wrs), nil
}

func (q *QP) postSendLocked(wr *SendWR) error {
	sh, err := q.lookupShapeLocked(wr)
	if err != nil {
		return err
	}
	e, err := q.sqSlotLocked()
	if err != nil {
		return err
	}
	if wr.Op.waits() && len(q.orq) == 0 {
		return ErrZeroORD
	}
	if wr.Op.ext() && !q.params.Ext {
		return ErrNotSupported // never sent to a peer that did not offer it
	}
	e.wr, e.length, e.tmpl = *wr, sh.length, sh.tmpl
	e.wr.SGL = nil
	if err := pinSGEs(wr.SGL); err != nil {
		return err
	}
	e.nsge = copy(e.sges[:], wr.SGL)
	if wr.Op.waits() {
		e.readsLeft = max(1, e.nsge)
	}
	q.sqTail++
	return nil
}

// sqSlotLocked returns the next free send-queue entry, reset, if the QP is
// ready and the queue has room.
func (q *QP) sqSlotLocked() (*sqEntry, error) {
	if s := q.State(); s != StateReady {
		return nil, q.notReadyLocked()
	}
	if q.sqTail-q.sqHead == uint64(len(q.sq)) {
		if len(q.sq) == q.cfg.SendDepth {
			return nil, ErrQueueFull
		}
		q.growSQLocked()
	}
	e := &q.sq[q.sqTail%uint64(len(q.sq))]
	e.pre, e.nsge, e.endOff, e.framed, e.done, e.status, e.readsLeft, e.msn = nil, 0, 0, false, false, Success, 0, 0
	return e, nil
}

// ringStart is the entries a work queue's ring starts with. A ring
// doubles, up to the queue's depth, when work fills it, and keeps its size
// from then on: at the default depth of 128 the full rings take 73 KiB
// (an entry holds MaxSGE SGEs), which a queue pair that never has more
// than a few requests outstanding need not carry (issue 7, item 5).
const ringStart = 8

// growSQLocked doubles the send queue's ring, up to its depth. Entries
// keep their absolute indexes; the ORQ's pointers to its Reads' entries
// follow them.
func (q *QP) growSQLocked() {
	old := q.sq
	sq := make([]sqEntry, min(2*len(old), q.cfg.SendDepth))
	for i := q.sqHead; i < q.sqTail; i++ {
		sq[i%uint64(len(sq))] = old[i%uint64(len(old))]
	}
	for k := q.orqHead; k < q.orqTail; k++ {
		o := &q.orq[k%uint64(len(q.orq))]
		for i := q.sqHead; o.sq != nil && i < q.sqTail; i++ {
			if o.sq == &old[i%uint64(len(old))] {
				o.sq = &sq[i%uint64(len(sq))]
				break
			}
		}
	}
	q.sq = sq
}

// growRQLocked doubles the receive queue's ring, up to its depth. The
// receive path copies the entry it fills (rxState.recvWQE) and names it by
// its absolute index, which stays.
func (q *QP) growRQLocked() {
	old := q.rq
	rq := make([]rqEntry, min(2*len(old), q.cfg.RecvDepth))
	for i := q.rqHead; i < q.rqTail; i++ {
		rq[i%uint64(len(rq))] = old[i%uint64(len(old))]
	}
	q.rq = rq
}

// PostRecv queues a receive buffer. Receives may be posted before the
// queue pair is connected.
func (q *QP) PostRecv(wr *RecvWR) error {
	if wr == nil {
		return ErrNilWR
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.postRecvLocked(wr)
}

// PostRecvList queues receive buffers in order under one lock. It returns
// how many were queued; on an error the rest were not.
func (q *QP) PostRecvList(wrs []RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range wrs {
		if err := q.postRecvLocked(&wrs[i]); err != nil {
			return i, err
		}
	}
	return len(wrs), nil
}

// notReadyLocked is the error of a post the queue pair cannot take: once
// it has failed, it wraps why, so that a poster learns the reason (the
// peer closed, the link broke) from the post as from Err.
func (q *QP) notReadyLocked() error {
	if q.err != nil {
		return fmt.Errorf("%w: %w", ErrNotReady, q.err)
	}
	return ErrNotReady
}

func (q *QP) postRecvLocked(wr *RecvWR) error {
	if len(wr.SGL) > MaxSGE {
		return ErrTooManySGE
	}
	total := 0
	for i := range wr.SGL {
		if err := checkLocal(&wr.SGL[i], true); err != nil {
			return err
		}
		total += wr.SGL[i].Length
	}
	if s := q.State(); s == StateError || s == StateClosing {
		return q.notReadyLocked()
	}
	if q.rqTail-q.rqHead == uint64(len(q.rq)) {
		if len(q.rq) == q.cfg.RecvDepth {
			return ErrQueueFull
		}
		q.growRQLocked()
	}
	if err := pinSGEs(wr.SGL); err != nil {
		return err
	}
	e := &q.rq[q.rqTail%uint64(len(q.rq))]
	e.id, e.length = wr.ID, total
	e.nsge = copy(e.sges[:], wr.SGL)
	q.rqTail++
	return nil
}

// checkLocal checks an SGE against its region: bounds, validity, and the
// local write right where the memory is to be written.
func checkLocal(s *SGE, write bool) error {
	switch {
	case s.MR == nil:
		return fmt.Errorf("%w: SGE without a memory region", ErrLocalAccess)
	case s.Offset < 0 || s.Length < 0 || !s.MR.Contains(uint64(s.Offset), uint64(s.Length)):
		return fmt.Errorf("%w: [%d, +%d) outside region %v of %d bytes", ErrLocalAccess, s.Offset, s.Length, s.MR.STag(), s.MR.Len())
	case !s.MR.Valid():
		return fmt.Errorf("%w: region %v is not valid", ErrLocalAccess, s.MR.STag())
	case write && s.MR.Access()&mem.LocalWrite == 0:
		return fmt.Errorf("%w: region %v lacks local write access", ErrLocalAccess, s.MR.STag())
	}
	return nil
}

// CheckWR checks a work request as a post does (checkShape: opcode,
// flags, SGE count and every SGE against its region) and returns its
// length, for a layer that keeps work requests to post later and again
// after a fail-over (gowarp's sessions): a bad SGE is then the post's
// error, not every later connection's.
func CheckWR(wr *SendWR) (int, error) { return checkShape(wr) }

// PinSGL pins the regions of sges, as a post does, until UnpinSGL: no
// region goes while a kept work request may still be sent.
func PinSGL(sges []SGE) error { return pinSGEs(sges) }

// UnpinSGL ends PinSGL's pins.
func UnpinSGL(sges []SGE) { unpinSGEs(sges) }

// pinSGEs pins the regions of a work request's SGEs, which were checked
// before; a region whose Deregister has begun since fails it.
func pinSGEs(sges []SGE) error {
	for i := range sges {
		if !sges[i].MR.TryAcquire() {
			unpinSGEs(sges[:i])
			return fmt.Errorf("%w: region %v is deregistered", ErrLocalAccess, sges[i].MR.STag())
		}
	}
	return nil
}

func unpinSGEs(sges []SGE) {
	for i := range sges {
		sges[i].MR.Release()
	}
}

// kick starts the transmit path.
func (q *QP) kick() {
	q.mu.Lock()
	q.kickLocked()
}

// kickLocked starts the transmit path; q.mu is held and is released. If
// another goroutine holds the transmit role it will see the new work;
// otherwise the caller takes the role and transmits directly, or hands it
// to the transmit goroutine in AsyncOnly mode.
func (q *QP) kickLocked() {
	if q.txBusy {
		q.mu.Unlock() // the holder builds its next batch under q.mu: it will see this
		return
	}
	q.txBusy = true
	if q.cfg.AsyncOnly {
		q.handTxLocked()
		q.mu.Unlock()
		return
	}
	q.transmit(false, true)
}

// kickAsyncLocked starts the transmit path on the transmit goroutine; q.mu
// is held and is released.
func (q *QP) kickAsyncLocked() {
	if !q.txBusy {
		q.txBusy = true
		q.handTxLocked()
	}
	q.mu.Unlock()
}

// handTxLocked passes the held transmit role to the transmit goroutine.
func (q *QP) handTxLocked() {
	q.txHanded = true
	if q.txGone {
		// No one will write the batch: let its regions and arrays go.
		// Close, which stopped the transmit goroutines, lets the role go.
		q.tx.drop()
		return
	}
	q.startTxLocked()
}

// startTxLocked starts the transmit goroutine, or wakes it if it runs.
// Starting it costs no allocation (txFn is made once; Go reuses the
// stacks of ended goroutines): an idle queue pair keeps no goroutine
// parked for its transmit path, whose stack would stay resident.
func (q *QP) startTxLocked() {
	if q.txGone || q.txFn == nil {
		return // closing; or set up without goroutines, by a test that does their part
	}
	if !q.txRun {
		q.txRun = true
		q.wg.Add(1) // Close waits for it; it sets txGone, under mu, before it waits
		go q.txFn()
		return
	}
	q.wakeTx()
}

// wakeTx wakes the transmit goroutine if it waits for acknowledgements.
func (q *QP) wakeTx() {
	select {
	case q.txWake <- struct{}{}:
	default:
	}
}

// txLoop is the transmit goroutine: it takes the transmit role over when a
// direct transmission would block, and watches acknowledgements in Acked
// mode. It ends when it has neither, or when the queue pair is closed.
func (q *QP) txLoop() {
	defer q.wg.Done()
	for {
		q.mu.Lock()
		handed := q.txHanded
		q.txHanded = false
		acks := q.cfg.Completion == Acked && q.sqDone < q.sqTx && !q.txBusy && q.State() != StateError
		held := q.txHeld && !q.txBusy && q.State() != StateError
		if !handed && !acks && !held {
			q.txRun = false // a hand-off from now on starts another
			q.mu.Unlock()
			return
		}
		// The first look at the acknowledgements comes soon (loopback's
		// come within tens of microseconds), the next ones later.
		if !acks {
			q.ackWait = 0
		}
		q.ackWait = min(max(2*q.ackWait, ackPollFirst), ackPoll)
		wait := q.ackWait
		if held && !acks {
			// Only bytes held back wait: for a peer that does not read,
			// the window can stay short a long time.
			q.heldPoll = min(max(2*q.heldPoll, ackPoll), maxHeldPoll)
			wait = q.heldPoll
		}
		q.mu.Unlock()
		if handed {
			q.transmit(true, false)
			continue
		}
		if q.ackT == nil {
			q.ackT = newFineTimer() // see finetimer.go: a time.Timer takes 1 ms
		}
		q.ackT.reset(wait)
		select {
		case <-q.txWake:
			q.ackT.stop()
		case <-q.ackT.C():
			q.mu.Lock()
			if q.txBusy {
				q.mu.Unlock()
				continue
			}
			q.txBusy = true
			q.txHeld = false
			q.mu.Unlock()
			q.transmit(true, false)
		case <-q.done:
			q.ackT.stop()
			q.mu.Lock()
			q.txRun = false
			if q.txHanded {
				q.tx.drop() // a batch handed over that no one will write
			}
			q.mu.Unlock()
			return
		}
	}
}

// maxHeldPoll bounds the wait between two looks at the peer's window
// while the link holds bytes back (see txHeld); the waits double from
// ackPoll.
const maxHeldPoll = 10 * time.Millisecond

// ackPoll is how often the send queue is read while completions wait for
// acknowledgement. The timer runs only while such work exists.
//
// It is a clock because no event reaches Go: Linux reports acknowledged
// byte ranges as SO_TIMESTAMPING TX_ACK entries on the socket's error
// queue, signalled by EPOLLERR, and Go's netpoller takes an EPOLLERR that
// comes alone (as it does while the send buffer is full and nothing is to
// be read, Acked mode's usual state) as a broken descriptor: the next read
// fails with ErrNotPollable. TCP_NOTSENT_LOWAT's EPOLLOUT tells of bytes
// sent, not acknowledged.
const ackPoll = 50 * time.Microsecond

// ackPollFirst is the first wait for acknowledgements after a wait that
// had none to watch; the waits double from it to ackPoll.
const ackPollFirst = 10 * time.Microsecond

// retireLocked completes send-queue entries in order, as far as they are
// done, pushing completions for the signaled and the failed.
func (q *QP) retireLocked(fromRx bool) {
	pushed := false
	for q.sqHead < q.sqTail {
		e := &q.sq[q.sqHead%uint64(len(q.sq))]
		if !e.done {
			break
		}
		for i := range e.nsge {
			e.sges[i].MR.Release()
			e.sges[i] = SGE{}
		}
		if e.pre != nil {
			if e.pre.copies--; e.pre.copies == 0 && e.pre.released {
				unpinSGEs(e.pre.sges[:e.pre.nsge]) // the Prepared's pin, kept for this copy
			}
		}
		if e.wr.Flags&Signaled != 0 || e.status != Success {
			c := Completion{ID: e.wr.ID, QP: q, Op: compOp(e.wr.Op), Status: e.status, Bytes: e.length}
			if !q.cfg.SendCQ.push(&c, fromRx) {
				q.overrunLocked()
			}
			pushed = true
		}
		e.pre, e.nsge = nil, 0
		q.sqHead++
	}
	if pushed && !fromRx {
		q.kickFn()
	}
	if q.sqDone < q.sqHead {
		// The receive path retired work the transmit path had not yet
		// marked sent: a Read (an atomic, a flush) answered while the
		// write that sent it was still in its system call. Marking goes
		// on from the head: the slots behind it may hold new work, or,
		// once the ring grew, nothing (growSQLocked copies from the head).
		q.sqDone = q.sqHead
	}
}

// overrunLocked records a completion lost to a full queue. The queue pair
// stays ready: the connection is intact, only the completion is gone.
func (q *QP) overrunLocked() {
	if q.err == nil {
		q.err = ErrCQOverrun
	}
}

// termTimeout bounds how long a Terminate may take to leave, and so how
// long Close waits for it: long enough for a busy peer's TCP to open its
// window, short enough that a peer that stopped reading holds no one up.
const termTimeout = time.Second
