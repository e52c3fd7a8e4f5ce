package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

const (
	// rxStaging is the receive staging buffer: headers, trailers and small
	// payloads land here; larger payload is read straight into place.
	rxStaging = 64 << 10
	// directMin is the payload remainder from which the receive path reads
	// straight into the target memory instead of through the staging buffer.
	directMin = 2048
	// maxHead is the longest DDP/RDMAP header plus body the parser needs
	// at once: an untagged header and a Read Request body.
	maxHead = wire.UntaggedHeaderLen + wire.ReadRequestLen
	// inlineResponse is the largest Read Response the receive goroutine
	// transmits itself (saving a wake-up of the transmit goroutine).
	inlineResponse = 64 << 10
	// maxTerminate bounds a received Terminate's ULPDU.
	maxTerminate = 1024
)

// rxState is the receive path's state, owned by the receive goroutine.
type rxState struct {
	q    *QP
	buf  []byte
	r, w int
	crc  bool

	iov  [][]byte // scratch for a direct read
	dst  [][]byte // destination pieces of the current payload
	head [maxHead]byte
	hlen int // bytes of head in use
	ulen int // ULPDU length of the current FPDU

	// held are the regions dst lies in, each with a hold taken for the
	// placement (see mem.Region.TryHold), so that a Deregister waits for
	// it; nheld are in use.
	held  [MaxSGE]*mem.Region
	nheld int

	msn [3]uint32 // next expected MSN per queue number

	dl time.Time // the read deadline the holder of the path last set

	// The receive being filled by a Send: a copy of the WQE (a flush may
	// clear the ring entry meanwhile), its index in the ring, progress and
	// outcome.
	recv       *rqEntry
	recvWQE    rqEntry
	recvIdx    uint64
	recvBytes  int
	recvMSN    uint32
	recvStatus Status
}

func (r *rxState) init(q *QP) {
	r.q, r.crc = q, q.params.CRC
	r.buf = make([]byte, rxStaging)
	r.iov = make([][]byte, 0, 2*MaxSGE+2)
	r.dst = make([][]byte, 0, 2*MaxSGE)
	r.msn = [3]uint32{1, 1, 1}
}

// fault is an error the receive path found in peer input: the Terminate
// it calls for, and the status of the local receive it hits, if any.
type fault struct {
	term   *wire.TermError
	status Status
	detail string
}

func (f *fault) Error() string {
	if f.detail != "" {
		return f.term.Error() + " (" + f.detail + ")"
	}
	return f.term.Error()
}

func (f *fault) Unwrap() error { return f.term }

func newFault(t *wire.TermError, format string, args ...any) *fault {
	return &fault{term: t, detail: fmt.Sprintf(format, args...)}
}

// peerTerminate is a Terminate received from the peer.
type peerTerminate struct{ t wire.Terminate }

func (p *peerTerminate) Error() string { return p.t.Err.Error() }
func (p *peerTerminate) Unwrap() error { return &p.t.Err }

// rxLoop is the receive goroutine. It holds the receive path (rxMu) and
// blocks on the socket, except while an application goroutine waiting for
// this QP's completions receives on it itself (see receiveInline); it takes
// the path back when the watcher hands it over, the application having
// left it idle for rxReclaim (see reclaim.go).
func (q *QP) rxLoop() {
	defer q.wg.Done()
	for {
		if q.State() == StateError {
			return
		}
		if q.rxMu.TryLock() {
			err := q.rx.background()
			if !errors.Is(err, errRxYield) {
				if testHookRxFail != nil {
					testHookRxFail()
				}
				// Still holding the path: an inline receiver must not read
				// past the bad FPDU, nor over the header the Terminate echoes.
				q.rxFailed(err)
				q.rxMu.Unlock()
				return
			}
			q.rxMu.Unlock()
			select {
			case q.rxFree <- struct{}{}:
			default:
			}
			// The waiter that asked may not come (its completion came
			// first): the watcher hands the path back if none does.
			waitWatcher.watch(q)
		} // else a waiter holds it, and will hand it back as it leaves
		select {
		case <-q.rxHand:
			q.rxWakes.Add(1)
		case <-q.done:
			return
		}
	}
}

// testHookRxFail, when set by a test before a queue pair starts, runs in
// the receive goroutine between a failed read and its handling.
var testHookRxFail func()

