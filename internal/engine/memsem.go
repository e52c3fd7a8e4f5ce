package engine

import (
	"fmt"
	"runtime/debug"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// Memory semantics in the receive core: placement into file mappings
// that a truncation may cut off, the storage semantics an STag's key
// names (durable Writes, read-through Reads) and the flush (remote
// completion) a zero-length Read Request can carry (see wire/flush.go).

// pendingSync is a range that Writes through a Durable key placed and
// that is not on stable storage yet, with a hold on its region. The
// segments of one Write gather here and are synced once, at its last.
type pendingSync struct {
	region *mem.Region
	lo, hi uint64 // offsets from the region's start
}

// drop ends the hold of a range that will not be synced (the queue pair
// failed).
func (p *pendingSync) drop() {
	if p.region != nil {
		p.region.Unhold()
		*p = pendingSync{}
	}
}

// syncPending puts the pending range on stable storage. The receive path
// waits for it: nothing after a durable Write is processed until it is
// there, but only this queue pair waits.
func (r *rxState) syncPending() error {
	p := &r.sync
	err := p.region.Sync(p.lo, p.hi-p.lo)
	p.drop()
	if err != nil {
		return newFault(wire.ErrRDMAPCatastrophic, "durable Write: %v", err)
	}
	return nil
}

// durablePlaced records the FPDU just placed, a segment of a Write
// through a Durable key, and syncs at the Write's last segment.
func (r *rxState) durablePlaced() error {
	region := r.region
	off := r.h.TO - region.Addr()
	if r.sync.region != region || r.sync.hi != off {
		if r.sync.region != nil {
			if err := r.syncPending(); err != nil {
				return err
			}
		}
		region.Hold() // it is held for the placement already
		r.sync = pendingSync{region: region, lo: off, hi: off}
	}
	r.sync.hi += uint64(r.payload)
	if r.h.Last {
		return r.syncPending()
	}
	return nil
}

// placeGuarded places what is staged as placeStaged does, into memory of
// which some is a file's mapping. A file truncated under its region makes
// the pages past its new end fault (SIGBUS), which would kill the
// process; here the fault becomes a panic, recovered into the Terminate
// the access calls for. Only file regions pay for the guard.
func (r *rxState) placeGuarded() (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if p := recover(); p != nil {
			if _, ok := p.(interface{ Addr() uintptr }); !ok {
				panic(p) // not a memory fault
			}
			term := wire.ErrRDMAPCatastrophic // our own memory failed us
			if r.h.Opcode == wire.OpWrite {
				term = wire.ErrDDPBaseBounds // the peer's target is no longer there
			}
			err = newFault(term, "%v into a file region: the file was truncated under it (%v)", r.h.Opcode, p)
		}
	}()
	r.placeStaged()
	return nil
}

// readFile checks, for a Read from a file region, that the file still
// holds the range (a Read Response from pages past the file's end would
// fault), and asks for the pages at once when the key is read-through.
// The file's size is taken once per read from the socket (chk): the
// Reads of one batch (a GET's data and header, a window of requests)
// share one fstat. That widens nothing: a truncation after the check is
// possible either way, and the transmit path survives it (crcGuarded,
// the socket's EFAULT).
func readFile(region *mem.Region, rr *wire.ReadRequest, chk *fileCheck) error {
	off := rr.SourceTO - region.Addr()
	if chk.region != region {
		chk.region = region
		chk.room, _ = region.FileRoom()
	}
	if n := uint64(rr.Size); chk.room < off || chk.room-off < n {
		return newFault(wire.ErrRDMAPBaseBounds, "Read of %d bytes from STag %#08x TO %#x: past the end of the region's file, truncated since registration", rr.Size, rr.SourceSTag, rr.SourceTO)
	}
	if sem, _ := region.Semantics(mem.STag(rr.SourceSTag).Key()); sem == mem.ReadThrough {
		region.Prefetch(off, uint64(rr.Size))
	}
	return nil
}

// fileCheck is the size of the file behind the last file region a Read
// came from, in the read from the socket under way (see readFile).
type fileCheck struct {
	region *mem.Region
	room   uint64
}

