package gowarp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/gowarp/gowarp/internal/cm"
	"github.com/gowarp/gowarp/internal/engine"
)

// Connection setup: one connection manager (internal/cm) does both sides'
// TCP and MPA exchange, and the engine (connect.go) starts the queue pair
// on what it settled, whether gowarp dials and listens itself (Connect,
// Listen) or runs over a stream the caller already has (ConnectConn,
// ListenOn, ReadConnRequest): a socket opened in another network
// namespace, a TLS connection, any net.Conn.

// Connection setup errors.
var (
	// ErrRejected: the peer rejected the connection (see RejectedError).
	ErrRejected = cm.ErrRejected
	// ErrMarkers: the peer asked for MPA markers, which gowarp lacks.
	ErrMarkers = cm.ErrMarkers
	// ErrMPARevision: an MPA revision other than 1 or 2 was asked for,
	// or the peer answered with another revision than the one asked.
	ErrMPARevision = cm.ErrRevision
	// ErrMPAProtocol: the peer's MPA request or reply is malformed or out
	// of turn.
	ErrMPAProtocol = cm.ErrProtocol
	// ErrPrivateDataLong: more private data than an MPA frame holds.
	ErrPrivateDataLong = cm.ErrPrivateDataLong
	// ErrInsufficientIRD: the peer's IRD/ORD cannot be met (RFC 6581's
	// "insufficient IRD"): its ORD exceeds the most inbound Reads this
	// side can take, or this side asked for IRD NoReads and the
	// responder still wants to read.
	ErrInsufficientIRD = cm.ErrInsufficientIRD
)

// RejectedError is the error of a rejected Connect; it carries the peer's
// private data and matches ErrRejected.
type RejectedError struct {
	// PrivateData is what the peer sent with its rejection.
	PrivateData []byte
	err         error // the connection manager's, wrapped
}

func (e *RejectedError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("%v (%d bytes of private data)", ErrRejected, len(e.PrivateData))
	}
	return e.err.Error()
}

// Unwrap returns the underlying error, which matches ErrRejected.
func (e *RejectedError) Unwrap() error {
	if e.err == nil {
		return ErrRejected
	}
	return e.err
}

// connErr gives a connection setup error the root package's types.
func connErr(err error) error {
	var r *cm.RejectedError
	if errors.As(err, &r) {
		return &RejectedError{PrivateData: r.PrivateData, err: err}
	}
	return err
}

