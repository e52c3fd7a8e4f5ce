// Package cm is gowarp's MPA connection setup (RFC 5044 §7.1, RFC 6581):
// the request/reply exchange on a fresh TCP connection that settles CRC,
// IRD/ORD, the ready-to-receive message and the private data, before the
// connection carries FPDUs.
package cm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/gowarp/gowarp/wire"
)

// Errors of connection setup.
var (
	ErrRejected        = errors.New("gowarp: connection rejected by peer")
	ErrMarkers         = errors.New("gowarp: peer wants MPA markers, which gowarp does not support")
	ErrRevision        = errors.New("gowarp: unsupported MPA revision")
	ErrProtocol        = errors.New("gowarp: MPA protocol error")
	ErrPrivateDataLong = errors.New("gowarp: private data too long")
	ErrInsufficientIRD = errors.New("gowarp: peer's IRD/ORD cannot be met")
)

// RejectedError is returned when the peer rejects a connection; it carries
// the peer's private data and matches ErrRejected.
type RejectedError struct{ PrivateData []byte }

func (e *RejectedError) Error() string {
	return fmt.Sprintf("gowarp: connection rejected by peer (%d bytes of private data)", len(e.PrivateData))
}
func (e *RejectedError) Is(t error) bool { return t == ErrRejected }

// MaxIRDORD is the most inbound or outbound Reads a gowarp connection
// allows outstanding (siw's limit too).
const MaxIRDORD = 128

// Options are one side's wishes.
type Options struct {
	Revision int  // 1 or 2 (default 2)
	CRC      bool // ask for CRC; the peer may ask too, then it is on
	// IRD and ORD are the inbound and outbound Read limits: 0 for the
	// default 16, negative for none (RFC 6581 IRD/ORD 0).
	IRD, ORD    int
	PrivateData []byte
	// NoP2P keeps an initiator from offering peer-to-peer mode: without
	// it the initiator must send the first FPDU, as rping and perftest do.
	NoP2P bool
	// Ext offers RFC 7306's extensions (see ext.go): an initiator adds
	// its offer to the request, a responder answers one it received.
	Ext bool
	// Tenant names the responder's STag table the connection is for (see
	// tenant.go); an initiator sends it, a responder echoes the request's.
	Tenant string
	// LinkTimeout bounds how long the peer may go unheard, from the MPA
	// exchange on (see SetLinkTimeout): 0 for DefaultLinkTimeout, negative
	// for no bound of gowarp's.
	LinkTimeout time.Duration
	// Shm offers a same-host shared-memory link (see shm.go): an
	// initiator to a peer on this host adds its offer, a responder takes
	// one it received. ShmRing is the bytes of each direction's ring an
	// initiator offers (0: ShmDefaultRing).
	Shm     bool
	ShmRing int
}

func (o *Options) defaults() {
	if o.Revision == 0 {
		o.Revision = 2
	}
	if o.IRD == 0 {
		o.IRD = 16
	}
	if o.ORD == 0 {
		o.ORD = 16
	}
	o.IRD, o.ORD = min(o.IRD, MaxIRDORD), min(o.ORD, MaxIRDORD)
}

// ird and ord are the limits as numbers, none being 0.
func (o *Options) ird() int { return max(o.IRD, 0) }
func (o *Options) ord() int { return max(o.ORD, 0) }

// Check reports what is wrong with o, as Initiate would, without a
// connection: a caller checks before it dials.
func Check(o Options) error {
	o.defaults()
	return o.check()
}

func (o *Options) check() error {
	if o.Revision != 1 && o.Revision != 2 {
		return fmt.Errorf("%w: %d", ErrRevision, o.Revision)
	}
	max := wire.MaxMPAPrivateData
	if o.Revision == 2 {
		max -= 4
	}
	if o.Tenant != "" {
		if err := CheckTenant(o.Tenant); err != nil {
			return err
		}
	}
	b := blocks{tenant: o.Tenant, ext: o.Ext}
	if o.Shm {
		b.shm = &shmBlock{} // its size: the offer and the answer have one
	}
	max -= b.len()
	if len(o.PrivateData) > max {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrPrivateDataLong, len(o.PrivateData), max)
	}
	return nil
}

// Result is what negotiation settled, from this side's point of view.
type Result struct {
	Revision    int
	CRC         bool
	IRD, ORD    int
	SendRTR     wire.RTR // the RTR this side must send first (initiator)
	HoldTx      bool     // send nothing before the peer's first FPDU (responder)
	PrivateData []byte   // the peer's
	// Ext: both sides offered RFC 7306's extensions, which may then be
	// sent and are taken; without it neither is.
	Ext bool
	// Shm is the shared-memory link both sides took, nil for none; the
	// caller owns it (and must Unmap it if it does not use it). ShmErr
	// says why an offer made or received was not taken, if it was not.
	Shm    *SharedMemory
	ShmErr error
}