// errRxYield reports the read-deadline doorbell at an FPDU boundary: the
// receive goroutine is asked to yield, or an inline receiver to look up.
var errRxYield = errors.New("engine: receive path yielded")

// background runs the receive path until asked to yield or until it fails.
func (r *rxState) background() error {
	q := r.q
	for {
		if q.rxYield.Load() {
			r.yielded()
			return errRxYield
		}
		err := r.fpdu()
		if errors.Is(err, errRxYield) {
			if q.rxYield.Load() {
				r.yielded()
				return err
			}
			q.bell.Store(false)
			q.rearm() // a stale doorbell
			continue
		}
		if err != nil {
			return err
		}
		select {
		case q.rxTick <- struct{}{}:
		default:
		}
	}
}

func (r *rxState) yielded() {
	r.q.rxYield.Store(false)
	r.q.bell.Store(false)
	r.q.rearm()
}

// rxFailed acts on the error that ended the receive path.
func (q *QP) rxFailed(err error) {
	var f *fault
	var pt *peerTerminate
	switch {
	case errors.As(err, &f):
		q.log.Debug("gowarp: protocol error in peer input", "err", err)
		q.mu.Lock()
		if f.status != Success && q.rx.recv != nil {
			q.rx.recvStatus = f.status
		}
		q.mu.Unlock()
		q.failTerm(fmt.Errorf("%w: %w", ErrTerminated, err), f.term, q.rx.head[:q.rx.hlen], q.rx.ulen)
	case errors.As(err, &pt):
		q.log.Debug("gowarp: peer sent Terminate", "err", err)
		q.peerTerminated(pt)
	case errors.Is(err, io.EOF):
		q.fail(ErrPeerClosed)
	case errors.Is(err, net.ErrClosed):
		q.fail(ErrClosed)
	default:
		q.fail(fmt.Errorf("%w: %w", ErrLinkLost, err))
	}
}

// receiveInline runs the receive path on the calling goroutine, blocking
// on the socket, until done reports true or ctx is done. It is how a
// goroutine waiting for this QP receives with no hand-off from the receive
// goroutine: the latency of a plain TCP reader. It reports false, having
// asked the receive goroutine to yield, when that goroutine holds the path;
// the caller then waits on rxFree. The read blocks in the netpoller with
// no deadline; the doorbell (ring) wakes it for a completion from
// elsewhere, and the watcher rings it when a cancellable ctx is done
// (noticed within ctxPoll), so a wait costs no clock reading, deadline or
// allocation.
func (q *QP) receiveInline(ctx context.Context, cq *CQ, done func() bool) bool {
	if s := q.State(); s != StateReady && s != StateClosing {
		return false
	}
	if !q.rxMu.TryLock() {
		q.rxYield.Store(true)
		q.ring()
		return false
	}
	q.rxInline.Store(true)
	if cq != nil {
		cq.setInline(q)
	}
	if d := ctx.Done(); d != nil {
		q.waitMu.Lock()
		q.waitDone = d
		q.waitMu.Unlock()
		waitWatcher.watch(q)
	}
	r := &q.rx
	var failed error
	// ctx is looked at when the doorbell stops the read, not after every
	// FPDU: its Err takes a lock.
	for live := ctx.Err() == nil; live && !done(); {
		if s := q.State(); s != StateReady && s != StateClosing {
			break
		}
		err := r.fpdu()
		if errors.Is(err, errRxYield) {
			// The doorbell: a completion came from elsewhere, or ctx is
			// done. Look again.
			q.bell.Store(false)
			q.rearm()
			live = ctx.Err() == nil
			continue
		}
		if err != nil {
			failed = err
			break
		}
	}
	if cq != nil {
		cq.setInline(nil)
	}
	if ctx.Done() != nil {
		q.waitMu.Lock()
		q.waitDone = nil // the watcher rings no one for this ctx from now on
		q.waitMu.Unlock()
	}
	if failed != nil {
		q.rxFailed(failed) // holding the path, as in rxLoop
	}
	q.rxInline.Store(false)
	q.rxAppGen.Add(1)
	q.rxMu.Unlock()
	waitWatcher.watch(q) // the receive goroutine takes the path back if this waiter does not return
	return true
}