// ConnectOptions tune connection setup, on either side.
type ConnectOptions struct {
	// PrivateData goes to the peer in the MPA request or reply: at most
	// 508 bytes (252 to interoperate with siw).
	PrivateData []byte
	// CRC asks for MPA CRC32c on every FPDU; the peer may ask too.
	CRC bool
	// MPARevision is 1 or 2 (default 2, with IRD/ORD negotiation).
	MPARevision int
	// IRD and ORD bound inbound and outbound RDMA Reads in flight: 0
	// means the default 16, NoReads (any negative value) none, and at
	// most 128 are allowed. The peer's wishes adjust them (RFC 6581): our
	// ORD is capped by the peer's IRD, and our IRD lifted to the peer's
	// ORD unless it is NoReads; Params reports the outcome. With ORD 0
	// PostSend refuses Reads (ErrZeroORD); with IRD 0 a peer's Read
	// Request is answered with a Terminate.
	IRD, ORD int
	// NoP2P keeps Connect from asking for peer-to-peer mode; the
	// connecting side must then send the first message, as with rping.
	// By default revision 2 connections use peer-to-peer mode with a
	// ready-to-receive message, so either side may send first.
	NoP2P bool
	// SendFirst lets a responder send before the initiator's first FPDU
	// when peer-to-peer mode is not in use, as siw does. RFC 5044 §7.1.2
	// has it wait, and so does gowarp by default; a protocol whose server
	// speaks first on a connection without peer-to-peer mode needs this
	// (perftest's write_lat over rdma_cm, which siw's clients speak), and
	// must itself make sure the initiator is ready (perftest syncs over its
	// control connection first). Initiators ignore it.
	//
	// Even so it waits SendFirstDelay after its MPA reply (20 ms when 0;
	// a negative value, not at all) unless the initiator speaks sooner:
	// Linux siw's initiator fails a connection whose first FPDUs arrive
	// with the reply, before it has taken the reply in (rdma_connect's
	// RDMA_CM_EVENT_CONNECT_ERROR, -EINVAL; docs/interop.md §12), which
	// ucmatose's clients met against a server that sent at once.
	SendFirst      bool
	SendFirstDelay time.Duration
	// MaxFPDU sets the size of full FPDUs on the wire; 0 sizes them to the
	// TCP segment, as siw does.
	MaxFPDU int
	// NoNudge turns off the zero-length RDMA Writes with which a
	// connecting queue pair wakes a responder that has not answered yet.
	// Linux siw's responder sends its MPA reply before it hands the
	// socket to its queue pair, and bytes that arrive in between stay
	// unread until more bytes come (docs/interop.md §1): a first message
	// sent at once may never be answered. So, by default, while the peer
	// has sent nothing, a connecting queue pair that has sent something
	// and been quiet for NudgeEvery sends a zero-length Write (STag 1, as
	// siw's own ready-to-receive message; RFC 5040 places nothing for it),
	// for the first 20 × NudgeEvery after connecting. Accept sends none.
	NoNudge bool
	// NudgeEvery is that quiet interval (default 200 ms).
	NudgeEvery time.Duration
	// LinkTimeout bounds how long the peer may go unheard before the
	// queue pair fails with ErrLinkTimeout and flushes its work: 0 means
	// DefaultLinkTimeout (30 s), NoLinkTimeout (any negative value) leaves
	// the socket as the system sets it (unacknowledged data is retransmitted
	// for about 15 minutes; Go's keepalive probes an idle connection after
	// 15 s, every 15 s, as many times as the system's count says). It
	// holds from the MPA exchange on, and bounds Connect's dial too. Sent
	// bytes unacknowledged for LinkTimeout (TCP_USER_TIMEOUT, Linux only),
	// or an idle connection's keepalive probes, sent from LinkTimeout/3 on
	// and unanswered until LinkTimeout, end the connection; so does a
	// receive window the peer keeps closed that long with data waiting
	// (Linux 5.11 on). Each side sets its own. Over ConnectConn's stream it
	// applies to the TCP socket under it when there is one (see
	// ConnectConn).
	LinkTimeout time.Duration
	// Extensions offers RFC 7306's extensions (immediate data: OpWriteImm,
	// OpSendImm), which gowarp negotiates in an 8-byte block at the end of
	// the MPA private data (so PrivateData may then be 8 bytes shorter).
	// They are on (Params.Extensions) only when both sides offer them: a
	// responder answers with its block only to a request that carried one,
	// and neither application sees the blocks. A peer that does not speak
	// them (siw, rdma-core's tools) never receives one, and posting one
	// toward it fails at once with ErrNotSupported. Leave it off toward
	// such peers when connecting: their applications would see the
	// initiator's block at the end of the private data.
	Extensions bool
	// SharedMemory asks for a same-host shared-memory link (see
	// docs/shm.md): between two gowarp peers on one host, RDMA traffic
	// then moves through a ring per direction in a file both map, at
	// memory speed, instead of through the loopback TCP stack. Connect
	// offers it, in a 64-byte block at the end of the MPA private data
	// (PrivateData may then be 64 bytes shorter), only where the peer's
	// address is this host's (loopback or a local address) and only over
	// a TCP connection; Accept takes an offer only when its options set
	// it too. Neither application sees the blocks, and any other peer
	// (siw, rdma-core's tools) gets the TCP stream as without it. The TCP
	// connection stays open beside the rings: a peer that closes or dies
	// ends the queue pair through it, as over TCP. QP.Transport says
	// which link a queue pair got.
	SharedMemory bool
	// SharedMemoryRing is the bytes of each direction's ring that Connect
	// offers (the responder follows): 0 means 1 MiB; others are rounded
	// up to a power of two from 64 KiB to 64 MiB.
	SharedMemoryRing int
	// Tenant names the STag table of the responder this connection is
	// for (Device.Table(TenantIdentity(name)) there): the peer's STags are
	// looked up in that table only. 1 to MaxTenantLen bytes of printable
	// ASCII without spaces (ErrBadTenant). It travels in a block at the end
	// of the private data, as Extensions does (PrivateData may be shorter
	// by len(Tenant)+5); the responder confirms it, and Connect fails with
	// ErrTenantRefused if it does not (a peer that knows no tenants). Only
	// an initiator sets it; Accept ignores it.
	Tenant string

	// BusyPoll, when not zero, makes the queue pair's receive path, on
	// finding its TCP socket empty, read it again for up to this long
	// (yielding the processor between reads) before it sleeps, while the
	// host's CPUs are not all busy (/proc/loadavg's running threads at
	// most twice the CPUs): latency falls and CPU per operation rises.
	// A sleeping reader's next bytes wait for its thread's wake-up, and on
	// a VM for a halted virtual CPU's, which took 1-4 ms at times here.
	// DefaultBusyPoll (100 µs) is what the cache asks for: its 4 KiB
	// ReadAt at 4 in flight had a p50 of 17-31 µs with it, 63-85 µs
	// without. The cost is CPU on waits the peer does not end within it:
	// 8 connections each pinged once a millisecond cost 85 µs of CPU per
	// ping with it, 29 µs without. The shared-memory link always spins.
	BusyPoll time.Duration
}