// flushRequest checks a flush: the region (any of its keys), this
// connection's protection domain, the remote-write right (a flush makes
// remote Writes visible or durable) and the range; persistence needs a
// file behind the region. It returns the region held; flushDone acts.
func (r *rxState) flushRequest(f wire.Flush) (*mem.Region, error) {
	q := r.q
	region, why := q.cfg.Table.LookupHold(mem.STag(f.STag))
	if why == mem.OK {
		if f.Len == 0 {
			f.TO, f.Len = region.Addr(), uint64(region.Len())
		}
		why = region.CheckRemote(q.cfg.PD, mem.RemoteWrite, f.TO, f.Len)
		if why == mem.OK && f.Type == wire.FlushPersistence && !region.File() {
			why = mem.AccessRights // nothing to persist to
		}
		if why != mem.OK {
			region.Unhold()
		}
	}
	if why != mem.OK {
		return nil, newFault(rdmapError(why), "flush (%v) of %d bytes at STag %#08x TO %#x", f.Type, f.Len, f.STag, f.TO)
	}
	r.flushV = f
	r.flush = &r.flushV
	return region, nil
}

// flushDone carries a checked flush out and ends the region's hold. Every
// Write before it was placed (the receive core places an FPDU before it
// parses the next) and, through a Durable key, synced (header): global
// visibility holds by then. Persistence syncs the range.
func (r *rxState) flushDone(region *mem.Region) error {
	f := r.flush
	r.flush = nil
	var err error
	if f.Type == wire.FlushPersistence {
		err = region.Sync(f.TO-region.Addr(), f.Len)
	}
	region.Unhold()
	if err != nil {
		return newFault(wire.ErrRDMAPCatastrophic, "flush: %v", err)
	}
	return nil
}

// frameFlush frames the flush at sqTx: one zero-length Read Request that
// takes an ORQ slot, answered by a zero-length Read Response. It reports
// false when the ORQ is full.
func (t *txState) frameFlush(e *sqEntry) bool {
	q := t.q
	if q.orqTail-q.orqHead == uint64(len(q.orq)) {
		return false
	}
	f := wire.Flush{Type: e.flushType, STag: e.wr.RKey, TO: e.wr.RemoteAddr, Len: e.flushLen}
	rr := f.ReadRequest()
	o := &q.orq[q.orqTail%uint64(len(q.orq))]
	*o = orqEntry{sq: e, sinkSTag: rr.SinkSTag, sinkTO: rr.SinkTO}
	q.orqTail++
	t.msn[wire.QNRead]++
	e.msn = t.msn[wire.QNRead]
	h := header(wire.OpReadRequest)
	h.Last, h.MSN = true, e.msn
	t.begin(&h, rr.Append, 0)
	t.end(0)
	t.finish(e)
	return true
}

// PostFlush queues a flush (remote completion): once it completes, every
// Write posted before it on this queue pair is placed at the peer and,
// with wire.FlushPersistence, on the stable storage of the file behind
// the peer's region. rkey and addr name the region and the range's
// start, length its length (0: the whole region). Toward a peer that
// does not know flushes it is a zero-length Read: a placement fence.
func (q *QP) PostFlush(id uint64, flags WRFlags, typ wire.FlushType, rkey uint32, addr, length uint64) error {
	if typ != wire.FlushVisibility && typ != wire.FlushPersistence {
		return fmt.Errorf("%w: flush type %d", ErrBadOp, uint8(typ))
	}
	q.mu.Lock()
	e, err := q.sqSlotLocked()
	if err != nil {
		q.mu.Unlock()
		return err
	}
	if len(q.orq) == 0 {
		q.mu.Unlock()
		return ErrZeroORD
	}
	e.wr = SendWR{ID: id, Op: OpFlush, Flags: flags &^ Solicited, RemoteAddr: addr, RKey: rkey}
	e.length, e.tmpl, e.readsLeft = 0, headerTmpl{}, 1
	e.flushType, e.flushLen = typ, length
	q.sqTail++
	q.kickLocked()
	return nil
}

// crcGuarded continues crc over the payload vectors as the transmit path
// does, when some of them lie in a file's mapping: a file truncated since
// the Read was checked (readFile) makes its pages fault, which here is
// recovered instead of killing the process. The CRC is then wrong, but
// it never goes out: the socket write of the same pages fails with EFAULT
// and the queue pair fails with it.
func crcGuarded(crc uint32, iov [][]byte) (sum uint32) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if p := recover(); p != nil {
			if _, ok := p.(interface{ Addr() uintptr }); !ok {
				panic(p)
			}
			sum = ^crc
		}
	}()
	for _, v := range iov {
		crc = wire.UpdateCRC32c(crc, v)
	}
	return crc
}
