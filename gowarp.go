// Package gowarp is a software RDMA stack: one-sided RDMA Read and Write,
// Send/Receive and completion queues over ordinary TCP, speaking iWARP
// (MPA, DDP and RDMAP) on the wire, so it interoperates with the Linux
// kernel's siw driver and rdma-core's tools.
//
// The model is the one of libibverbs and rdma_cm. A Device holds protection
// domains (PD); memory is registered in a PD as a memory region (MR) with
// access rights and an STag (the rkey/lkey). A queue pair (QP) has a send
// and a receive queue; work requests posted to them complete into
// completion queues (CQ), which any number of QPs may share. QPs are
// connected with Connect on one side and a Listener on the other, or over
// a stream the application already has: ConnectConn over any net.Conn
// (a TLS connection, a socket of another network namespace) and ListenOn
// over any net.Listener. A device's adapters and topology place queue
// pairs on the links that reach their peers directly (Device.AddAdapter,
// Device.SetTopology, QP.Adapter); a Session (PD.DialSession,
// PD.ListenSession) bundles connections over several of them and
// survives the loss of any, each Send delivered exactly once.
//
//	dev := gowarp.Open()
//	pd := dev.AllocPD()
//	cq := dev.NewCQ(64)
//	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
//	_ = qp.Connect(ctx, "10.0.0.2:7174", gowarp.ConnectOptions{})
//	buf := make([]byte, 4096)
//	mr, _ := pd.Register(buf, gowarp.LocalWrite)
//	_ = qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
//		SGL: []gowarp.SGE{{MR: mr, Length: 4096}}, RemoteAddr: addr, RKey: rkey})
//	var wc [16]gowarp.Completion
//	_ = cq.Wait(ctx)
//	n := cq.Poll(wc[:])
package gowarp