// DefaultBusyPoll is ConnectOptions.BusyPoll as the cache sets it.
const DefaultBusyPoll = engine.DefaultBusyPoll

// DefaultLinkTimeout is the LinkTimeout of ConnectOptions' zero value.
const DefaultLinkTimeout = cm.DefaultLinkTimeout

// NoLinkTimeout as ConnectOptions.LinkTimeout sets no bound of gowarp's on
// a silent peer: the system's TCP settings decide.
const NoLinkTimeout time.Duration = -1

// NoReads as ConnectOptions.IRD or ORD asks for none, which the zero value
// cannot say (it means the default, 16): IRD 0 serves no RDMA Reads from
// the peer, ORD 0 issues none, as perftest's and most rdma_cm clients
// that do not read ask. MPA revision 2 carries the 0 to the peer (RFC
// 6581); on an ORD 0 connection PostSend refuses a Read with ErrZeroORD,
// and a peer's Read Request arriving at IRD 0 is answered with a
// Terminate (RDMAP remote operation error, wire.ErrRDMAPStream). A peer
// whose reply asks to read from a connection that said IRD NoReads fails
// Connect with ErrInsufficientIRD. QP.Params reports what was settled.
const NoReads = -1

// Connect connects an idle queue pair to a listening peer at addr
// (host:port): TCP, then MPA, then the QP is ready. A Close while it is
// under way makes it fail with ErrClosed. When the device's topology has
// a direct link to addr's IP, the queue pair is placed on that adapter
// and dials from it (see Device.Place and QP.Adapter). Options no peer
// could accept (ErrPrivateDataLong, ErrMPARevision, a bad tenant name),
// and a ctx already done, fail before the dial and leave the queue pair
// idle. Any later failure (a dial refused or unresolved, a rejection, a
// ctx done meanwhile) leaves it in StateError, as a failed connection
// leaves a verbs queue pair: to try again, make a new one, and Close this
// one, which until then still counts among its completion queues' queue
// pairs (a CQ.Wait receives inline only on a queue's single queue pair).
func (qp *QP) Connect(ctx context.Context, addr string, o ConnectOptions) error {
	// Options no peer could accept fail before the dial, and leave the
	// queue pair idle for a Connect with others.
	if err := engine.CheckConnect((*engine.ConnectOptions)(&o)); err != nil {
		return connErr(err)
	}
	// So does a context already done (the engine's connecting says so
	// too, but the paths that dial from an address or adapter dial
	// first, and a failed dial closes the queue pair).
	if err := ctx.Err(); err != nil {
		return err
	}
	if from := qp.table().id.addr; from.IsValid() {
		// Bound to a local address: the connection leaves from it.
		return qp.connectFrom(ctx, addr, from, o)
	}
	if a, ap := qp.placement(addr); a != nil {
		return qp.connectVia(ctx, a, ap, o) // adapter.go
	}
	return connErr(qp.q.Connect(ctx, addr, engine.ConnectOptions(o)))
}

// ConnectConn connects an idle queue pair over c, a connection the caller
// has opened to a listening peer (a TCP connection from a dialer of its
// own, a *tls.Conn, any stream): MPA, then the QP is ready, as Connect
// after its dial. The queue pair owns c from the call on: it closes c when
// it closes, and at once if the MPA exchange fails or ctx is already done
// (the queue pair then stays idle). A peer that does not
// speak MPA fails it with ErrMPAProtocol; one that says nothing, when ctx
// ends (or after 10 s if ctx has no deadline). Over a stream other than
// TCP, Acked completes as Handed, FPDUs are not aligned to segments, and
// the queue pair's transmit goroutine does every write (a net.Conn has no
// write that returns when the stream is full). ConnectOptions.LinkTimeout
// is set on the TCP socket under c: a *net.TCPConn, one that a NetConn
// method leads to (a *tls.Conn), or a descriptor a SyscallConn method
// exposes. A stream with no socket of its own (net.Pipe, a multiplexed
// stream) gets no bound from gowarp: its own failure detection, or a
// Close, must end a queue pair whose peer went silent.
func (qp *QP) ConnectConn(ctx context.Context, c net.Conn, o ConnectOptions) error {
	if c == nil {
		return fmt.Errorf("%w: ConnectConn with no connection", ErrBadConfig)
	}
	if err := qp.checkLocal(c); err != nil {
		c.Close()
		return err
	}
	return connErr(qp.q.ConnectConn(ctx, c, engine.ConnectOptions(o)))
}