// Progress blocks until the queue pair has received at least one FPDU
// (placed a peer's Write, answered a Read, completed a receive…) or ctx is
// done, running the receive path on the calling goroutine when it can: the
// way to wait for one-sided Writes with the least latency, watching
// MR.Placed between calls.
func (q *QP) Progress(ctx context.Context) error {
	for {
		if s := q.State(); s != StateReady && s != StateClosing {
			if err := q.Err(); err != nil {
				return err
			}
			return ErrNotReady
		}
		n := 0
		if q.receiveInline(ctx, nil, func() bool { n++; return n > 1 }) {
			return ctx.Err()
		}
		select {
		case <-q.rxFree:
		case <-q.failed: // the receive goroutine failed instead of yielding
		case <-q.rxTick:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// peerTerminated puts the queue pair in error for a received Terminate.
// The send-queue entry the Terminate's echoed header names, if still
// outstanding, completes with the matching remote error status.
func (q *QP) peerTerminated(pt *peerTerminate) {
	st := statusFor(&pt.t.Err)
	q.mu.Lock()
	if h, ok := pt.t.DDPHeader(); ok {
		var rr *wire.ReadRequest
		if body, ok := pt.t.ReadRequest(); ok {
			rr = &body
		}
		for i := q.sqHead; i < q.sqTx; i++ {
			e := &q.sq[i%uint64(len(q.sq))]
			if !e.done && echoes(e, &h, rr) {
				e.status = st
				break
			}
		}
	}
	q.mu.Unlock()
	q.fail(fmt.Errorf("%w: %w", ErrPeerTerminated, pt))
}

// echoes reports whether h, with rr the echoed Read Request body if any,
// is the header of a message e sent.
func echoes(e *sqEntry, h *wire.Header, rr *wire.ReadRequest) bool {
	switch e.wr.Op {
	case OpWrite:
		return h.Opcode == wire.OpWrite && h.STag == e.wr.RKey && h.TO >= e.wr.RemoteAddr && h.TO <= e.wr.RemoteAddr+uint64(e.length)
	case OpRead:
		if h.Opcode != wire.OpReadRequest {
			return false
		}
		if rr != nil {
			// The body names the Read's source. siw, when it finds the
			// error while building the response, rebuilds the echo from
			// its queue and puts the read size where the MSN belongs
			// (siw_send_terminate), so the MSN cannot be trusted then.
			return rr.SourceSTag == e.wr.RKey && rr.SourceTO >= e.wr.RemoteAddr && rr.SourceTO < e.wr.RemoteAddr+uint64(max(1, e.length))
		}
		return h.MSN >= e.msn && h.MSN < e.msn+uint32(max(1, len(e.sgl())))
	default:
		return h.Opcode.Info().Send && h.MSN == e.msn
	}
}

// statusFor maps a Terminate's error to the completion status of the
// work it reports.
func statusFor(e *wire.TermError) Status {
	switch {
	case e.Layer == wire.LayerRDMAP && e.Type == wire.RDMAPRemoteProtection,
		e.Layer == wire.LayerDDP && e.Type == wire.DDPTaggedBuffer:
		return RemoteAccessError
	case e.Layer == wire.LayerDDP && e.Type == wire.DDPUntaggedBuffer:
		return RemoteInvalidRequest
	case e.Layer == wire.LayerRDMAP && e.Type == wire.RDMAPRemoteOperation:
		return RemoteOperationError
	}
	return FatalError
}

// fill makes at least n bytes available in the staging buffer. first is
// set for the read that starts an FPDU, where nothing of it is held on the
// stack: only there does a deadline stop the receive path (to yield it, or
// for an inline receive whose time is up); elsewhere the FPDU is finished.
func (r *rxState) fill(n int, first bool) error {
	if r.w-r.r >= n {
		return nil
	}
	if len(r.buf)-r.r < n {
		r.w = copy(r.buf, r.buf[r.r:r.w])
		r.r = 0
	}
	for r.w-r.r < n {
		r.iov = append(r.iov[:0], r.buf[r.w:])
		k, err := r.readv(r.iov, first)
		r.iov[0] = nil
		r.w += k
		if err != nil {
			if r.w-r.r >= n {
				return nil
			}
			return err
		}
	}
	return nil
}

// readv reads from the link. The read deadline is a doorbell: set in the
// past, it asks whoever holds the receive path to look up (see
// receiveInline, background). At the start of an FPDU readv reports that
// as errRxYield; in the middle of one it clears it and reads on.
func (r *rxState) readv(iov [][]byte, first bool) (int, error) {
	for {
		k, err := r.q.link.Readv(iov)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return k, err
		}
		r.dl = time.Unix(1, 0) // whoever set it, the deadline has passed
		if first {
			return k, errRxYield
		}
		r.q.bell.Store(false)
		r.q.rearm()
		if k > 0 {
			return k, nil
		}
	}
}

// ring asks the holder of the receive path to look up: the receive
// goroutine to yield (with rxYield set), an inline receiver to check
// whether what it waits for has come. bell keeps the ring from being lost
// when the receiver re-arms its deadline at the same moment.
func (q *QP) ring() {
	q.bell.Store(true)
	q.link.Conn().SetReadDeadline(time.Unix(1, 0))
}

// rearm clears the read deadline after the doorbell rang, unless it rang
// again meanwhile. The holder of the path keeps the deadline it set in
// rx.dl, to skip clearing it again.
func (q *QP) rearm() {
	if q.rx.dl.IsZero() && !q.bell.Load() {
		return
	}
	q.rx.dl = time.Time{}
	q.link.Conn().SetReadDeadline(time.Time{})
	if q.bell.Load() {
		q.rx.dl = time.Unix(1, 0)
		q.link.Conn().SetReadDeadline(q.rx.dl)
	}
}

// fpdu receives one FPDU: header, placement, trailer, then its effects.
func (r *rxState) fpdu() error {
	q := r.q
	if q.State() == StateError {
		return net.ErrClosed // failed meanwhile: place nothing more
	}
	if err := r.fill(2, true); err != nil {
		return err
	}
	if !q.heard.Load() {
		q.heard.Store(true) // the peer's queue pair is reading: no nudges (nudgeLoop)
	}
	r.ulen = int(binary.BigEndian.Uint16(r.buf[r.r:]))
	r.hlen = min(r.ulen, maxHead)
	if err := r.fill(2+r.hlen, false); err != nil {
		return err
	}
	copy(r.head[:], r.buf[r.r+2:r.r+2+r.hlen])
	h, n, err := wire.ParseHeader(r.head[:r.hlen])
	if err != nil {
		return newFault(wire.ErrDDPCatastrophic, "ULPDU of %d bytes is shorter than its header", r.ulen)
	}
	if err := checkHeader(&h); err != nil {
		return err
	}
	info := h.Opcode.Info()
	if r.ulen < n+info.Extra {
		return newFault(wire.ErrDDPCatastrophic, "%v of %d bytes is shorter than its header", h.Opcode, r.ulen)
	}
	if h.Opcode == wire.OpTerminate {
		return r.terminate(n)
	}
	payload := r.ulen - n - info.Extra
	var crc uint32
	if r.crc {
		crc = wire.UpdateCRC32c(0, r.buf[r.r:r.r+2+n+info.Extra])
	}
	first := !q.peerUp.Load()

	// Find where the payload goes; every check happens before a byte
	// lands, and after the memory is held (r.held).
	var region, src *mem.Region
	var rr wire.ReadRequest
	r.dst = r.dst[:0]
	switch h.Opcode {
	case wire.OpWrite:
		if payload > 0 {
			region, err = r.tagged(&h, payload)
		}
	case wire.OpReadResponse:
		err = r.response(&h, payload)
	case wire.OpReadRequest:
		rr, src, err = r.readRequest(&h)
	default: // the Sends
		err = r.send(&h, payload)
	}
	if err == nil {
		r.r += 2 + n + info.Extra
		err = r.placeAndCheck(payload, crc)
		if region != nil && err == nil {
			region.AddPlaced(payload)
		}
	}
	r.unhold()
	if err != nil {
		if src != nil {
			src.Unhold()
		}
		return err
	}

	// The FPDU is whole and checked: act on it.
	switch h.Opcode {
	case wire.OpWrite:
	case wire.OpReadResponse:
		r.responsePlaced(&h, payload)
	case wire.OpReadRequest:
		r.queueRead(&rr, src)
	default:
		if err := r.sendPlaced(&h, payload); err != nil {
			return err
		}
	}
	if first {
		q.peerUp.Store(true)
		q.kick()
	}
	return nil
}

// placeAndCheck places the payload, then reads the trailer and, with CRC
// on, checks the CRC over the whole FPDU.
func (r *rxState) placeAndCheck(payload int, crc uint32) error {
	if err := r.place(payload, &crc); err != nil {
		return err
	}
	pad := wire.PadLen(r.ulen)
	if err := r.fill(pad+wire.CRCLen, false); err != nil {
		return err
	}
	if r.crc {
		crc = wire.UpdateCRC32c(crc, r.buf[r.r:r.r+pad])
		if got := binary.LittleEndian.Uint32(r.buf[r.r+pad:]); got != crc {
			return newFault(wire.ErrMPACRC, "CRC %#08x, computed %#08x", got, crc)
		}
	}
	r.r += pad + wire.CRCLen
	return nil
}

// checkHeader applies the checks that come before the opcode's own: DDP
// and RDMAP versions, a known opcode in the right buffer model, and the
// queue number (RFC 5041 §7, RFC 5040 §7).
func checkHeader(h *wire.Header) error {
	switch {
	case h.DDPVersion != wire.DDPVersion && h.Tagged:
		return newFault(wire.ErrDDPTaggedVersion, "DDP version %d", h.DDPVersion)
	case h.DDPVersion != wire.DDPVersion:
		return newFault(wire.ErrDDPUntaggedVersion, "DDP version %d", h.DDPVersion)
	case h.RDMAPVersion != wire.RDMAPVersion:
		return newFault(wire.ErrRDMAPVersion, "RDMAP version %d", h.RDMAPVersion)
	}
	info := h.Opcode.Info()
	switch {
	case !info.Valid:
		return newFault(wire.ErrRDMAPOpcode, "%v", h.Opcode)
	case info.Tagged != h.Tagged:
		return newFault(wire.ErrRDMAPOpcode, "%v in the wrong buffer model", h.Opcode)
	case !h.Tagged && h.QN != info.QN:
		return newFault(wire.ErrDDPInvalidQN, "%v on queue %d", h.Opcode, h.QN)
	case !h.Tagged && !h.Last && h.Opcode != wire.OpSend && h.Opcode != wire.OpSendSE &&
		h.Opcode != wire.OpSendInv && h.Opcode != wire.OpSendSEInv:
		return newFault(wire.ErrDDPInvalidMO, "%v without the last flag", h.Opcode)
	}
	return nil
}

// hold keeps a hold taken on region for the current placement.
func (r *rxState) hold(region *mem.Region) {
	r.held[r.nheld] = region
	r.nheld++
}

// unhold ends the holds of the current placement.
func (r *rxState) unhold() {
	for i := range r.nheld {
		r.held[i].Unhold()
		r.held[i] = nil
	}
	r.nheld = 0
}

// tagged resolves an RDMA Write's target: the STag, this connection's
// protection domain, the remote-write right and the bounds. The region is
// held before it is judged, so it cannot be deregistered in between.
func (r *rxState) tagged(h *wire.Header, n int) (*mem.Region, error) {
	q := r.q
	region, why := q.cfg.Table.LookupHold(mem.STag(h.STag))
	if why == mem.OK {
		if why = region.CheckRemote(q.cfg.PD, mem.RemoteWrite, h.TO, uint64(n)); why != mem.OK {
			region.Unhold()
		}
	}
	if why != mem.OK {
		return nil, newFault(ddpTaggedError(why), "Write of %d bytes to STag %#08x TO %#x", n, h.STag, h.TO)
	}
	r.hold(region)
	r.dst = region.Slices(r.dst, h.TO-region.Addr(), uint64(n))
	return region, nil
}

// ddpTaggedError turns a refused tagged placement into its DDP error
// (RFC 5041 §7.2).
func ddpTaggedError(why mem.Reason) *wire.TermError {
	switch why {
	case mem.BaseBounds:
		return wire.ErrDDPBaseBounds
	case mem.NotAssociated:
		return wire.ErrDDPSTagNotAssoc
	case mem.TOWrap:
		return wire.ErrDDPTOWrap
	}
	return wire.ErrDDPInvalidSTag // unknown, wrong key, invalidated, no right
}

// rdmapError turns a refused Read source into its RDMAP error (RFC 5040 §7.2).
func rdmapError(why mem.Reason) *wire.TermError {
	switch why {
	case mem.BaseBounds:
		return wire.ErrRDMAPBaseBounds
	case mem.AccessRights:
		return wire.ErrRDMAPAccessRights
	case mem.NotAssociated:
		return wire.ErrRDMAPSTagNotAssoc
	case mem.TOWrap:
		return wire.ErrRDMAPTOWrap
	}
	return wire.ErrRDMAPInvalidSTag
}

// response matches a Read Response segment to the head of the ORQ: it must
// name the sink STag and continue at the TO where the last segment ended,
// and may not run past the requested size.
func (r *rxState) response(h *wire.Header, n int) error {
	q := r.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.orqHead == q.orqTail {
		return newFault(wire.ErrRDMAPOpcode, "Read Response with no Read outstanding")
	}
	o := &q.orq[q.orqHead%uint64(len(q.orq))]
	switch {
	case h.STag != o.sinkSTag:
		return newFault(wire.ErrDDPInvalidSTag, "Read Response to STag %#08x, expected %#08x", h.STag, o.sinkSTag)
	case h.TO != o.sinkTO+uint64(o.placed) || o.placed+n > o.sge.Length:
		return newFault(wire.ErrDDPBaseBounds, "Read Response at TO %#x of %d bytes, expected TO %#x and at most %d", h.TO, n, o.sinkTO+uint64(o.placed), o.sge.Length-o.placed)
	case h.Last && o.placed+n != o.sge.Length:
		return newFault(wire.ErrDDPBaseBounds, "Read Response ends after %d of %d bytes", o.placed+n, o.sge.Length)
	}
	if n > 0 {
		// The Read pins the sink; a flush drops the pin while this
		// goroutine may be placing, so the placement holds it too.
		if !o.sge.MR.TryHold() {
			return newFault(wire.ErrDDPInvalidSTag, "Read Response to STag %#08x, deregistered", h.STag)
		}
		r.hold(o.sge.MR)
		r.dst = o.sge.MR.Slices(r.dst, uint64(o.sge.Offset+o.placed), uint64(n))
	}
	return nil
}

// responsePlaced records a placed Read Response segment; the last one
// completes its Read Request, and the Read when all its requests are answered.
func (r *rxState) responsePlaced(h *wire.Header, n int) {
	q := r.q
	q.mu.Lock()
	if q.orqHead == q.orqTail { // flushed meanwhile
		q.mu.Unlock()
		return
	}
	o := &q.orq[q.orqHead%uint64(len(q.orq))]
	o.placed += n
	if n > 0 {
		o.sge.MR.AddPlaced(n)
	}
	if !h.Last {
		q.mu.Unlock()
		return
	}
	e := o.sq
	*o = orqEntry{}
	q.orqHead++
	if q.orqHead == q.orqTail {
		q.drainedLocked()
	}
	if e != nil {
		e.readsLeft--
		if e.readsLeft == 0 {
			e.done = true
			q.retireLocked(true)
		}
	}
	q.mu.Unlock()
	q.kick() // an ORQ slot is free: a fenced send queue may go on
}

// readRequest checks an inbound Read Request: its MSN, the IRD limit, and
// the source memory (STag, domain, remote-read right, bounds). A
// zero-length Read (an RTR, or a flush) touches no memory and is not
// checked. The source region is returned held, until its last byte is
// written (see queueRead).
func (r *rxState) readRequest(h *wire.Header) (wire.ReadRequest, *mem.Region, error) {
	q := r.q
	rr, _, _ := wire.ParseReadRequest(r.head[wire.UntaggedHeaderLen:r.hlen])
	if h.MSN != r.msn[wire.QNRead] {
		return rr, nil, newFault(wire.ErrDDPInvalidMSN, "Read Request MSN %d, expected %d", h.MSN, r.msn[wire.QNRead])
	}
	if h.MO != 0 {
		return rr, nil, newFault(wire.ErrDDPInvalidMO, "Read Request at MO %d", h.MO)
	}
	q.mu.Lock()
	full := q.irqTail-q.irqHead == uint64(len(q.irq))
	q.mu.Unlock()
	if full {
		return rr, nil, newFault(wire.ErrRDMAPStream, "Read Request beyond IRD %d", len(q.irq))
	}
	if rr.Size == 0 {
		return rr, nil, nil
	}
	region, why := q.cfg.Table.LookupHold(mem.STag(rr.SourceSTag))
	if why == mem.OK {
		if why = region.CheckRemote(q.cfg.PD, mem.RemoteRead, rr.SourceTO, uint64(rr.Size)); why != mem.OK {
			region.Unhold()
		}
	}
	if why != mem.OK {
		return rr, nil, newFault(rdmapError(why), "Read of %d bytes from STag %#08x TO %#x", rr.Size, rr.SourceSTag, rr.SourceTO)
	}
	return rr, region, nil
}

// queueRead puts a checked Read Request on the IRQ for the transmit path,
// with its source region held: the transmit path ends the hold once the
// Read Response's last byte is written, a flush if it is never sent.
func (r *rxState) queueRead(rr *wire.ReadRequest, region *mem.Region) {
	q := r.q
	r.msn[wire.QNRead]++
	e := irqEntry{size: int(rr.Size), sinkSTag: rr.SinkSTag, sinkTO: rr.SinkTO}
	if region != nil {
		e.region, e.srcOff = region, rr.SourceTO-region.Addr()
	}
	q.mu.Lock()
	if s := q.State(); s != StateReady && s != StateClosing {
		q.mu.Unlock()
		if e.region != nil {
			e.region.Unhold()
		}
		return
	}
	q.irq[q.irqTail%uint64(len(q.irq))] = e
	q.irqTail++
	if e.size <= inlineResponse {
		q.kickLocked() // answer at once, from this goroutine if the role is free
	} else {
		q.kickAsyncLocked() // a long answer must not hold up the receive path
	}
}

// send checks a Send segment against the receive it fills: MSN and MO in
// sequence, a receive posted, and room in it.
func (r *rxState) send(h *wire.Header, n int) error {
	q := r.q
	if r.recv == nil {
		if h.MSN != r.msn[wire.QNSend] {
			return newFault(wire.ErrDDPInvalidMSN, "Send MSN %d, expected %d", h.MSN, r.msn[wire.QNSend])
		}
		if h.MO != 0 {
			return newFault(wire.ErrDDPInvalidMO, "Send starts at MO %d", h.MO)
		}
		q.mu.Lock()
		if q.rqHead == q.rqTail {
			q.mu.Unlock()
			return newFault(wire.ErrDDPNoBuffer, "Send with no receive posted")
		}
		r.recvWQE = q.rq[q.rqHead%uint64(len(q.rq))]
		r.recvIdx = q.rqHead
		r.recv = &r.recvWQE
		r.recvBytes, r.recvMSN, r.recvStatus = 0, h.MSN, Success
		q.mu.Unlock()
	} else {
		if h.MSN != r.recvMSN {
			return newFault(wire.ErrDDPInvalidMSN, "Send MSN %d inside message %d", h.MSN, r.recvMSN)
		}
		if int(h.MO) != r.recvBytes {
			return newFault(wire.ErrDDPInvalidMO, "Send segment at MO %d, expected %d", h.MO, r.recvBytes)
		}
	}
	if r.recvBytes+n > r.recv.length {
		return &fault{term: wire.ErrDDPNoBuffer, status: LocalLengthError,
			detail: fmt.Sprintf("Send of at least %d bytes into a receive of %d", r.recvBytes+n, r.recv.length)}
	}
	// The receive pins its regions; a flush drops the pins while this
	// goroutine may be placing, so the placement holds them too.
	if !r.holdSGEs(r.recv.sges[:r.recv.nsge], r.recvBytes, n) {
		return net.ErrClosed // flushed and deregistered: the queue pair has failed
	}
	r.dst = sgeSlices(r.dst, r.recv.sges[:r.recv.nsge], r.recvBytes, n)
	return nil
}

// holdSGEs holds the regions of the SGEs under [off, off+n) of an SGE
// list. It reports false, holding none, if one is being deregistered.
func (r *rxState) holdSGEs(sges []SGE, off, n int) bool {
	for i := range sges {
		s := &sges[i]
		if n == 0 {
			break
		}
		if off >= s.Length {
			off -= s.Length
			continue
		}
		if !s.MR.TryHold() {
			r.unhold()
			return false
		}
		r.hold(s.MR)
		n -= min(n, s.Length-off)
		off = 0
	}
	return true
}

// sgeSlices appends the memory of [off, off+n) of an SGE list.
func sgeSlices(dst [][]byte, sges []SGE, off, n int) [][]byte {
	for i := range sges {
		s := &sges[i]
		if n == 0 {
			break
		}
		if off >= s.Length {
			off -= s.Length
			continue
		}
		k := min(n, s.Length-off)
		dst = s.MR.Slices(dst, uint64(s.Offset+off), uint64(k))
		n -= k
		off = 0
	}
	return dst
}

// sendPlaced records a placed Send segment; the last one completes the receive.
func (r *rxState) sendPlaced(h *wire.Header, n int) error {
	q := r.q
	r.recvBytes += n
	if !h.Last {
		return nil
	}
	c := Completion{QP: q, Op: CompRecv, Bytes: r.recvBytes, Solicited: h.Opcode.Solicited()}
	if h.Opcode.Invalidates() {
		if why := q.cfg.Table.Invalidate(q.cfg.PD, mem.STag(h.RsvdULP)); why != mem.OK {
			return newFault(wire.ErrRDMAPCannotInvalidate, "STag %#08x: %v", h.RsvdULP, why)
		}
		c.Invalidated = h.RsvdULP
	}
	r.msn[wire.QNSend]++
	q.mu.Lock()
	defer q.mu.Unlock()
	r.recv = nil
	if q.rqHead != r.recvIdx || q.rqHead == q.rqTail {
		return nil // flushed meanwhile
	}
	e := &q.rq[q.rqHead%uint64(len(q.rq))]
	c.ID = e.id
	for i := range e.nsge {
		e.sges[i].MR.Release()
	}
	e.sges = [MaxSGE]SGE{}
	q.rqHead++
	if !q.cfg.RecvCQ.push(&c, true) {
		q.overrunLocked()
	}
	return nil
}

// terminate reads a Terminate message and returns it as an error.
func (r *rxState) terminate(n int) error {
	if r.ulen > maxTerminate {
		return newFault(wire.ErrDDPCatastrophic, "Terminate of %d bytes", r.ulen)
	}
	total := wire.FPDULen(r.ulen)
	if err := r.fill(total, false); err != nil {
		return err
	}
	f, _, err := wire.ParseFPDU(r.buf[r.r:r.r+total], r.crc)
	if err != nil {
		return newFault(wire.ErrMPACRC, "in a Terminate")
	}
	t, _, err := wire.ParseTerminate(f.ULPDU[n:])
	if err != nil {
		return newFault(wire.ErrDDPCatastrophic, "malformed Terminate")
	}
	t.Rest = append([]byte(nil), t.Rest...)
	r.r += total
	return &peerTerminate{t: t}
}

// place moves n payload bytes into r.dst: first what the staging buffer
// holds, then, for a large remainder, with scatter reads straight into the
// destination (their overflow lands in the staging buffer), else through
// the staging buffer. The running CRC is extended over the payload.
func (r *rxState) place(n int, crc *uint32) error {
	dst := r.dst
	i := 0
	for n > 0 {
		for i < len(dst) && len(dst[i]) == 0 {
			i++
		}
		if i == len(dst) {
			panic("engine: payload longer than its destination") // checked before placement
		}
		if r.w > r.r {
			c := copy(dst[i], r.buf[r.r:r.w])
			if r.crc {
				*crc = wire.UpdateCRC32c(*crc, dst[i][:c])
			}
			r.r += c
			dst[i] = dst[i][c:]
			n -= c
			continue
		}
		r.r, r.w = 0, 0
		if n < directMin {
			if err := r.fill(1, false); err != nil {
				return err
			}
			continue
		}
		// Read the rest of the payload in place, and with it the trailer
		// and, likely, the next FPDU's header.
		r.iov = append(r.iov[:0], dst[i:]...)
		r.iov = append(r.iov, r.buf[:wire.MaxTrailerLen+2+maxHead])
		k, err := r.readv(r.iov, false)
		clear(r.iov)
		for k > 0 && n > 0 {
			c := min(k, len(dst[i]))
			if r.crc {
				*crc = wire.UpdateCRC32c(*crc, dst[i][:c])
			}
			dst[i] = dst[i][c:]
			k -= c
			n -= c
			if len(dst[i]) == 0 && n > 0 {
				i++
			}
		}
		r.w = k
		if err != nil && (n > 0 || k == 0) {
			return err
		}
	}
	clear(r.dst)
	r.dst = r.dst[:0]
	return nil
}
