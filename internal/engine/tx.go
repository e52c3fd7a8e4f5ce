package engine

import (
	"encoding/binary"
	"errors"
	"syscall"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

const (
	// txArena holds the headers and trailers of one batch.
	txArena = 64 << 10
	// maxFPDUOverhead is the most arena bytes one FPDU takes: length,
	// untagged header, the largest RDMAP body (a Terminate echoing a Read
	// Request), pad and CRC.
	maxFPDUOverhead = 2 + wire.UntaggedHeaderLen + 4 + 2 + wire.UntaggedHeaderLen + wire.ReadRequestLen + wire.MaxTrailerLen
	// maxBatchBytes bounds one gathered write, so completions and Read
	// Responses are not held back behind a huge batch.
	maxBatchBytes = 1 << 20
	// irqBurst is how many Read Responses go out in a row while the send
	// queue has work waiting (siw: 4).
	irqBurst = 4
)

// txState is the transmit path's state, owned by whoever holds the
// transmit role. A batch is a list of vectors (headers and trailers in the
// arena, payload straight from registered memory) written with gathered
// writes until it is gone; then the next batch is built.
type txState struct {
	q    *QP
	link Link
	crc  bool

	// bufs backs iov, recs, holds and arena while the queue pair has a
	// batch (see take): a queue pair that is not transmitting holds none.
	// mini backs them instead for a batch of one small message, whose
	// payload is copied into the arena (see txMini).
	bufs   *txBufs
	mini   txMini
	inMini bool
	// fCopied is the payload of the FPDU being framed copied into the
	// arena, after its header (see copyIn).
	fCopied int
	iov     [][]byte
	first   int // first vector not fully written
	// recs are the indexes in iov, counted from recBase, where records end
	// (see place, fit and endRecord). recFirst is the first record not
	// yet written, recFPDUs the FPDUs in the open record (where FPDUs fill
	// segments: the small ones in the open segment), recBytes its bytes
	// (where FPDUs fill segments: in its full segments), segFill the bytes
	// in its open segment where FPDUs fill segments.
	recs     []int
	recBase  int // the vector recs are counted from: t.first at the last write
	recFirst int
	recFPDUs int
	recBytes int
	segFill  int
	// segEnds are the indexes in iov where segments end inside records,
	// where FPDUs fill segments; segDone says the FPDU being framed fills
	// its segment (see place and realign).
	segEnds []int
	segDone bool
	// straddle says the FPDU fit let through crosses a segment's end.
	straddle bool
	cutOff   int // bytes of iov[first] written
	arena    []byte
	lastEnd  int    // arena offset where the last vector ends, -1 if it is not in the arena
	left     int    // bytes of the batch not yet written
	written  uint64 // bytes the socket has taken, ever
	built    uint64 // stream offset at the end of the batch

	// holds are the regions the batch's payload vectors point into, each
	// held (mem.Region.Hold) until the batch is written or dropped: a
	// flush unpins work requests while their bytes may still be going
	// out, and Deregister must wait for those. Consecutive vectors of one
	// region share a hold, so there are no more holds than vectors.
	holds []*mem.Region
	// fileBatch: a region held is a file's mapping, so the CRC over the
	// payload is computed with faults recovered (crcGuarded).
	fileBatch bool

	// Segmentation of the send-queue entry at sqTx.
	off     int // message bytes framed
	sge     int // SGE index and offset of the next payload byte
	sgeOff  int
	readIdx int  // Reads: next SGE to request
	immDue  bool // a Write with immediate data: the Write is framed, the Immediate Data not yet

	msn      [4]uint32 // last MSN sent per queue number
	burst    int
	rtrSent  bool
	fStart   int  // arena offset of the FPDU being built
	fFirst   int  // its first payload vector
	termSent bool // a Terminate is in the batch: close after it

	maxTagged, maxUntagged int  // payload bytes per full FPDU
	seg                    int  // bytes of a full FPDU
	align                  bool // FPDUs fill TCP segments exactly
	segLen                 int  // where they do, the bytes of a segment
	// recMax bounds the bytes of a record where full FPDUs do not fill
	// segments (the MSS, 0 where unknown), read again when the stream has
	// passed mssNext.
	recMax  int
	mssNext uint64
	grow    bool // full FPDUs follow recMax
	// holder is the link, if it may hold bytes back (see holder);
	// heldWait says it still holds some after Flush.
	holder   holder
	heldWait bool
}

// holder is a Link that may hold back bytes a Writev was given, the end
// of a segment it expects more writes to fill (Linux: TCP_CORK).
type holder interface {
	// Held reports whether it may hold bytes back now.
	Held() bool
	// Flush sends them when it can, and reports whether it still holds
	// some: those wait for the peer's window, and the caller calls Flush
	// again later.
	Flush() bool
}

// alignMaxSeg is the largest TCP segment that full FPDUs fill exactly:
// real links' (jumbo frames included). Beyond it is loopback, whose MSS
// grows as the peer's window does (TCP bounds it by half the largest window
// seen: 32741 at first, 65483 later) and whose segments TCP fills with
// whatever it has; records of whole FPDUs of at most the MSS keep FPDUs
// inside segments there (see place).
const alignMaxSeg = 16 << 10

// txBufs are the arrays of one batch at their largest (112 KiB). The
// transmit path takes them to build a batch and gives them back when it
// has nothing left to send (see freeList).
type txBufs struct {
	iov     [][]byte
	recs    []int
	segEnds []int
	holds   []*mem.Region
	arena   []byte
}

var txFree = newFreeList(1024, func() *txBufs {
	return &txBufs{
		iov:     make([][]byte, 0, maxIov),
		recs:    make([]int, 0, maxIov),
		segEnds: make([]int, 0, maxIov),
		holds:   make([]*mem.Region, 0, maxIov),
		arena:   make([]byte, 0, txArena),
	}
})

// txMini are the arrays of a batch of one small message (at most
// miniPayload bytes, and nothing else to send), which the queue pair
// keeps: its FPDU is framed whole in the arena, payload copied after the
// header, and goes out as one buffer (see fdLink.Writev). In a ping-pong
// of 8-byte Writes the free list's get and put, the vectors pointing
// into registered memory, their holds and the write's msghdr cost about
// 0.1 µs a round trip, most of them cache misses after the system calls
// in between.
type txMini struct {
	iov     [miniIov][]byte
	recs    [miniIov]int
	segEnds [miniIov]int
	holds   [miniIov]*mem.Region
	arena   [miniArena]byte
}

const (
	// miniPayload is the largest message a mini batch takes.
	miniPayload = 152
	// miniIov holds one FPDU's vectors, as room asks.
	miniIov = MaxSGE + 3
	// miniArena holds an RTR or nudge FPDU and the message's.
	miniArena = 2*maxFPDUOverhead + miniPayload
)

// take borrows the batch's arrays, if it has none: the queue pair's own
// for a lone small message (see txMini), else from txFree. The caller
// holds the transmit role and q.mu.
func (t *txState) take() {
	if t.bufs != nil || t.inMini {
		return
	}
	if t.miniFits() {
		m := &t.mini
		t.inMini = true
		t.iov, t.recs, t.segEnds, t.holds, t.arena = m.iov[:0], m.recs[:0], m.segEnds[:0], m.holds[:0], m.arena[:0]
	} else {
		b := txFree.get()
		t.bufs = b
		t.iov, t.recs, t.segEnds, t.holds, t.arena = b.iov[:0], b.recs[:0], b.segEnds[:0], b.holds[:0], b.arena[:0]
	}
	t.first, t.left, t.lastEnd = 0, 0, -1
}

// miniFits reports whether what there is to send is one small message,
// not yet begun (a send-queue entry or a Read Response), or nothing: the
// look for more after a batch went. q.mu is held.
func (t *txState) miniFits() bool {
	q := t.q
	if q.termPending != nil || t.off != 0 || t.readIdx != 0 || t.immDue {
		return false
	}
	sq, irq := q.sqTail-q.sqTx, q.irqTail-q.irqHead
	switch {
	case sq == 0 && irq == 0:
		return true
	case sq == 1 && irq == 0:
		e := &q.sq[q.sqTx%uint64(len(q.sq))]
		return e.length <= miniPayload
	case sq == 0 && irq == 1:
		r := &q.irq[q.irqHead%uint64(len(q.irq))]
		return r.sent == 0 && r.size <= miniPayload
	}
	return false
}

// drop ends the batch's holds and gives its arrays back: it is written,
// or will never be. The caller holds the transmit role, or it was handed
// to a transmit goroutine that has ended.
func (t *txState) drop() {
	t.unholdAll()
	if t.inMini {
		clear(t.iov)
		t.inMini = false
		t.iov, t.recs, t.segEnds, t.holds, t.arena = nil, nil, nil, nil, nil
		t.first, t.left, t.lastEnd = 0, 0, -1
		return
	}
	b := t.bufs
	if b == nil {
		return
	}
	clear(t.iov) // drop the references to registered memory
	t.bufs, t.iov, t.recs, t.segEnds, t.holds, t.arena = nil, nil, nil, nil, nil, nil
	t.first, t.left, t.lastEnd = 0, 0, -1
	txFree.put(b)
}

func (t *txState) init(q *QP, l Link) {
	t.q, t.link, t.crc = q, l, q.params.CRC
	t.holder, _ = l.(holder)
	t.lastEnd = -1
	mss := l.MSS()
	t.recMax, t.mssNext = recLimit(mss), mssEvery
	// On a link with real segments, FPDUs fill them exactly (RFC 5044
	// §4.4), as siw's do: none straddles two segments (see place). TCP
	// cuts at multiples of the MSS, so that must be a multiple of the
	// FPDUs' 4 bytes.
	realLink := mss >= 536 && mss <= alignMaxSeg && mss%4 == 0
	seg := q.params.MaxFPDU
	switch {
	case seg <= 0 && realLink:
		t.align, t.segLen, seg = true, mss, mss
	case seg <= 0:
		// Elsewhere (loopback) a full FPDU fills a record, and grows
		// with it (see build).
		t.grow = t.recMax > 0
		seg = t.recMax
	case realLink && seg <= mss:
		// FPDUs of the size asked for fill segments too: fit cuts one
		// to fill the end of a segment.
		t.align, t.segLen = true, mss
	case realLink:
		// FPDUs larger than a segment cannot lie in one. Records bounded
		// by the MSS would only make each FPDU a buffer of TCP's of its
		// own (with MaxFPDU 8192 over veth, write_bw at a tenth of
		// plain TCP's): the batch goes as one record.
		t.recMax = 0
	}
	if seg <= 0 {
		seg = 64 << 10
	}
	t.setSeg(seg)
}

// setSeg sets the bytes of a full FPDU.
func (t *txState) setSeg(seg int) {
	seg = max(seg, 64)
	if t.align {
		seg &^= 3 // full FPDUs are 4-byte multiples
	} else {
		seg &^= 7
	}
	t.seg = seg
	t.maxTagged = min(seg-2-wire.TaggedHeaderLen-wire.CRCLen, wire.MaxULPDULen-wire.TaggedHeaderLen) &^ 3
	t.maxUntagged = min(seg-2-wire.UntaggedHeaderLen-wire.CRCLen, wire.MaxULPDULen-wire.UntaggedHeaderLen) &^ 3
}

// testHookWritten, when set by a test before a queue pair starts, runs
// in the transmit path after each write, before it looks at what was sent.
var testHookWritten func(*QP)

// transmit runs the transmit path while the caller holds the role. With
// block false (a posting goroutine) it gives the role to the transmit
// goroutine as soon as the socket would block; with block true it waits.
// With locked, the caller holds q.mu, which transmit releases: a post
// that takes the role builds its batch under the lock it posted under,
// one lock operation pair fewer for every message of a ping-pong.
func (q *QP) transmit(block, locked bool) {
	t := &q.tx
	if locked && t.left > 0 {
		q.mu.Unlock()
		locked = false
	}
	for {
		if t.left == 0 {
			if t.inMini {
				t.drop() // what comes next may want a whole batch
			} else {
				t.unholdAll()
			}
			if !locked {
				q.mu.Lock()
			}
			locked = false
			t.take()
			q.markSentLocked()
			if t.termSent {
				t.termSent = false
				t.drop()
				q.releaseTxLocked()
				q.mu.Unlock()
				q.closeAfterTerm()
				q.termOver()
				return
			}
			t.build()
			if t.left == 0 && !t.heldWait && t.holder != nil && t.holder.Held() {
				// Nothing more to write: the bytes held back must go, once
				// the peer's window has room for them (see fdLink.Writev).
				// Look again after: posts may have come meanwhile.
				q.mu.Unlock()
				t.heldWait = t.holder.Flush()
				continue
			}
			if t.left == 0 {
				held := t.heldWait
				t.heldWait = false
				t.drop()
				closeLink := q.releaseTxLocked()
				if !held {
					q.heldPoll = 0
				}
				q.txHeld = held && q.State() != StateError
				if (q.cfg.Completion == Acked && q.sqDone < q.sqTx) || q.txHeld {
					// The transmit goroutine watches the acknowledgements
					// still to come, or the window. (Started whenever in
					// Acked mode, it ran once per post, a goroutine and a
					// wake-up each, when the peer had acknowledged all.)
					q.startTxLocked()
				}
				q.mu.Unlock()
				if closeLink {
					q.link.Close()
				}
				return
			}
			q.mu.Unlock()
		}
		n, err := q.link.Writev(t.iov[t.first:], t.records(), block)
		if testHookWritten != nil {
			testHookWritten(q)
		}
		t.heldWait = false
		if err != nil {
			if errors.Is(err, errWouldBlock) {
				if block {
					continue
				}
				q.mu.Lock()
				q.handTxLocked() // the transmit goroutine takes the role over
				q.mu.Unlock()
				return
			}
			t.termSent = false
			t.drop()
			q.mu.Lock()
			q.termPending = nil // a Terminate queued meanwhile cannot leave
			closeLink := q.releaseTxLocked()
			term := q.termDone != nil
			q.mu.Unlock()
			if !errors.Is(err, syscall.EPIPE) || !q.failAborted(linkErr(err), false) {
				q.fail(linkErr(err))
			}
			if closeLink {
				q.link.Close()
			}
			if term {
				q.termOver()
			}
			return
		}
		t.advance(n)
		if t.left > 0 && t.align {
			t.realign()
		}
	}
}

// hold holds region for the batch, unless the last hold is of it already.
// The caller holds a pin or a hold on region (see mem.Region.Hold).
func (t *txState) hold(region *mem.Region) {
	if n := len(t.holds); n > 0 && t.holds[n-1] == region {
		return
	}
	region.Hold()
	t.holds = append(t.holds, region)
	if region.File() {
		t.fileBatch = true
	}
}

// unholdAll ends the batch's holds: it is written, or will never be.
func (t *txState) unholdAll() {
	for i, r := range t.holds {
		r.Unhold()
		t.holds[i] = nil
	}
	t.holds = t.holds[:0]
	t.fileBatch = false
}

// advance consumes n written bytes from the batch.
func (t *txState) advance(n int) {
	t.left -= n
	t.written += uint64(n)
	for n > 0 {
		v := t.iov[t.first]
		if n < len(v) {
			t.iov[t.first] = v[n:]
			t.cutOff += n
			return
		}
		n -= len(v)
		t.iov[t.first] = nil
		t.first++
		t.cutOff = 0
	}
}

// markSentLocked marks Sends and Writes done whose bytes the socket has
// taken (Handed) or the peer has acknowledged (Acked), and retires them.
func (q *QP) markSentLocked() {
	t := &q.tx
	if q.sqDone == q.sqTx {
		return
	}
	limit := t.written
	if q.cfg.Completion == Acked {
		un, err := q.link.Unacked()
		switch {
		case err == nil && uint64(un) <= limit:
			limit -= uint64(un)
		case !errors.Is(err, errors.ErrUnsupported):
			return // closed: what the peer acknowledged is unknown
		}
	}
	for q.sqDone < q.sqTx {
		e := &q.sq[q.sqDone%uint64(len(q.sq))]
		if !e.wr.Op.waits() {
			if !e.framed || e.endOff > limit {
				break
			}
			e.done = true
		}
		q.sqDone++
	}
	q.retireLocked(false)
}

// mssEvery is how many bytes go out between two looks at the MSS where
// records are bounded by it (see place).
const mssEvery = 1 << 20

// recLimit returns the most bytes a record may hold on a link whose
// TCP_MAXSEG reads mss, 0 where that is unknown. It leaves room for TCP's
// options (40 bytes at most), which can differ between the MSS read and
// the segment sent: on a namespace's loopback a record of the 32768 bytes
// read went out as 32756 and 12.
func recLimit(mss int) int {
	return max(mss-40, 0) &^ 3
}

// build fills an empty batch from the queues; q.mu is held.
func (t *txState) build() {
	q := t.q
	if t.recMax > 0 && !t.align && t.written >= t.mssNext {
		if mss := t.link.MSS(); mss > 0 {
			t.recMax = recLimit(mss)
			if t.grow {
				t.setSeg(t.recMax)
			}
		}
		t.mssNext = t.written + mssEvery
	}
	t.iov, t.first, t.arena, t.lastEnd, t.left = t.iov[:0], 0, t.arena[:0], -1, 0
	t.recs, t.recBase, t.recFirst, t.recFPDUs, t.recBytes, t.segFill = t.recs[:0], 0, 0, 0, 0, 0
	t.segEnds, t.segDone, t.cutOff, t.straddle = t.segEnds[:0], false, 0, false
	if q.termPending != nil {
		t.frameTerminate(q.termPending)
		q.termPending = nil
		t.termSent = true
		return
	}
	if s := q.State(); s != StateReady && s != StateClosing {
		return
	}
	if q.params.SendRTR != 0 && !t.rtrSent {
		if !t.frameRTR() {
			return
		}
		t.rtrSent = true
	}
	if q.nudgeDue {
		q.nudgeDue = false
		q.nudges.Add(1)
		t.frameNudge()
	}
	if !q.peerUp.Load() {
		return // a responder speaks only after the initiator's first FPDU
	}
	for t.room() {
		sqWork := q.sqTx < q.sqTail
		if q.irqHead < q.irqTail && (!sqWork || t.burst < irqBurst) {
			t.burst++
			t.frameReadResponse()
			continue
		}
		t.burst = 0
		if !sqWork || !t.frameSQ() {
			break
		}
	}
}

// room reports whether another FPDU fits the batch.
func (t *txState) room() bool {
	return len(t.iov)+MaxSGE+3 <= cap(t.iov) && len(t.arena)+maxFPDUOverhead <= cap(t.arena) && t.left < maxBatchBytes
}

// addArena appends arena[start:end] to the vectors, merging it with the
// previous vector when that ends where this starts.
func (t *txState) addArena(start, end int) {
	if t.lastEnd == start && len(t.iov) > t.first {
		last := &t.iov[len(t.iov)-1]
		*last = (*last)[:len(*last)+end-start]
	} else {
		t.iov = append(t.iov, t.arena[start:end:cap(t.arena)])
	}
	t.lastEnd = end
}

// begin starts an FPDU with n payload bytes in the batch: the length field
// (filled in by end), the header h and the RDMAP body that body appends, if
// any. The caller then appends the payload vectors and calls end.
func (t *txState) begin(h *wire.Header, body func([]byte) []byte, n int) {
	t.fStart = len(t.arena)
	t.arena = t.arena[:t.fStart+2]
	t.arena = h.Append(t.arena)
	if body != nil {
		t.arena = body(t.arena)
	}
	t.place(wire.FPDULen(len(t.arena) - t.fStart - 2 + n))
	t.addArena(t.fStart, len(t.arena))
	t.fFirst = len(t.iov)
}

// place puts the FPDU of sz bytes about to be framed in a record.
//
// Where full FPDUs fill segments (real links), TCP cuts a record at
// multiples of the MSS from its start (a record, a sendmsg with MSG_EOR,
// starts a buffer of its own, and TCP fills buffers to a multiple of the
// MSS): FPDUs packed one after the other, none across a multiple of the
// segment (see fit), each lie in one segment, whatever messages they
// belong to. So a record need only end where the batch does, and where an
// FPDU that cannot be cut does not fit the open segment. A record per
// message instead (as siw sends one) left each message's last segment
// short and cost TCP a buffer per message, and over veth held write_bw at
// about 0.75 of plain TCP's. At most maxSmallPerSegment small FPDUs go in
// one segment: tools that dissect iWARP give up on frames with dozens.
//
// Elsewhere (loopback) it ends the open record first if the FPDU would
// take it past recMax bytes or maxSmallPerSegment FPDUs. Linux TCP puts a
// record of at most its MSS (its size goal is at least that) in one buffer
// of its own (MSG_EOR), and sends that buffer as one segment, whole,
// whatever the window (it waits until the segment fits): so every FPDU
// lies in one segment, and each segment starts with one, as RFC 5044 §4.4
// asks and as tools that dissect iWARP assume once a capture has missed a
// packet. A longer record would be cut wherever the segment ends:
// loopback's holds up to 64 KiB, or what the peer's window has room for.
func (t *txState) place(sz int) {
	if t.straddle {
		// A message of one FPDU across two segments (see fit): TCP's
		// segments stay where they were, and the FPDUs after it fit them.
		t.straddle = false
		t.segFill += sz - t.segLen
		t.recBytes += t.segLen
		t.recFPDUs = 0
		return
	}
	if t.align {
		small := sz*maxSmallPerSegment < t.segLen
		if t.segFill+sz > t.segLen || small && t.recFPDUs == maxSmallPerSegment {
			t.endRecord()
		}
		if small {
			t.recFPDUs++
		}
		t.segFill += sz
		if t.segFill == t.segLen {
			t.segFill, t.recFPDUs, t.segDone = 0, 0, true
		}
		return
	}
	if t.recMax <= 0 {
		return
	}
	if t.recFPDUs > 0 && (t.recBytes+sz > t.recMax || t.recFPDUs == maxSmallPerSegment) {
		t.endRecord()
	}
	t.recBytes += sz
	t.recFPDUs++
}

// addSGEs appends n payload bytes from sges, from the cursor (t.sge, t.sgeOff) on.
func (t *txState) addSGEs(sges []SGE, n int) {
	for n > 0 {
		s := &sges[t.sge]
		k := min(n, s.Length-t.sgeOff)
		if k > 0 && !t.copyIn(s.MR, k) {
			t.hold(s.MR) // the work request pins it
			t.iov = s.MR.Slices(t.iov, uint64(s.Offset+t.sgeOff), uint64(k))
			t.lastEnd = -1
		} else if k > 0 {
			t.copyTail(s.MR, false, 0, uint64(s.Offset+t.sgeOff), k)
		}
		n -= k
		t.sgeOff += k
		if t.sgeOff == s.Length {
			t.sge++
			t.sgeOff = 0
		}
	}
}

// copyIn reports whether k payload bytes of region go into a mini batch's
// arena, right after what the FPDU has there (see txMini), rather than
// as vectors into the region, held: not a file's mapping, whose pages
// may fault (see crcGuarded), and only where the arena has room. The
// caller appends the region's slices to iov and calls copyTail.
func (t *txState) copyIn(region *mem.Region, k int) bool {
	return t.inMini && t.lastEnd == len(t.arena) && len(t.arena)+k+wire.MaxTrailerLen <= cap(t.arena) && !region.File()
}

// copyTail copies k bytes of region from off (a peer's Read's through
// RemoteSlices, with sem, if remote) into the arena, joining the FPDU's
// vector there. It takes the region's pieces a few at a time, not into
// iov, whose mini arrays hold an FPDU's vectors only when a region is one
// buffer: a small message from a region of many would grow them at every
// post.
func (t *txState) copyTail(region *mem.Region, remote bool, sem mem.Semantics, off uint64, k int) {
	start := len(t.arena)
	t.arena = t.arena[:start+k]
	p := start
	var few [4][]byte
	for left := uint64(k); left > 0; {
		var c uint64
		var vs [][]byte
		if remote {
			c, _ = region.RemoteSlicesFit(sem, off, left, len(few))
			vs = region.RemoteSlices(few[:0], sem, off, c)
		} else {
			c, _ = region.SlicesFit(off, left, len(few))
			vs = region.Slices(few[:0], off, c)
		}
		for _, v := range vs {
			p += wireCopy(t.arena[p:], v) // as the kernel would copy it, out of the race detector's sight
		}
		off, left = off+c, left-c
	}
	t.addArena(start, len(t.arena))
	t.fCopied += k
}

// vecFit cuts n, the payload of the next FPDU from the cursor in sges, to
// what the batch's vectors can still take: Slices gives a vector for each
// buffer of a region, and the vectors must never grow (each growth would
// allocate, and again with the next batch). room leaves one vector for
// each SGE, all a region of one buffer needs. A mini batch copies memory
// into its arena (see copyIn), and a file's mapping is one buffer. It
// comes before fit, which never lengthens an FPDU and, where FPDUs fill
// segments, must see the length that goes (a whole message's FPDU that it
// lets straddle a segment must be that whole message).
func (t *txState) vecFit(sges []SGE, n int) int {
	if t.inMini {
		return n
	}
	budget := cap(t.iov) - len(t.iov) - 3 // and the FPDU's header and trailer
	sge, off, got := t.sge, t.sgeOff, 0
	for got < n && sge < len(sges) {
		s := &sges[sge]
		k := min(n-got, s.Length-off)
		c, used := s.MR.SlicesFit(uint64(s.Offset+off), uint64(k), budget)
		got += int(c)
		if int(c) < k {
			break
		}
		budget -= used
		sge, off = sge+1, 0
	}
	return got
}

// end completes the FPDU begun last, whose payload is n bytes: it fills in
// the length, and appends pad and CRC.
func (t *txState) end(n int) {
	hdr := t.arena[t.fStart:]
	ulen := len(hdr) - 2 + n - t.fCopied
	t.fCopied = 0
	binary.BigEndian.PutUint16(hdr, uint16(ulen))
	var crc uint32
	if t.crc && t.fileBatch {
		crc = crcGuarded(wire.UpdateCRC32c(0, hdr), t.iov[t.fFirst:])
	} else if t.crc {
		crc = wire.UpdateCRC32c(0, hdr)
		for _, v := range t.iov[t.fFirst:] {
			crc = wire.UpdateCRC32c(crc, v)
		}
	}
	ts := len(t.arena)
	tr := wire.PutTrailer(t.arena[ts:ts+wire.MaxTrailerLen], ulen, crc, t.crc)
	t.arena = t.arena[:ts+len(tr)]
	t.addArena(ts, len(t.arena))
	t.left += wire.FPDULen(ulen)
	t.built = t.written + uint64(t.left)
	if t.segDone {
		t.segDone = false
		t.recBytes += t.segLen
		switch {
		case t.recBytes+t.segLen > maxAlignedRecord:
			t.endRecord()
		case len(t.segEnds) < cap(t.segEnds):
			t.segEnds = append(t.segEnds, len(t.iov))
			t.lastEnd = -1 // the next header starts a vector, where realign can end a record
		}
	}
}

// realign follows a write the socket took only part of, where FPDUs fill
// segments. TCP sends the segment it was filling short then (it pushes
// what it has before it waits for room), and the rest of the record
// would go out shifted off the segments its FPDUs were fitted to, each
// straddling two (over veth, with a record per message, 30-45 % of
// write_bw's segments did). Ending a record where the cut segment ends
// puts TCP back on the FPDUs' grid, whether it sent the short segment (the
// rest of it goes as one of its own) or not yet (the rest fills it up).
// Only the FPDU the write cut lies across two segments.
func (t *txState) realign() {
	i := 0
	for i < len(t.segEnds) && t.segEnds[i] <= t.first {
		if t.segEnds[i] == t.first && t.cutOff == 0 {
			return // the write stopped where a segment ends
		}
		i++
	}
	if i == len(t.segEnds) {
		return // the batch ends the segment, and a record with it
	}
	end := t.segEnds[i] - t.recBase
	r := t.recFirst
	for r < len(t.recs) && t.recs[r] < end {
		r++
	}
	if r < len(t.recs) && t.recs[r] == end || len(t.recs) == cap(t.recs) {
		return
	}
	t.recs = append(t.recs, 0)
	copy(t.recs[r+1:], t.recs[r:])
	t.recs[r] = end
}

// maxSmallPerSegment bounds the small FPDUs in one TCP segment.
const maxSmallPerSegment = 8

// records returns the ends of the unwritten records, relative to t.first.
func (t *txState) records() []int {
	if d := t.first - t.recBase; d > 0 {
		// Only after a short write: rebase what is left on t.first.
		for t.recFirst < len(t.recs) && t.recs[t.recFirst] <= d {
			t.recFirst++
		}
		for i := t.recFirst; i < len(t.recs); i++ {
			t.recs[i] -= d
		}
		t.recBase = t.first
	}
	return t.recs[t.recFirst:]
}

// fit returns the payload of the next FPDU of a message, at most n bytes
// of the left still to frame, with a header of hdr bytes.
//
// Where full FPDUs fill segments, one of a message of several that would
// cross into the next segment is cut to fill the open one, unless less
// than minSegPiece would go in it, when the record (and so the segment)
// ends instead (see place). A message of one FPDU is not cut (first says
// the FPDU is a message's first).
//
// Where records are bounded by the MSS (loopback), one that would overflow
// the open record is cut to fill it, unless little room is left, when the
// record is ended instead. So loopback's records, and segments, are full:
// a 64 KiB message takes about one, as it does over plain TCP, not two or
// three. No cut leaves a piece of less than minPiece (see there).
func (t *txState) fit(n, left, hdr int, first bool) int {
	if t.align {
		r := t.segLen - t.segFill
		if wire.FPDULen(hdr+n) <= r {
			return n
		}
		if first && n == left {
			// A message of one FPDU goes whole, where it falls: cut in two
			// to fit, 512-byte Sends over veth went at 0.6-0.8 of the rate
			// (a third more FPDUs), and a record ended before it (a short
			// segment and a buffer of TCP's each) at 0.4.
			// A small one ends the record instead, as it would every
			// maxSmallPerSegment.
			if wire.FPDULen(hdr+n)*maxSmallPerSegment < t.segLen {
				t.endRecord()
			} else {
				t.straddle = true
			}
			return n
		}
		if room := (r - 2 - hdr - wire.CRCLen) &^ 3; room >= minSegPiece {
			return min(n, room)
		}
		t.endRecord()
		return n
	}
	if t.recMax <= 0 {
		return n
	}
	if t.recBytes > 0 && wire.FPDULen(hdr+n) > t.recMax-t.recBytes {
		room := (t.recMax - t.recBytes - 2 - hdr - wire.CRCLen) &^ 3
		if left-room < minPiece {
			room = (left - minPiece) &^ 3 // the rest goes whole into the next record
		}
		if t.recFPDUs < maxSmallPerSegment && room >= max(t.recMax/16, minPiece) {
			return min(n, room)
		}
		t.endRecord()
	}
	if rest := left - n; rest > 0 && rest < minPiece && left >= 2*minPiece {
		return (left - minPiece) &^ 3
	}
	return n
}

// maxAlignedRecord bounds the bytes of a record where FPDUs fill
// segments. A write the socket takes only part of makes TCP send the
// segment it was filling short, and the rest of that record is then cut
// off the segments its FPDUs were fitted to: a bound keeps that to about
// one of TCP's own 64 KiB buffers.
const maxAlignedRecord = 64 << 10

// minSegPiece is the least payload fit puts in an FPDU cut to fill the end
// of a segment: below it a short segment costs less than one more FPDU.
const minSegPiece = 64

// minPiece is the least payload fit leaves in either piece of a message it
// cuts. The receiver reads a payload shorter than about that through its
// staging buffer, and with it whatever follows in the socket, so a runt
// cut from one message in front of the next message's long FPDU made the
// receiver copy nearly every byte twice: on loopback, where records cut
// messages at the MSS, 4.4 % of write_bw's CPU in that copy and 40 % more
// CPU per byte than plain TCP.
const minPiece = 4 << 10

// frame appends a whole FPDU whose payload is n bytes of sges from the cursor.
func (t *txState) frame(h *wire.Header, body func([]byte) []byte, sges []SGE, n int) {
	t.begin(h, body, n)
	t.addSGEs(sges, n)
	t.end(n)
}

func header(op wire.Opcode) wire.Header {
	return wire.Header{Opcode: op, Tagged: op.Info().Tagged, DDPVersion: wire.DDPVersion, RDMAPVersion: wire.RDMAPVersion, QN: op.Info().QN}
}

// segment returns the payload of the FPDU at offset off of a message of
// length total, with at most max bytes per FPDU. A message that needs k
// FPDUs is cut into k nearly equal ones (4-byte multiples but the last),
// rather than full ones and a runt, each of which the receiver reads
// straight into place. It serves links whose MSS is unknown; where it is
// known, FPDUs fill segments or records (see cut).
func segment(max, total, off int) int {
	left := total - off
	if left <= max {
		return left
	}
	k := (left + max - 1) / max
	return min(max, ((left+k-1)/k+3)&^3)
}

// cut returns the payload of the FPDU at offset off of a message of length
// total: full FPDUs and a shorter last one where the MSS is known (FPDUs
// fill segments, or records: see fit), nearly equal ones otherwise.
func (t *txState) cut(max, total, off int) int {
	if t.align || t.recMax > 0 {
		return min(max, total-off)
	}
	return segment(max, total, off)
}

// endRecord ends a record (a sendmsg with MSG_EOR) at the end of the batch.
func (t *txState) endRecord() {
	t.recs = append(t.recs, len(t.iov))
	t.recFPDUs, t.recBytes, t.segFill = 0, 0, 0
	t.lastEnd = -1 // the next header must not join this record
}

// sgl returns the entry's SGEs.
func (e *sqEntry) sgl() []SGE {
	if e.pre != nil {
		return e.pre.sges[:e.pre.nsge]
	}
	return e.sges[:e.nsge]
}

// beginTmpl starts an FPDU with n payload bytes whose header comes from a
// template.
func (t *txState) beginTmpl(tm *headerTmpl, last bool, to uint64, msn, mo uint32, n int) {
	t.fStart = len(t.arena)
	t.arena = putTmpl(t.arena[:t.fStart+2], tm, last, to, msn, mo)
	t.place(wire.FPDULen(len(t.arena) - t.fStart - 2 + n))
	t.addArena(t.fStart, len(t.arena))
	t.fFirst = len(t.iov)
}

// frameSQ frames FPDUs of the entry at sqTx until it is framed or the
// batch is full. It reports false when the entry must wait (ORQ full, or a
// fence on outstanding Reads).
func (t *txState) frameSQ() bool {
	q := t.q
	e := &q.sq[q.sqTx%uint64(len(q.sq))]
	if t.off == 0 && t.readIdx == 0 && e.wr.Flags&Fence != 0 && q.orqHead != q.orqTail {
		return false
	}
	sges := e.sgl()
	switch e.wr.Op {
	case OpFlush:
		return t.frameFlush(e)
	case OpWriteImm:
		return t.frameWriteImm(e, sges)
	case OpSendImm:
		return t.frameSendImm(e, sges)
	case OpFetchAdd, OpCmpSwap, OpAtomicWrite:
		return t.frameAtomic(e, sges)
	case OpWrite:
		for t.room() {
			n := t.fit(t.vecFit(sges, t.cut(t.maxTagged, e.length, t.off)), e.length-t.off, wire.TaggedHeaderLen, t.off == 0)
			last := t.off+n == e.length
			to := e.wr.RemoteAddr + uint64(t.off)
			if e.tmpl.n > 0 {
				t.beginTmpl(&e.tmpl, last, to, 0, 0, n)
			} else {
				h := header(wire.OpWrite)
				h.Last, h.STag, h.TO = last, e.wr.RKey, to
				t.begin(&h, nil, n)
			}
			t.addSGEs(sges, n)
			t.end(n)
			t.off += n
			if last {
				t.finish(e)
				return true
			}
		}
	case OpSend, OpSendInv:
		if t.off == 0 {
			t.msn[wire.QNSend]++
			e.msn = t.msn[wire.QNSend]
		}
		for t.room() {
			n := t.fit(t.vecFit(sges, t.cut(t.maxUntagged, e.length, t.off)), e.length-t.off, wire.UntaggedHeaderLen, t.off == 0)
			last := t.off+n == e.length
			if e.tmpl.n > 0 {
				t.beginTmpl(&e.tmpl, last, 0, e.msn, uint32(t.off), n)
			} else {
				h := header(sendOpcode(&e.wr))
				h.Last, h.MSN, h.MO = last, e.msn, uint32(t.off)
				if e.wr.Op == OpSendInv {
					h.RsvdULP = e.wr.InvalidateSTag
				}
				t.begin(&h, nil, n)
			}
			t.addSGEs(sges, n)
			t.end(n)
			t.off += n
			if last {
				t.finish(e)
				return true
			}
		}
	case OpRead:
		to := e.wr.RemoteAddr
		for i := range t.readIdx {
			to += uint64(sges[i].Length)
		}
		for t.room() {
			if q.orqTail-q.orqHead == uint64(len(q.orq)) {
				return false // ORD reached: the send queue waits for a response
			}
			var s SGE
			if t.readIdx < len(sges) {
				s = sges[t.readIdx]
			}
			o := &q.orq[q.orqTail%uint64(len(q.orq))]
			*o = orqEntry{sq: e, sge: s}
			if s.Length >= quietRead {
				q.largeReads.Add(1)
			}
			if s.MR != nil {
				o.sinkSTag, o.sinkTO = uint32(s.MR.STag()), s.MR.Addr()+uint64(s.Offset)
			}
			q.orqTail++
			t.msn[wire.QNRead]++
			if t.readIdx == 0 {
				e.msn = t.msn[wire.QNRead]
			}
			if e.tmpl.n > 0 {
				t.beginTmpl(&e.tmpl, true, 0, t.msn[wire.QNRead], 0, 0)
			} else {
				rr := wire.ReadRequest{SinkSTag: o.sinkSTag, SinkTO: o.sinkTO, Size: uint32(s.Length), SourceSTag: e.wr.RKey, SourceTO: to}
				h := header(wire.OpReadRequest)
				h.Last, h.MSN = true, t.msn[wire.QNRead]
				t.begin(&h, rr.Append, 0)
			}
			t.end(0)
			to += uint64(s.Length)
			t.readIdx++
			if t.readIdx >= len(sges) {
				t.finish(e)
				return true
			}
		}
	}
	return true
}

// finish records that the entry at sqTx is wholly framed.
func (t *txState) finish(e *sqEntry) {
	e.framed = true
	e.endOff = t.built
	t.q.sqTx++
	t.off, t.sge, t.sgeOff, t.readIdx = 0, 0, 0, 0
}

// frameReadResponse frames the next FPDU answering the IRQ's head.
func (t *txState) frameReadResponse() {
	q := t.q
	r := &q.irq[q.irqHead%uint64(len(q.irq))]
	if r.atomic {
		t.frameAtomicResponse(r)
		return
	}
	n := t.cut(t.maxTagged, r.size, r.sent)
	if !t.inMini && n > 0 { // see vecFit
		c, _ := r.region.RemoteSlicesFit(r.sem, r.srcOff+uint64(r.sent), uint64(n), cap(t.iov)-len(t.iov)-3)
		n = int(c)
	}
	n = t.fit(n, r.size-r.sent, wire.TaggedHeaderLen, r.sent == 0)
	h := header(wire.OpReadResponse)
	h.Last = r.sent+n == r.size
	h.STag, h.TO = r.sinkSTag, r.sinkTO+uint64(r.sent)
	t.begin(&h, nil, n)
	if n > 0 && t.copyIn(r.region, n) {
		t.copyTail(r.region, true, r.sem, r.srcOff+uint64(r.sent), n)
	} else if n > 0 {
		t.hold(r.region) // the IRQ entry holds it until its last FPDU is framed
		t.iov = r.region.RemoteSlices(t.iov, r.sem, r.srcOff+uint64(r.sent), uint64(n))
		t.lastEnd = -1
	}
	t.end(n)
	r.sent += n
	if h.Last {
		if r.region != nil {
			r.region.Unhold() // the batch's hold remains until it is written
		}
		if r.size >= quietRead {
			q.largeReads.Add(-1)
		}
		*r = irqEntry{}
		q.irqHead++
	}
}

// frameTerminate frames a Terminate message.
func (t *txState) frameTerminate(term *wire.Terminate) {
	h := header(wire.OpTerminate)
	h.Last, h.MSN = true, 1
	t.frame(&h, term.Append, nil, 0)
}

// frameNudge frames a zero-length Write to STag 1: it places nothing
// (RFC 5040 checks no STag for it) and completes nothing, it only brings
// the peer new bytes (see QP.nudgeLoop).
func (t *txState) frameNudge() {
	h := header(wire.OpWrite)
	h.Last, h.STag = true, 1
	t.frame(&h, nil, nil, 0)
}

// frameRTR frames the peer-to-peer ready-to-receive message (RFC 6581 §5):
// a zero-length Write to STag 1 (as siw sends it; some NICs reject STag 0)
// or a zero-length Read, which takes an ORQ slot like any Read.
func (t *txState) frameRTR() bool {
	q := t.q
	switch q.params.SendRTR {
	case wire.RTRWrite:
		h := header(wire.OpWrite)
		h.Last, h.STag = true, 1
		t.frame(&h, nil, nil, 0)
	case wire.RTRRead:
		if q.orqTail-q.orqHead == uint64(len(q.orq)) {
			return false
		}
		q.orq[q.orqTail%uint64(len(q.orq))] = orqEntry{}
		q.orqTail++
		t.msn[wire.QNRead]++
		rr := wire.ReadRequest{SourceSTag: 1}
		h := header(wire.OpReadRequest)
		h.Last, h.MSN = true, t.msn[wire.QNRead]
		t.frame(&h, rr.Append, nil, 0)
	case wire.RTRSend:
		t.msn[wire.QNSend]++
		h := header(wire.OpSend)
		h.Last, h.MSN = true, t.msn[wire.QNSend]
		t.frame(&h, nil, nil, 0)
	}
	return true
}