// Listener accepts iWARP connections. Each incoming connection's MPA
// request is read on its own goroutine, so a peer that connects and stays
// silent holds up nobody; a peer that sends no valid MPA request within 5
// seconds is dropped and logged.
type Listener struct {
	l     *cm.Listener
	dev   *Device
	table *Table // the table its connections reach; nil: by identity (see ConnRequest.Table)
}

// Listen listens for connections on addr (host:port).
func (d *Device) Listen(addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return d.ListenOn(ln)
}

// ListenOn accepts iWARP connections on ln, a listener the caller has
// opened: a TCP listener in another network namespace, a tls.Listener, a
// Unix socket's. The Listener owns ln from then on, and Close closes it.
func (d *Device) ListenOn(ln net.Listener) (*Listener, error) {
	if ln == nil {
		return nil, fmt.Errorf("%w: ListenOn with no listener", ErrBadConfig)
	}
	return &Listener{l: cm.Listen(ln, d.log), dev: d}, nil
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.l.Addr() }

// Close stops listening; requests not yet accepted are dropped.
func (l *Listener) Close() error { return l.l.Close() }

// Accept waits for the next connection request, until ctx is done or the
// listener is closed (net.ErrClosed). A connecting peer that sends no
// valid MPA request is dropped and logged: a misbehaving client never
// stops a listener.
func (l *Listener) Accept(ctx context.Context) (*ConnRequest, error) {
	r, err := l.l.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &ConnRequest{r: r, ln: l}, nil
}

// ReadConnRequest reads the MPA request a connecting peer sends on c, a
// connection the caller accepted itself (from a listener gowarp does not
// own, one end of a socket pair, an in-memory pipe): the passive side of
// ConnectConn, one connection at a time. The request owns c from the call
// on: Accept hands it to a queue pair, Reject closes it, and so does a
// failure here. A peer that sends no valid MPA request fails it with
// ErrMPAProtocol (ErrMarkers, ErrMPARevision), one that closes with
// io.ErrUnexpectedEOF, a silent one when ctx ends (5 s without a
// deadline).
func ReadConnRequest(ctx context.Context, c net.Conn) (*ConnRequest, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: ReadConnRequest with no connection", ErrBadConfig)
	}
	r, err := cm.ReadRequest(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("gowarp: connection request from %v: %w", c.RemoteAddr(), err)
	}
	return &ConnRequest{r: r}, nil
}

// ConnRequest is an incoming connection waiting to be accepted or rejected.
// Answer every one: a request dropped unanswered holds its connection open
// until the garbage collector finds it, and the peer's Connect waits for
// its reply until its context ends.
type ConnRequest struct {
	r  *cm.Request
	ln *Listener // nil for ReadConnRequest's
}

// PrivateData returns the private data the connecting peer sent.
func (r *ConnRequest) PrivateData() []byte { return r.r.PrivateData() }

// ReadLimits returns the IRD and ORD the connecting peer asked for in its
// MPA revision 2 request (rdma_cm's responder_resources and
// initiator_depth); ok is false for a revision 1 request, which carries
// none.
func (r *ConnRequest) ReadLimits() (ird, ord int, ok bool) { return r.r.ReadLimits() }

// OffersExtensions reports whether the connecting peer offered RFC 7306's
// extensions (ConnectOptions.Extensions); accept with Extensions set to
// turn them on.
func (r *ConnRequest) OffersExtensions() bool { return r.r.OffersExt() }

// OffersSharedMemory reports whether the connecting peer offered a
// shared-memory link (ConnectOptions.SharedMemory); accept with
// SharedMemory set to take it.
func (r *ConnRequest) OffersSharedMemory() bool { return r.r.OffersShm() }

// RemoteAddr returns the connecting peer's address.
func (r *ConnRequest) RemoteAddr() net.Addr { return r.r.Conn().RemoteAddr() }

// Accept accepts the request on qp, an idle queue pair, sending the reply.
// With ctx already done it sends nothing: it closes the request's
// connection (the peer's Connect fails), leaves qp idle and returns ctx's
// error.
func (r *ConnRequest) Accept(ctx context.Context, qp *QP, o ConnectOptions) error {
	if err := r.checkTable(qp); err != nil {
		return err
	}
	a := qp.acceptedOn(r.r.Conn().LocalAddr()) // adapter.go
	if a != nil && a.Kind() == AdapterSharedMemory {
		o.SharedMemory = true
	}
	err := connErr(qp.q.Accept(ctx, r.r, engine.ConnectOptions(o)))
	if err == nil {
		qp.setAdapter(a)
	}
	return err
}

// Reject refuses the request, sending private data with the rejection,
// and closes its connection.
func (r *ConnRequest) Reject(privateData []byte) error { return r.r.Reject(privateData) }
