package engine

import (
	"encoding/binary"
	"fmt"
	"net"
	"slices"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// The receive core: the receive side of a queue pair's protocol, with no
// I/O. The driver (rx.go) asks it where the next bytes of the stream go
// (next), reads them from the link, and hands them over (advance); the
// core parses, checks, places and acts on them, and can stop anywhere
// (in a header, a payload or a trailer) and resume there, as siw's
// receive state machine does. It touches the queue pair's protocol state
// (queues, ORQ/IRQ, MSNs, regions, CQs) and reads no socket, sets no
// deadline and reads no clock. One effect leaves it: a queued Read
// Request or the first FPDU kicks the transmit path, which may write
// Read Responses to the link on the calling goroutine (the table tests
// give it a link that records them).

const (
	// rxStaging is the receive staging buffer: headers, trailers and small
	// payloads land here; larger payload is read straight into place.
	rxStaging = 64 << 10
	// rxMinFree is the free space below which next moves what is staged
	// to the staging buffer's start; more than anything the core waits to
	// have whole (a Terminate FPDU) can need.
	rxMinFree = 2 << 10
	// directMin is the payload remainder from which the receive path reads
	// straight into the target memory instead of through the staging buffer.
	directMin = 2048
	// maxHead is the longest DDP/RDMAP header plus body the parser needs
	// at once: an untagged header and a Read Request body.
	maxHead = wire.UntaggedHeaderLen + max(wire.ReadRequestLen, wire.AtomicRequestLen)
	// inlineResponse is the largest Read Response the receive goroutine
	// transmits itself (saving a wake-up of the transmit goroutine).
	inlineResponse = 64 << 10
	// maxTerminate bounds a received Terminate's ULPDU.
	maxTerminate = 1024
)

// rxState is the receive core's state, driven by whoever holds the
// receive path (rxMu).
type rxState struct {
	q    *QP
	buf  []byte // staging; nil until needed, and while the driver waits with nothing staged (staging.go)
	r, w int
	// mini is the queue pair's own small staging buffer, for waits that
	// small FPDUs end (staging.go); lastIdle is what the last read after
	// such a wait brought.
	mini     [rxMini]byte
	lastIdle int
	crc      bool
	// idle is the link, if it can wait without the staging buffer; put
	// and get are putStaging and getStaging, made once (see receive).
	idle idleReader
	put  func([]byte)
	get  func() []byte
	// more is r.moreIdle, made once; moreErr is what the core said of
	// bytes more took. While an inline waiter holds the path (see
	// receiveInline) it waits for a completion in waitCQ, or for waitFn
	// (called after each FPDU) to say no more (fnOver), or with neither
	// for an FPDU after the waitFrom'th.
	more     func(int) ([]byte, bool)
	moreErr  error
	waitCQ   *CQ
	waitFn   func() bool
	fnOver   bool
	waitFrom uint64

	iov    [][]byte // what next returned
	direct bool     // iov starts with the payload's destination
	dst    [][]byte // destination pieces of the current payload, consumed from the front
	di     int      // dst[di] is the piece being filled

	// The FPDU under way.
	phase   rxPhase
	head    [maxHead]byte
	hlen    int // bytes of head in use
	ulen    int // ULPDU length of the current FPDU
	hdrLen  int // DDP/RDMAP header length (of a Terminate)
	h       wire.Header
	payload int         // its payload length
	left    int         // payload bytes still to place
	sum     uint32      // running CRC
	summed  bool        // sum covers the whole FPDU already (header)
	first   bool        // the peer's first FPDU
	region  *mem.Region // a Write's target, for this FPDU (durablePlaced)
	src     *mem.Region // a Read Request's source, held
	atom    *mem.Region // an Atomic Request's target, write-held
	rr      wire.ReadRequest
	err     error  // why the core stopped (phase rxDead)
	fpdus   uint64 // FPDUs received whole
	// paused: advance stopped at the end of an FPDU with more staged
	// (see staged).
	paused bool
	// answer: Read Responses were queued on the IRQ and the transmit path
	// not started for them (see answerDue).
	answer bool

	// held are the regions dst lies in, each with a write hold taken for
	// the placement (see mem.Region.TryHoldWrite), so that a Deregister
	// waits for it and a snapshot holds all of the FPDU or none; nheld are
	// in use.
	held  [MaxSGE]*mem.Region
	nheld int
	// guard: a region held is a file's mapping, so placement copies with
	// faults recovered (placeGuarded) and never reads into it directly.
	guard bool
	// fileChk is the file size Reads of this batch were checked against
	// (readFile); advance clears it when bytes come from a new read of
	// the socket, not when it goes on with bytes staged (advance(0)).
	fileChk fileCheck

	// Storage semantics (memsem.go): durable says the Write under way
	// goes through a Durable key; sync is the range placed through one
	// and not yet synced, with a hold on its region; flush is the flush
	// request under way (a zero-length Read Request that carries one).
	durable bool
	sync    pendingSync
	flush   *wire.Flush
	flushV  wire.Flush

	// wr is the target of the RDMA Write under way, from its first FPDU
	// until its last or until an FPDU that is not a Write to the same
	// STag: the FPDUs of one message (45 of a 64 KiB Write on a 1500-byte
	// MTU link) take one lookup of the STag table between them. It is not
	// held between FPDUs: each FPDU takes its hold (held) and is judged
	// again (see tagged). wrPlaced counts the bytes placed in wr and not
	// yet added to its Placed count: they are added when the staged bytes
	// run out, when the Write ends and when the core stops, not after
	// every FPDU.
	wr       *mem.Region
	wrPlaced int
	// sunk: this FPDU's payload goes to its region's sink (a detached
	// region, a retired key), not to the region's memory.
	sunk bool

	msn [4]uint32 // next expected MSN per queue number

	// The receive being filled by a Send: a copy of the WQE (a flush may
	// clear the ring entry meanwhile), its index in the ring, progress and
	// outcome.
	recv       *rqEntry
	recvWQE    rqEntry
	recvIdx    uint64
	recvBytes  int
	recvMSN    uint32
	recvStatus Status
	imm        uint64 // the Immediate Data of the message under way
	ar         wire.AtomicRequest
	aresp      wire.AtomicResponse
}

func (r *rxState) init(q *QP) {
	r.q, r.crc = q, q.params.CRC
	r.idle, _ = q.link.(idleReader)
	r.put, r.get, r.more = r.putStaging, r.getStaging, r.moreIdle
	r.iov = make([][]byte, 0, 2*MaxSGE+2)
	r.dst = make([][]byte, 0, 2*MaxSGE)
	r.msn = [4]uint32{1, 1, 1, 1}
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

// rxPhase is where in an FPDU the receive core stands.
type rxPhase uint8

const (
	rxHeader  rxPhase = iota // an FPDU's length and header, staged
	rxPayload                // its payload, placed as it comes
	rxTrailer                // pad and CRC, staged
	rxTerm                   // a Terminate, staged whole
	rxDead                   // failed: takes nothing more
)

// next returns where the next bytes of the stream should be read: free
// space in the staging buffer, or, while a large payload is being placed,
// the target memory itself followed by staging space for the trailer and
// the next FPDU's header. The vectors are valid until advance.
func (r *rxState) next() [][]byte {
	if r.buf == nil {
		r.getStaging()
	}
	if r.r == r.w {
		r.r, r.w = 0, 0
	} else if r.inMini() {
		// Part of an FPDU is staged in the small buffer: go on in a
		// whole one.
		b := r.buf[r.r:r.w]
		r.getStaging()
		r.r, r.w = 0, copy(r.buf, b)
	} else if len(r.buf)-r.w < rxMinFree {
		// Less than a staged Terminate is pending (see run): room for
		// the rest of it.
		r.w = copy(r.buf, r.buf[r.r:r.w])
		r.r = 0
	}
	r.iov = r.iov[:0]
	if r.phase == rxPayload && r.left >= directMin && r.r == r.w && !r.guard {
		// Read the rest of the payload in place, and with it the trailer
		// and, likely, the next FPDU's header.
		r.direct = true
		r.iov = append(r.iov, r.dst[r.di:]...)
		r.iov = append(r.iov, r.buf[:wire.MaxTrailerLen+2+maxHead])
		return r.iov
	}
	r.direct = false
	r.iov = append(r.iov, r.buf[r.w:])
	return r.iov
}

// advance takes n bytes read into the vectors next gave and acts on what
// they complete: it checks and places, completes work, queues Read
// Requests for the transmit path. It stops wherever the bytes end, in the
// middle of a header, a payload or a trailer, and resumes there with the
// next call; or at the end of an FPDU, with more staged (see staged). An
// error is final: a *fault found in the peer's input (answered with a
// Terminate), a *peerTerminate, or net.ErrClosed when the queue pair
// failed meanwhile.
func (r *rxState) advance(n int) error {
	r.paused = false
	if n > 0 && !r.q.heard.Load() {
		r.q.heard.Store(true) // the peer's queue pair is reading: no nudges (nudgeLoop)
	}
	if r.direct {
		r.direct = false
		k := n
		for k > 0 && r.left > 0 {
			d := r.dst[r.di]
			if len(d) == 0 {
				r.di++
				continue
			}
			c := min(k, len(d))
			if r.crc && !r.summed {
				r.sum = wire.UpdateCRC32c(r.sum, d[:c])
			}
			r.dst[r.di] = d[c:]
			k -= c
			r.left -= c
		}
		r.w = k // what came after the payload, at the staging buffer's start
	} else {
		r.w += n
	}
	clear(r.iov)
	r.iov = r.iov[:0]
	if r.phase == rxDead {
		return r.err
	}
	if n > 0 {
		r.fileChk = fileCheck{} // new bytes from the socket: stat again
	}
	err := r.run()
	if err != nil {
		r.release()
		r.phase, r.err = rxDead, err
		return err
	}
	if !r.paused {
		r.addPlaced() // the staged bytes ran out: once per read
	}
	return nil
}

// staged reports that advance stopped at the end of an FPDU with bytes
// of the next one staged: the driver calls advance(0) to go on before it
// reads. Stopping there lets a receiver look up between two FPDUs (a
// completion it waits for, a receive to post before the next Send), as a
// reader of one FPDU at a time would.
func (r *rxState) staged() bool { return r.paused }

// release ends the holds of a placement cut short (a fault, or the
// queue pair failed with the path in the middle of an FPDU). The core
// takes nothing more after it.
func (r *rxState) release() {
	if r.phase != rxDead {
		r.phase, r.err = rxDead, net.ErrClosed
	}
	r.unhold()
	r.endWrite()
	if r.src != nil {
		r.src.Unhold()
		r.src = nil
	}
	if r.atom != nil {
		r.atom.UnholdWrite()
		r.atom = nil
	}
	r.sync.drop()
	r.region = nil
	clear(r.dst)
	r.dst = r.dst[:0]
}

// run acts on the staged bytes as far as they go.
func (r *rxState) run() error {
	for {
		switch r.phase {
		case rxHeader:
			if r.w-r.r < 2 {
				return nil
			}
			if err := r.header(); err != nil || r.phase == rxHeader {
				return err // or the header is not all here
			}
		case rxPayload:
			if r.guard {
				if err := r.placeGuarded(); err != nil {
					return err
				}
			} else {
				r.placeStaged()
			}
			if r.left > 0 {
				return nil
			}
			clear(r.dst)
			r.dst = r.dst[:0]
			r.phase = rxTrailer
		case rxTrailer:
			pad := wire.PadLen(r.ulen)
			if r.w-r.r < pad+wire.CRCLen {
				return nil
			}
			if r.crc {
				crc := r.sum
				if !r.summed {
					crc = wire.UpdateCRC32c(crc, r.buf[r.r:r.r+pad])
				}
				if got := binary.LittleEndian.Uint32(r.buf[r.r+pad:]); got != crc {
					return newFault(wire.ErrMPACRC, "CRC %#08x, computed %#08x", got, crc)
				}
			}
			r.r += pad + wire.CRCLen
			if err := r.complete(); err != nil {
				return err
			}
			r.phase = rxHeader
			if r.w > r.r {
				r.paused = true
				return nil
			}
		case rxTerm:
			total := wire.FPDULen(r.ulen)
			if r.w-r.r < total {
				return nil
			}
			return r.terminate(total)
		default:
			return r.err
		}
	}
}

// header parses and checks the FPDU header at the staging buffer's read
// position, once it is staged, and finds where the payload goes. It
// leaves the phase at rxHeader while the header is not all staged.
func (r *rxState) header() error {
	q := r.q
	if q.State() == StateError {
		return net.ErrClosed // failed meanwhile: place nothing more
	}
	b := r.buf[r.r:r.w]
	ulen := int(binary.BigEndian.Uint16(b))
	hlen := min(ulen, maxHead)
	if len(b) < 2+hlen {
		return nil
	}
	r.ulen, r.hlen = ulen, hlen
	copy(r.head[:], b[2:2+hlen]) // kept for a Terminate's echo
	// Parsed in place into r.h: the header of the FPDU under way from here.
	n, err := r.h.Decode(b[2 : 2+hlen])
	if err != nil {
		return newFault(wire.ErrDDPCatastrophic, "ULPDU of %d bytes is shorter than its header", r.ulen)
	}
	h := &r.h
	info := &wire.Ops[h.Opcode&0xf]
	if err := checkHeader(h, info); err != nil {
		return err
	}
	if r.sync.region != nil && h.Opcode != wire.OpWrite {
		// What a durable Write placed is on stable storage before
		// anything after it is processed.
		if err := r.syncPending(); err != nil {
			return err
		}
	}
	if info.Ext && !r.extOK(h.Opcode) {
		// Never taken from a peer that did not negotiate it (ext.go).
		return newFault(wire.ErrRDMAPOpcode, "%v, an extension not negotiated", h.Opcode)
	}
	if r.ulen < n+info.Extra {
		return newFault(wire.ErrDDPCatastrophic, "%v of %d bytes is shorter than its header", h.Opcode, r.ulen)
	}
	if h.Opcode == wire.OpTerminate {
		if r.ulen > maxTerminate {
			return newFault(wire.ErrDDPCatastrophic, "Terminate of %d bytes", r.ulen)
		}
		r.hdrLen = n
		r.phase = rxTerm
		return nil
	}
	payload := r.ulen - n - info.Extra
	r.sum, r.summed = 0, false
	if r.crc {
		if total := wire.FPDULen(ulen); len(b) >= total {
			// All of it is staged, as segment-sized FPDUs mostly are:
			// one pass over it, checked at the trailer all the same.
			r.sum, r.summed = wire.UpdateCRC32c(0, b[:total-wire.CRCLen]), true
		} else {
			r.sum = wire.UpdateCRC32c(0, b[:2+n+info.Extra])
		}
	}
	r.first = !q.peerUp.Load()

	// Find where the payload goes; every check happens before a byte
	// lands, and after the memory is held (r.held, r.wr).
	r.dst = r.dst[:0]
	r.region, r.src, r.durable, r.flush = nil, nil, false, nil
	if r.wr != nil && (h.Opcode != wire.OpWrite || h.STag != uint32(r.wr.STag())) {
		r.endWrite()
	}
	switch h.Opcode {
	case wire.OpWrite:
		if payload > 0 {
			err = r.tagged(h, payload)
		}
	case wire.OpReadResponse:
		err = r.response(h, payload)
	case wire.OpReadRequest:
		if payload > 0 {
			// It carries none; placing one would have no destination.
			return newFault(wire.ErrDDPTooLong, "Read Request with %d bytes after its body", payload)
		}
		r.rr, r.src, err = r.readRequest(h)
	case wire.OpAtomicRequest, wire.OpAtomicResponse:
		if payload > 0 {
			return newFault(wire.ErrDDPTooLong, "%v with %d bytes after its body", h.Opcode, payload)
		}
		if h.Opcode == wire.OpAtomicRequest {
			r.atom, err = r.atomicRequest(h)
		} else {
			err = r.atomicResponse(h)
		}
	default: // the Sends, and Immediate Data
		if info.Extra == wire.ImmediateLen {
			r.imm, _, _ = wire.ParseImmediate(r.head[n:])
		}
		err = r.send(h, payload)
	}
	if err != nil {
		return err
	}
	r.payload, r.left, r.di = payload, payload, 0
	r.r += 2 + n + info.Extra
	r.phase = rxPayload
	return nil
}

// placeStaged moves what the staging buffer holds of the payload into place.
func (r *rxState) placeStaged() {
	for r.left > 0 && r.w > r.r {
		if r.di == len(r.dst) {
			panic("engine: payload longer than its destination") // checked before placement
		}
		d := r.dst[r.di]
		if len(d) == 0 {
			r.di++
			continue
		}
		c := copy(d, r.buf[r.r:r.w])
		if r.crc && !r.summed {
			r.sum = wire.UpdateCRC32c(r.sum, d[:c])
		}
		r.dst[r.di] = d[c:]
		r.r += c
		r.left -= c
	}
}

// complete acts on an FPDU that is whole and checked.
func (r *rxState) complete() error {
	q := r.q
	if r.durable {
		if err := r.durablePlaced(); err != nil {
			return err
		}
	}
	r.region = nil
	r.unhold()
	switch r.h.Opcode {
	case wire.OpWrite:
		if r.wr != nil {
			if !r.sunk {
				r.wrPlaced += r.payload
			}
			r.sunk = false
			if r.h.Last {
				r.endWrite()
			}
		}
	case wire.OpReadResponse:
		r.responsePlaced(&r.h, r.payload)
	case wire.OpReadRequest:
		src := r.src
		r.src = nil
		if r.flush != nil {
			if err := r.flushDone(src); err != nil {
				return err
			}
			src = nil
		}
		r.queueRead(&r.rr, src)
	case wire.OpAtomicRequest:
		a := r.atom
		r.atom = nil
		r.runAtomic(a)
	case wire.OpAtomicResponse:
		r.atomicPlaced()
	default:
		if err := r.sendPlaced(&r.h, r.payload); err != nil {
			return err
		}
	}
	r.fpdus++
	if r.first {
		r.first = false
		q.peerUp.Store(true)
		q.kick()
	}
	return nil
}

// checkHeader applies the checks that come before the opcode's own: DDP
// and RDMAP versions, a known opcode in the right buffer model, and the
// queue number (RFC 5041 §7, RFC 5040 §7).
func checkHeader(h *wire.Header, info *wire.OpInfo) error {
	switch {
	case h.DDPVersion != wire.DDPVersion && h.Tagged:
		return newFault(wire.ErrDDPTaggedVersion, "DDP version %d", h.DDPVersion)
	case h.DDPVersion != wire.DDPVersion:
		return newFault(wire.ErrDDPUntaggedVersion, "DDP version %d", h.DDPVersion)
	case h.RDMAPVersion != wire.RDMAPVersion:
		return newFault(wire.ErrRDMAPVersion, "RDMAP version %d", h.RDMAPVersion)
	}
	switch {
	case !info.Valid:
		return newFault(wire.ErrRDMAPOpcode, "%v", h.Opcode)
	case info.Tagged != h.Tagged:
		return newFault(wire.ErrRDMAPOpcode, "%v in the wrong buffer model", h.Opcode)
	case !h.Tagged && h.QN != info.QN:
		return newFault(wire.ErrDDPInvalidQN, "%v on queue %d", h.Opcode, h.QN)
	case !h.Tagged && !h.Last && !info.Send:
		return newFault(wire.ErrDDPInvalidMO, "%v without the last flag", h.Opcode)
	}
	return nil
}

// hold keeps a hold taken on region for the current placement.
func (r *rxState) hold(region *mem.Region) {
	r.held[r.nheld] = region
	r.nheld++
	if region.File() {
		r.guard = true
	}
}

// unhold ends the holds of the current placement.
func (r *rxState) unhold() {
	for i := range r.nheld {
		r.held[i].UnholdWrite()
		r.held[i] = nil
	}
	r.nheld = 0
	r.guard = false
}

// tagged resolves an RDMA Write's target: the STag, this connection's
// protection domain, the remote-write right and the bounds. The region is
// held for writing before it is judged, so it cannot be deregistered (nor
// snapshotted) in between. The Write's next FPDUs to the same STag skip
// the table's lookup (r.wr) but not the rest: each takes its own hold,
// which fails once Deregister has begun, and is judged again.
func (r *rxState) tagged(h *wire.Header, n int) error {
	q := r.q
	region := r.wr // header forgot any other
	if region == nil {
		var why mem.Reason
		if region, why = q.cfg.Table.LookupHoldWrite(mem.STag(h.STag)); why != mem.OK {
			return newFault(ddpTaggedError(why), "Write of %d bytes to STag %#08x TO %#x", n, h.STag, h.TO)
		}
		r.wr = region
	} else if !region.TryHoldWrite() {
		return newFault(wire.ErrDDPInvalidSTag, "Write of %d bytes to STag %#08x TO %#x, deregistered", n, h.STag, h.TO)
	}
	r.hold(region)
	if why := region.CheckRemote(q.cfg.PD, mem.RemoteWrite, h.TO, uint64(n)); why != mem.OK {
		return newFault(ddpTaggedError(why), "Write of %d bytes to STag %#08x TO %#x", n, h.STag, h.TO)
	}
	sem, _ := region.Semantics(mem.STag(h.STag).Key())
	if sem == mem.Durable {
		r.durable = true
	}
	r.region = region // this FPDU's (durablePlaced)
	r.dst, r.sunk = region.RemoteWriteSlices(r.dst, sem, h.TO-region.Addr(), uint64(n))
	return nil
}

// addPlaced adds the bytes placed in the Write's target to its Placed
// count.
func (r *rxState) addPlaced() {
	if r.wrPlaced > 0 {
		r.wr.AddPlaced(r.wrPlaced)
		r.wrPlaced = 0
	}
}

// endWrite forgets the Write's target, its placed bytes counted.
func (r *rxState) endWrite() {
	if r.wr != nil {
		r.addPlaced()
		r.wr = nil
	}
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
	case o.atomic:
		return newFault(wire.ErrRDMAPOpcode, "Read Response where an Atomic Response is due")
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
		if !o.sge.MR.TryHoldWrite() {
			return newFault(wire.ErrDDPInvalidSTag, "Read Response to STag %#08x, deregistered", h.STag)
		}
		r.hold(o.sge.MR)
		r.dst = o.sge.MR.WriteSlices(r.dst, uint64(o.sge.Offset+o.placed), uint64(n))
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
	if o.sge.Length >= quietRead {
		q.largeReads.Add(-1)
	}
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
	// An ORQ slot is free: a send queue that waits for one (ORD reached,
	// or a fenced request) may go on. With nothing on it left to send, the
	// transmit path would only build an empty batch: 3 % of a client's CPU
	// time reading 4 KiB values at 16 in flight.
	if q.sqTx == q.sqTail {
		q.mu.Unlock()
		return
	}
	q.kickLocked()
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
		if f, ok := wire.AsFlush(&rr); ok {
			region, err := r.flushRequest(f)
			return rr, region, err
		}
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
	if region.File() {
		if err := readFile(region, &rr, &r.fileChk); err != nil {
			region.Unhold()
			return rr, nil, err
		}
	}
	region.AddRead()
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
		e.sem, _ = region.Semantics(mem.STag(rr.SourceSTag).Key())
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
	if e.size >= quietRead {
		q.largeReads.Add(1)
	}
	if e.size <= inlineResponse {
		// The driver answers before it reads again (see answerDue), from
		// its own goroutine if the role is free: the Read Requests that
		// one read brought leave in one transmit, not one each.
		r.answer = true
		q.mu.Unlock()
	} else {
		q.kickAsyncLocked() // a long answer must not hold up the receive path
	}
}

// answerDue reports, and forgets, that Read Responses wait for the
// transmit path to be started: the driver starts it before it reads again
// or leaves the path. A read brings several Requests when the peer keeps
// many in flight, and a system call per Response was a third of the
// transmissions (issue 7, defect 8).
func (r *rxState) answerDue() bool {
	a := r.answer
	r.answer = false
	return a
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
// list for writing. It reports false, holding none, if one is being deregistered.
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
		switch {
		case slices.Contains(r.held[:r.nheld], s.MR):
			// Held by this placement already: no snapshot can be taken
			// meanwhile, and waiting for one would wait for ourselves.
			s.MR.HoldWrite()
		case !s.MR.TryHoldWrite():
			r.unhold()
			return false
		}
		r.hold(s.MR)
		n -= min(n, s.Length-off)
		off = 0
	}
	return true
}

// sgeSlices appends the memory of [off, off+n) of an SGE list, to be
// written (see mem.Region.WriteSlices).
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
		dst = s.MR.WriteSlices(dst, uint64(s.Offset+off), uint64(k))
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
	if h.Opcode.Info().Extra == wire.ImmediateLen {
		c.Imm, c.WithImm = uint32(r.imm), true
	}
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
	// Entries past nsge are zero already: clear only what was used (the
	// whole array is 192 bytes of pointers, cleared with write barriers).
	for i := range e.nsge {
		e.sges[i].MR.Release()
		e.sges[i] = SGE{}
	}
	q.rqHead++
	if !q.cfg.RecvCQ.push(&c, true) {
		q.overrunLocked()
	}
	return nil
}

// terminate parses a staged Terminate FPDU of total bytes and returns it
// as an error.
func (r *rxState) terminate(total int) error {
	f, _, err := wire.ParseFPDU(r.buf[r.r:r.r+total], r.crc)
	if err != nil {
		return newFault(wire.ErrMPACRC, "in a Terminate")
	}
	t, _, err := wire.ParseTerminate(f.ULPDU[r.hdrLen:])
	if err != nil {
		return newFault(wire.ErrDDPCatastrophic, "malformed Terminate")
	}
	t.Rest = append([]byte(nil), t.Rest...)
	r.r += total
	return &peerTerminate{t: t}
}