import (
	"log/slog"
	"sync/atomic"

	"github.com/gowarp/gowarp/internal/engine"
	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// Errors. Every error a call of this package returns, or a completion or
// Err reports, matches one of these with errors.Is (or is a Status, a
// *TermError, a context error or a net error, wrapped). A QP's Err after a
// Terminate wraps the Terminate's reason as a *TermError as well.
var (
	// ErrNotReady: work was posted on a queue pair that is not connected
	// (idle, closing or in error); once in error it wraps the reason.
	ErrNotReady = engine.ErrNotReady
	// ErrQueueFull: the send or receive queue has no free entry.
	ErrQueueFull = engine.ErrQueueFull
	// ErrTooManySGE: a work request has more than MaxSGE entries.
	ErrTooManySGE = engine.ErrTooManySGE
	// ErrBadOp: a send work request's Op is not one of the Op constants.
	ErrBadOp = engine.ErrBadOp
	// ErrNilWR: a nil work request was posted (or prepared).
	ErrNilWR = engine.ErrNilWR
	// ErrZeroORD: an RDMA Read posted on a connection whose ORD is 0
	// (NoReads asked for, or the peer's IRD is 0).
	ErrZeroORD = engine.ErrZeroORD
	// ErrNotSupported: an RFC 7306 operation (immediate data, atomics) posted on
	// a connection whose peer did not negotiate the extensions
	// (ConnectOptions.Extensions), or prepared before it was connected.
	ErrNotSupported = engine.ErrNotSupported
	// ErrBadAtomic: an atomic work request without exactly one 8-byte
	// SGE, or with a remote address that is not 8-byte aligned.
	ErrBadAtomic = engine.ErrBadAtomic
	// ErrTooLong: a work request's SGEs add up to 4 GiB or more, more
	// than one RDMAP message can carry.
	ErrTooLong = engine.ErrTooLong
	// ErrLocalAccess: an SGE names no region, lies outside it, names an
	// invalid region, or writes a region without LocalWrite.
	ErrLocalAccess = engine.ErrLocalAccess
	// ErrPeerTerminated: the peer sent a Terminate; the QP's Err wraps
	// its reason (a *TermError).
	ErrPeerTerminated = engine.ErrPeerTerminated
	// ErrTerminated: this side found an error in the peer's input and
	// sent a Terminate; the QP's Err wraps its reason (a *TermError).
	ErrTerminated = engine.ErrTerminated
	// ErrPeerClosed: the peer closed the TCP connection.
	ErrPeerClosed = engine.ErrPeerClosed
	// ErrClosed: the queue pair was closed or disconnected locally.
	ErrClosed = engine.ErrClosed
	// ErrLinkLost: the TCP connection failed (reset, timeout).
	ErrLinkLost = engine.ErrLinkLost
	// ErrLinkTimeout: the peer went unheard for the link timeout
	// (ConnectOptions.LinkTimeout, 30 s by default): the link or the
	// peer's host died silently, with no FIN or reset, or the peer kept
	// its receive window closed with data waiting. The queue pair's work
	// is flushed. It matches ErrLinkLost too. A Connect whose dial got no
	// answer within the link timeout fails with it as well.
	ErrLinkTimeout = engine.ErrLinkTimeout
	// ErrCQOverrun: completions were lost because a completion queue was
	// full.
	ErrCQOverrun = engine.ErrCQOverrun
	// ErrBadState: Connect, Accept or a similar call on a queue pair in
	// the wrong state (Connect on one already connected, say).
	ErrBadState = engine.ErrBadState
	// ErrBadConfig: NewQP was given an unusable QPConfig, or ConnectConn,
	// ListenOn or ReadConnRequest no connection or listener.
	ErrBadConfig = engine.ErrBadConfig
	// ErrRegionBusy: Deregister of a region that outstanding work or an
	// open Snapshot uses; MR.Snapshot while writes in progress do not end.
	ErrRegionBusy = mem.ErrBusy
	// ErrNotRegistered: Deregister of a region that is not (or no
	// longer) registered.
	ErrNotRegistered = mem.ErrNotInTable
	// ErrEmptyBuffer: Register of no memory.
	ErrEmptyBuffer = mem.ErrEmpty
	// ErrBadAccess: Register with access bits that are not Access rights.
	ErrBadAccess = mem.ErrBadAccess
	// ErrAddrWrap: RegisterBuffers with an Addr whose range passes 2^64.
	ErrAddrWrap = mem.ErrAddrWrap
	// ErrRegionInvalid: MR.WaitPlaced on a region deregistered or
	// invalidated (by a peer's Send with Invalidate) before the bytes came;
	// MR.Snapshot or MR.WriteAt of a deregistered region.
	ErrRegionInvalid = mem.ErrInvalid
	// ErrTableFull: every STag index of the device is in use.
	ErrTableFull = mem.ErrTableFull
	// ErrIndexInUse: a registration asked for an STag index
	// (RegisterOptions.Index, FileOptions.Index) another region has, or
	// one wider than 24 bits; Table.Import of a stream with an STag whose
	// index the table has.
	ErrIndexInUse = mem.ErrIndexInUse
	// ErrSnapshotClosed: a read or Close of a closed Snapshot.
	ErrSnapshotClosed = mem.ErrSnapshotClosed
	// ErrOutOfBounds: MR.WriteAt or Snapshot.ReadAt of a range outside
	// the region.
	ErrOutOfBounds = mem.ErrBounds
	// ErrReleased: a post of a released Prepared.
	ErrReleased = engine.ErrReleased
)

// TermError is the reason a Terminate carries (layer, error type and
// code, RFC 5040 §7): a QP's Err wraps one after a Terminate either way,
// and errors.Is matches it against the values of package wire (for
// example wire.ErrDDPInvalidSTag).
type TermError = wire.TermError

// Device is a software RDMA device: the STag table its regions live in and
// the protection domains that partition it.
type Device struct {
	tables  tables
	nextPD  atomic.Uint32
	log     *slog.Logger
	events  chan Event
	dropped atomic.Uint64
	// adapters are the device's links and topology (adapter.go).
	adapters adapterSet
}

// DeviceOption configures Open.
type DeviceOption func(*Device)

// WithLogger sets the logger for connection events and protocol errors
// (default slog.Default()).
func WithLogger(l *slog.Logger) DeviceOption { return func(d *Device) { d.log = l } }

// DefaultEventBuffer is how many asynchronous events a device holds for
// its reader by default (see Device.Events).
const DefaultEventBuffer = 256

// WithEventBuffer sets how many asynchronous events the device holds for
// a reader of Events before it drops new ones (default
// DefaultEventBuffer).
func WithEventBuffer(n int) DeviceOption {
	return func(d *Device) { d.events = make(chan Event, max(n, 1)) }
}

// Open returns a new device.
func Open(opts ...DeviceOption) *Device {
	// STags are drawn at random per registration (mem.Table), so that a
	// peer holding one cannot name another, nor a stale one a new region.
	d := &Device{log: slog.Default()}
	d.tables.def = d.newTable(Identity{})
	for _, o := range opts {
		o(d)
	}
	if d.events == nil {
		d.events = make(chan Event, DefaultEventBuffer)
	}
	return d
}

// NewCQ returns a completion queue holding up to depth completions.
func (d *Device) NewCQ(depth int) *CQ { return pubCQ(engine.NewCQEvents(depth, d.emit)) }

// Event is an asynchronous event of a device's queue pairs and completion
// queues, as libibverbs' ibv_get_async_event and rdma_cm's disconnect
// event report them: see Device.Events and the EventType constants.
type Event struct {
	Type EventType
	QP   *QP   // the queue pair concerned
	CQ   *CQ   // EventCQOverrun: the queue that overran
	Err  error // why: matches this package's errors with errors.Is
}

// EventType says what an Event reports.
type EventType uint8

func (t EventType) String() string { return engine.EventType(t).String() }

// Asynchronous event types. The queue pair events carry the QP and, in
// Err, the reason, which errors.Is matches against this package's errors
// (and a Terminate's *TermError).
const (
	// EventQPFatal: this side moved the QP to error: it found an error in
	// the peer's input and sent a Terminate (Err matches ErrTerminated),
	// or the connection failed (ErrLinkLost; ErrLinkTimeout when the peer
	// went unheard for the link timeout). IBV_EVENT_QP_FATAL.
	EventQPFatal EventType = iota + 1
	// EventPeerTerminated: the peer sent a Terminate (Err matches
	// ErrPeerTerminated and the peer's TermError).
	EventPeerTerminated
	// EventPeerClosed: the peer closed the connection (ErrPeerClosed).
	// RDMA_CM_EVENT_DISCONNECTED.
	EventPeerClosed
	// EventCQOverrun: a completion found its CQ (Event.CQ) full and was
	// lost; the CQ's Wait returns ErrCQOverrun from then on. Reported
	// once per CQ. IBV_EVENT_CQ_ERR.
	EventCQOverrun
	// EventLastWQE: the QP left the ready state, for any reason (Err;
	// ErrClosed after Close or Disconnect), and every work request it
	// held has completed, most as flushed: nothing more of it will
	// complete, and it pins no region any more. It follows the failure's
	// own event. IBV_EVENT_QP_LAST_WQE_REACHED.
	EventLastWQE
)

// Events returns the channel on which the device reports asynchronous
// events: a queue pair's fatal error, a Terminate or close from the peer,
// a completion queue's overrun, a queue pair's last work request done.
// They reach whoever receives, without polling QP.Err or CQ.Wait.
//
// The engine never waits for a reader. The channel holds
// DefaultEventBuffer events (see WithEventBuffer); when it is full, new
// events are dropped and counted by DroppedEvents. Nothing else is lost:
// the state events report stays readable (QP.State and QP.Err, CQ.Wait's
// ErrCQOverrun), so a device whose events nobody reads works as before.
// An event keeps the queue pair it names from the garbage collector until
// it is read: unread, the buffer holds as many closed queue pairs, their
// rings but none of their work's memory (about 180 KiB each for the
// cache's connections). The channel is never closed.
func (d *Device) Events() <-chan Event { return d.events }

// DroppedEvents returns how many events were dropped because the Events
// channel was full.
func (d *Device) DroppedEvents() uint64 { return d.dropped.Load() }

// emit queues an event without ever blocking the engine.
func (d *Device) emit(e engine.Event) {
	select {
	case d.events <- Event{Type: EventType(e.Type), QP: pubQP(e.QP), CQ: pubCQ(e.CQ), Err: e.Err}:
	default:
		d.dropped.Add(1)
	}
}

// PD is a protection domain: regions and queue pairs of one PD can be
// used together; a peer connected to a QP reaches only its PD's regions.
type PD struct {
	dev *Device
	tbl *Table // the STag table its regions live in
	id  uint32
}

// AllocPD returns a new protection domain of the device's default table.
func (d *Device) AllocPD() *PD { return d.tables.def.AllocPD() }

// Register registers buf as a memory region with the given rights. Its
// tagged offsets start at the buffer's address, as with libibverbs.
func (pd *PD) Register(buf []byte, access Access) (*MR, error) {
	return pd.register([][]byte{buf}, access, mem.Options{})
}

// RegisterOptions tune RegisterBuffers.
type RegisterOptions struct {
	// Addr is the tagged offset of the region's first byte. Zero means
	// the address of the first buffer in this process, the convention of
	// libibverbs and siw, which peers expect.
	Addr uint64
	// Key is the consumer key, the STag's low 8 bits. Zero, unless
	// KeyFixed is set, means a random key.
	Key uint8
	// KeyFixed keeps Key even when it is zero.
	KeyFixed bool
	// Index, if not zero, is the STag index (the STag's upper 24 bits)
	// the region must have, as when a server re-registers its regions
	// under the STags its clients hold after a restart: ErrIndexInUse if
	// another region of the device has it.
	Index uint32
}

// RegisterBuffers registers several buffers as one region with a single
// STag and one contiguous range of tagged offsets: a Write into it or a
// Read landing in it fills the buffers in order.
func (pd *PD) RegisterBuffers(bufs [][]byte, access Access, o RegisterOptions) (*MR, error) {
	return pd.register(bufs, access, mem.Options(o))
}

// Alloc registers n bytes of new, zeroed memory with the given rights;
// MR.Bytes is the memory and Deregister frees it. On Linux the memory is
// a sealed memfd mapped shared, and a shared-memory link (see
// ConnectOptions.SharedMemory) passes what a Write, Send or Read
// Response sends from it to the peer by reference: the peer copies it
// once, from its own mapping straight to the bytes' place, where memory
// from Register is copied twice (into the link's ring and out of it).
// That is the link's fast path for large transfers. On any other link,
// and on other systems, the memory is ordinary registered memory.
//
// A Handed completion of such a Write or Send says the link took the
// reference, not that the peer has copied the bytes: as Handed's rule
// is for TCP, do not change them until an exchange with the peer shows
// they arrived, or ask for Acked, which completes once the peer has
// copied them.
func (pd *PD) Alloc(n int, access Access) (*MR, error) {
	r, err := pd.tbl.t.RegisterShared(pd.id, n, mem.Access(access), mem.Options{})
	if err != nil {
		return nil, err
	}
	return pubMR(r), nil
}

// registerAnon is Alloc's counterpart for memory only this process
// uses, outside the Go heap (mem.RegisterAnon): after Deregister it is
// gone, so nothing may keep a slice of it.
func (pd *PD) registerAnon(n int, access Access) (*MR, error) {
	r, err := pd.tbl.t.RegisterAnon(pd.id, n, mem.Access(access), mem.Options{})
	if err != nil {
		return nil, err
	}
	return pubMR(r), nil
}

func (pd *PD) register(bufs [][]byte, access Access, o mem.Options) (*MR, error) {
	r, err := pd.tbl.t.Register(pd.id, bufs, mem.Access(access), o)
	if err != nil {
		return nil, err
	}
	return pubMR(r), nil
}