// replyTimeout bounds the exchange of an initiator or of an accepting
// responder (siw waits 10 s for a reply) where ctx sets no deadline; a
// request on an accepted connection has RequestTimeout.
const replyTimeout = 10 * time.Second

// deadline puts ctx's deadline, or def from now, on c until the returned
// func is called; ctx's end fires it at once.
func deadline(ctx context.Context, c net.Conn, def time.Duration) func() {
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(def)
	}
	c.SetDeadline(d)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	return func() {
		stop()
		c.SetDeadline(time.Time{})
	}
}

// readFrame reads exactly one MPA request or reply, no byte more: what
// follows belongs to the FPDU stream.
func readFrame(c net.Conn) (wire.MPAFrame, error) {
	var hdr [wire.MPAHeaderLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return wire.MPAFrame{}, err
	}
	n, err := wire.MPAFrameLen(hdr[:])
	if err != nil {
		return wire.MPAFrame{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	b := make([]byte, n)
	copy(b, hdr[:])
	if _, err := io.ReadFull(c, b[wire.MPAHeaderLen:]); err != nil {
		return wire.MPAFrame{}, err
	}
	f, _, err := wire.ParseMPAFrame(b)
	if err != nil {
		return wire.MPAFrame{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return f, nil
}

func writeFrame(c net.Conn, f *wire.MPAFrame) error {
	b, err := f.Append(nil)
	if err != nil {
		return err
	}
	_, err = c.Write(b)
	return err
}

// Initiate runs the initiator's side on a connected socket: it sends the
// request and reads the reply.
func Initiate(ctx context.Context, c net.Conn, o Options) (res Result, err error) {
	o.defaults()
	if err := o.check(); err != nil {
		return Result{}, err
	}
	// Best effort: a stream with no TCP socket under it has no such bound.
	_ = SetLinkTimeout(c, o.LinkTimeout)
	defer deadline(ctx, c, replyTimeout)()
	sent := blocks{tenant: o.Tenant, ext: o.Ext}
	offer, shmErr := offerShm(c, &o)
	if offer != nil {
		sent.shm = &offer.blk
		defer func() {
			if res.Shm == nil {
				offer.discard()
			}
		}()
	}
	req := wire.MPAFrame{CRC: o.CRC, Revision: uint8(o.Revision), PrivateData: sent.appendTo(o.PrivateData)}
	if o.Revision == 2 {
		req.Enhanced = true
		req.IRD, req.ORD = uint16(o.ird()), uint16(o.ord())
		if !o.NoP2P {
			req.P2P, req.RTR = true, wire.RTRWrite
			if o.ord() > 0 {
				// A Read RTR is a zero-length Read: it needs an ORQ slot.
				req.RTR |= wire.RTRRead
			}
		}
	}
	if err := writeFrame(c, &req); err != nil {
		return Result{}, ctxErr(ctx, err)
	}
	rep, err := readFrame(c)
	if offer != nil {
		offer.unlink() // mapped by both sides, or never to be
	}
	if err != nil {
		return Result{}, ctxErr(ctx, err)
	}
	switch {
	case !rep.Reply:
		return Result{}, fmt.Errorf("%w: a request where the reply was due", ErrProtocol)
	case rep.Reject:
		return Result{}, &RejectedError{PrivateData: rep.PrivateData}
	case rep.Markers:
		return Result{}, ErrMarkers
	case int(rep.Revision) != o.Revision:
		return Result{}, fmt.Errorf("%w: asked for revision %d, reply has %d", ErrRevision, o.Revision, rep.Revision)
	case o.Revision == 2 && !rep.Enhanced:
		return Result{}, fmt.Errorf("%w: revision 2 reply without IRD/ORD", ErrProtocol)
	}
	r := Result{Revision: o.Revision, CRC: o.CRC || rep.CRC, IRD: o.ird(), ORD: o.ord(), PrivateData: rep.PrivateData, ShmErr: shmErr}
	var shm *SharedMemory
	if offer != nil {
		// Taken only by a responder that wrote its token into our file.
		r.PrivateData, shm, r.ShmErr = answerShm(r.PrivateData, offer)
	}
	// Only a responder that saw a block answers it.
	pd, got, err := cutBlocks(r.PrivateData, o.Tenant != "", o.Ext, false)
	if o.Tenant != "" && (err != nil || got.tenant != o.Tenant) {
		return Result{}, fmt.Errorf("%w: asked for %q, reply confirms %q", ErrTenantRefused, o.Tenant, got.tenant)
	}
	r.PrivateData, r.Ext = pd, got.ext
	if rep.Enhanced {
		// The responder's ORD is how many Reads it may send us: our IRD
		// must cover it, lifted if need be (siw's relaxed rule), unless
		// we asked for none. Its IRD caps our ORD.
		switch {
		case int(rep.ORD) > MaxIRDORD:
			terminate(c, r.CRC, wire.ErrMPAInsufficientIRD)
			return Result{}, fmt.Errorf("%w: responder ORD %d exceeds %d", ErrInsufficientIRD, rep.ORD, MaxIRDORD)
		case o.IRD < 0 && rep.ORD > 0:
			terminate(c, r.CRC, wire.ErrMPAInsufficientIRD)
			return Result{}, fmt.Errorf("%w: responder ORD %d, and we take no Reads (IRD 0)", ErrInsufficientIRD, rep.ORD)
		}
		r.IRD = max(r.IRD, int(rep.ORD))
		r.ORD = min(r.ORD, int(rep.IRD))
		if req.P2P && rep.P2P {
			switch {
			case rep.RTR&req.RTR&wire.RTRWrite != 0:
				r.SendRTR = wire.RTRWrite
			case rep.RTR&req.RTR&wire.RTRRead != 0 && r.ORD > 0:
				r.SendRTR = wire.RTRRead
			default:
				terminate(c, r.CRC, wire.ErrMPANoMatchingRTR)
				return Result{}, fmt.Errorf("%w: peer-to-peer reply chose no RTR we offered (%v)", ErrProtocol, rep.RTR)
			}
		}
	}
	r.Shm = shm
	return r, nil
}

// terminate sends, best effort, the Terminate RFC 6581 §3 asks of an
// initiator that cannot go on with the reply it read (insufficient IRD,
// no matching RTR), as siw does, so that the responder learns why before
// the connection closes.
func terminate(c net.Conn, crc bool, e *wire.TermError) {
	t := wire.NewTerminate(e, nil, 0, nil)
	h := wire.Header{Opcode: wire.OpTerminate, Last: true, DDPVersion: wire.DDPVersion,
		RDMAPVersion: wire.RDMAPVersion, QN: wire.QNTerminate, MSN: 1}
	b, err := wire.AppendFPDU(nil, t.Append(h.Append(nil)), crc)
	if err != nil {
		return
	}
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write(b)
}

// Request is a connection request read by a responder.
type Request struct {
	c     net.Conn
	Frame wire.MPAFrame // its private data without the offer block
	// ext: the initiator offered RFC 7306's extensions.
	ext bool
	// shm is the initiator's shared-memory offer, if it made one, and
	// shmErr why it is refused at once (malformed).
	shm    *shmBlock
	shmErr error
	// tenant is the tenant name the initiator gave, "" for none.
	tenant string
}

// Tenant returns the tenant name the initiator gave, "" for none.
func (r *Request) Tenant() string { return r.tenant }

// OffersExt reports whether the initiator offered RFC 7306's extensions.
func (r *Request) OffersExt() bool { return r.ext }

// PrivateData returns the initiator's private data.
func (r *Request) PrivateData() []byte { return r.Frame.PrivateData }

// Conn returns the connection the request came on.
func (r *Request) Conn() net.Conn { return r.c }

// ReadLimits returns the IRD and ORD the initiator asked for in its MPA
// revision 2 request; ok is false for a revision 1 request, which carries
// none.
func (r *Request) ReadLimits() (ird, ord int, ok bool) {
	f := &r.Frame
	if f.Revision != 2 || !f.Enhanced {
		return 0, 0, false
	}
	return int(f.IRD), int(f.ORD), true
}

// ReadRequest reads the initiator's request on an accepted socket,
// waiting RequestTimeout where ctx sets no deadline. A request gowarp
// cannot serve (markers, unknown revision) is rejected here and reported
// as an error; on any error c is closed.
func ReadRequest(ctx context.Context, c net.Conn) (*Request, error) {
	SetNoDelay(c)
	req, err := readRequest(ctx, c)
	if err != nil {
		c.Close()
	}
	return req, err
}

func readRequest(ctx context.Context, c net.Conn) (*Request, error) {
	stop := deadline(ctx, c, RequestTimeout)
	f, err := readFrame(c)
	stop()
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if f.Reply {
		return nil, fmt.Errorf("%w: a reply where the request was due", ErrProtocol)
	}
	req := &Request{c: c, Frame: f}
	pd, got, err := cutBlocks(f.PrivateData, true, true, true)
	if err != nil {
		req.reject(nil, f.Revision)
		return nil, err
	}
	req.Frame.PrivateData, req.ext, req.shm, req.shmErr, req.tenant = pd, got.ext, got.shm, got.shmErr, got.tenant
	switch {
	case f.Markers:
		req.reject(nil, f.Revision)
		return nil, ErrMarkers
	case f.Revision != 1 && f.Revision != 2:
		return nil, fmt.Errorf("%w: request has revision %d", ErrRevision, f.Revision)
	}
	return req, nil
}

// Accept answers the request with a reply and returns what was settled.
func (r *Request) Accept(ctx context.Context, o Options) (Result, error) {
	o.Revision = int(r.Frame.Revision)
	o.Ext = o.Ext && r.ext // no block for an initiator that offered none
	o.Shm = o.Shm && r.shm != nil
	o.Tenant = r.tenant // echoed: the initiator waits for its confirmation
	o.defaults()
	if err := o.check(); err != nil {
		return Result{}, err
	}
	_ = SetLinkTimeout(r.c, o.LinkTimeout) // best effort, as in Initiate
	defer deadline(ctx, r.c, replyTimeout)()
	f := &r.Frame
	res := Result{Revision: o.Revision, CRC: o.CRC || f.CRC, IRD: o.ird(), ORD: o.ord(), HoldTx: true, PrivateData: f.PrivateData}
	// Each block only to an initiator that sent one: it may not know them.
	ans := blocks{tenant: r.tenant, ext: o.Ext && r.ext}
	res.Ext = ans.ext
	if o.Shm {
		res.Shm, ans.shm, res.ShmErr = r.takeShm()
	}
	rep := wire.MPAFrame{Reply: true, CRC: res.CRC, Revision: f.Revision, PrivateData: ans.appendTo(o.PrivateData)}
	if f.Enhanced && f.Revision == 2 {
		// siw's relaxed rule: our ORD is capped by the initiator's IRD, and
		// our IRD lifted to its ORD, unless we take no Reads at all: then
		// the reply's IRD 0 caps the initiator's ORD (RFC 6581), and a
		// Read it sends anyway meets a Terminate.
		res.ORD = min(res.ORD, int(f.IRD))
		if o.IRD >= 0 {
			res.IRD = min(max(res.IRD, int(f.ORD)), MaxIRDORD)
		}
		rep.Enhanced = true
		rep.IRD, rep.ORD = uint16(res.IRD), uint16(res.ORD)
		if f.P2P {
			switch {
			case f.RTR&wire.RTRWrite != 0:
				rep.P2P, rep.RTR = true, wire.RTRWrite
			case f.RTR&wire.RTRRead != 0 && res.IRD > 0: // the RTR's Read takes an IRQ slot
				rep.P2P, rep.RTR = true, wire.RTRRead
			}
		}
	}
	if err := writeFrame(r.c, &rep); err != nil {
		res.Shm.Unmap()
		return Result{}, ctxErr(ctx, err)
	}
	return res, nil
}

// Reject answers the request with a rejection carrying private data and
// closes the connection.
func (r *Request) Reject(privateData []byte) error {
	if len(privateData) > wire.MaxMPAPrivateData-4 {
		return errors.Join(fmt.Errorf("%w: %d bytes", ErrPrivateDataLong, len(privateData)), r.c.Close())
	}
	return errors.Join(r.reject(privateData, r.Frame.Revision), r.c.Close())
}

func (r *Request) reject(pd []byte, rev uint8) error {
	rep := wire.MPAFrame{Reply: true, Reject: true, Revision: rev, PrivateData: pd}
	if r.Frame.Enhanced && rev == 2 {
		rep.Enhanced = true
	}
	r.c.SetWriteDeadline(time.Now().Add(replyTimeout))
	return writeFrame(r.c, &rep)
}

// ctxErr says why an MPA exchange failed: ctx's end, which also fires
// the socket's deadline (the socket's timeout may come first, before
// ctx.Err is set: it is ctx's deadline all the same), or the default
// timeout, or the peer.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if d, ok := ctx.Deadline(); ok {
			if !time.Now().Before(d) {
				return fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
			}
		} else {
			return fmt.Errorf("MPA exchange timed out: %w", err)
		}
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("peer closed the connection during the MPA exchange: %w", io.ErrUnexpectedEOF)
	}
	return err
}
