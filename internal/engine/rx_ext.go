package engine

import (
	"encoding/binary"
	"math/bits"
	"sync/atomic"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// extOK reports whether the receive core takes RFC 7306's opcode op:
// only from a peer that negotiated the extensions (Params.Ext).
func (r *rxState) extOK(wire.Opcode) bool { return r.q.params.Ext }

// atomicRequest checks an inbound Atomic Request (RFC 7306 §5.2.1) as a
// Read Request is checked: its MSN on the Read queue, the IRD limit
// (Reads and atomics share it), and the target: STag, domain, the
// remote-atomic right, bounds, and 8-byte alignment (of the tagged offset
// and of the memory, for sync/atomic; a misaligned target is a base or
// bounds violation). The region is returned held until the operation has
// run (see runAtomic).
func (r *rxState) atomicRequest(h *wire.Header) (*mem.Region, error) {
	q := r.q
	r.ar, _, _ = wire.ParseAtomicRequest(r.head[wire.UntaggedHeaderLen:r.hlen])
	ar := &r.ar
	if h.MSN != r.msn[wire.QNRead] {
		return nil, newFault(wire.ErrDDPInvalidMSN, "Atomic Request MSN %d, expected %d", h.MSN, r.msn[wire.QNRead])
	}
	if h.MO != 0 {
		return nil, newFault(wire.ErrDDPInvalidMO, "Atomic Request at MO %d", h.MO)
	}
	q.mu.Lock()
	full := q.irqTail-q.irqHead == uint64(len(q.irq))
	q.mu.Unlock()
	if full {
		return nil, newFault(wire.ErrRDMAPStream, "Atomic Request beyond IRD %d", len(q.irq))
	}
	if !ar.Op.Valid() {
		return nil, newFault(wire.ErrRDMAPOpcode, "Atomic Request with %v", ar.Op)
	}
	// A write hold: the operation may change the word, and a snapshot
	// must see it wholly or not at all (see mem.Region.WriteWord).
	region, why := q.cfg.Table.LookupHoldWrite(mem.STag(ar.RemoteSTag))
	if why == mem.OK {
		if why = region.CheckRemote(q.cfg.PD, mem.RemoteAtomic, ar.RemoteTO, 8); why != mem.OK {
			region.UnholdWrite()
		}
	}
	if why != mem.OK {
		return nil, newFault(rdmapError(why), "%v on STag %#08x TO %#x", ar.Op, ar.RemoteSTag, ar.RemoteTO)
	}
	if ar.RemoteTO%8 != 0 || region.Word(ar.RemoteTO-region.Addr()) == nil {
		region.UnholdWrite()
		return nil, newFault(wire.ErrRDMAPBaseBounds, "%v on STag %#08x at TO %#x, not 8-byte aligned", ar.Op, ar.RemoteSTag, ar.RemoteTO)
	}
	return region, nil
}

// runAtomic carries out a checked Atomic Request on its word, with
// sync/atomic (so against other atomics, remote or local, on the same
// word), and queues its response on the IRQ behind the Read Responses
// before it (RFC 7306: responses in order with Read Responses).
func (r *rxState) runAtomic(region *mem.Region) {
	q := r.q
	ar := &r.ar
	sem, _ := region.Semantics(mem.STag(ar.RemoteSTag).Key())
	w := region.RemoteWord(sem, ar.RemoteTO-region.Addr())
	var orig uint64
	for {
		orig = atomic.LoadUint64(w)
		v := orig
		switch ar.Op {
		case wire.AtomicFetchAdd:
			v = maskedAdd(orig, ar.AddSwap, ar.AddSwapMask)
		case wire.AtomicCmpSwap:
			if (orig^ar.Compare)&ar.CompareMask == 0 {
				v = orig&^ar.AddSwapMask | ar.AddSwap&ar.AddSwapMask
			}
		}
		if v == orig || atomic.CompareAndSwapUint64(w, orig, v) {
			break
		}
	}
	region.UnholdWrite()
	r.msn[wire.QNRead]++
	q.mu.Lock()
	if s := q.State(); s != StateReady && s != StateClosing {
		q.mu.Unlock()
		return
	}
	q.irq[q.irqTail%uint64(len(q.irq))] = irqEntry{atomic: true, reqID: ar.ReqID, orig: orig}
	q.irqTail++
	q.kickLocked() // answer at once, from this goroutine if the role is free; unlocks
}

// maskedAdd adds add to v as RFC 7306's masked FetchAdd does: a set bit of
// mask ends a field, and no carry crosses out of it. A zero mask is one
// 64-bit field.
func maskedAdd(v, add, mask uint64) uint64 {
	if mask == 0 {
		return v + add
	}
	var sum uint64
	for lo := 0; lo < 64; {
		hi := 63
		if m := mask >> lo; m != 0 {
			hi = lo + bits.TrailingZeros64(m)
		}
		width := hi - lo + 1
		field := ^uint64(0) >> (64 - width) << lo
		sum |= (v&field + add&field) & field
		lo = hi + 1
	}
	return sum
}

// atomicResponse matches an Atomic Response (RFC 7306 §5.2.2) to the head
// of the ORQ, which must be an Atomic Request of that identifier, and
// holds its result buffer.
func (r *rxState) atomicResponse(h *wire.Header) error {
	q := r.q
	r.aresp, _, _ = wire.ParseAtomicResponse(r.head[wire.UntaggedHeaderLen:r.hlen])
	if h.MSN != r.msn[wire.QNAtomicResponse] {
		return newFault(wire.ErrDDPInvalidMSN, "Atomic Response MSN %d, expected %d", h.MSN, r.msn[wire.QNAtomicResponse])
	}
	if h.MO != 0 {
		return newFault(wire.ErrDDPInvalidMO, "Atomic Response at MO %d", h.MO)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.orqHead == q.orqTail {
		return newFault(wire.ErrRDMAPOpcode, "Atomic Response with no Atomic Request outstanding")
	}
	o := &q.orq[q.orqHead%uint64(len(q.orq))]
	if !o.atomic || o.sq == nil || o.sq.msn != r.aresp.ReqID {
		return newFault(wire.ErrRDMAPOpcode, "Atomic Response to request %d, not the next outstanding", r.aresp.ReqID)
	}
	return nil
}

// atomicPlaced puts the original value into the requester's 8-byte
// buffer (in the machine's byte order, as the word was at the responder)
// and completes the atomic.
func (r *rxState) atomicPlaced() {
	q := r.q
	r.msn[wire.QNAtomicResponse]++
	q.mu.Lock()
	if q.orqHead == q.orqTail { // flushed meanwhile
		q.mu.Unlock()
		return
	}
	o := &q.orq[q.orqHead%uint64(len(q.orq))]
	// The atomic pins its buffer; a flush drops the pin, so the write
	// holds it too (as a Read Response's placement does).
	if !o.sge.MR.TryHoldWrite() {
		q.mu.Unlock()
		return
	}
	var one [1][]byte
	if d := o.sge.MR.WriteSlices(one[:0], uint64(o.sge.Offset), 8); len(d) == 1 {
		binary.NativeEndian.PutUint64(d[0], r.aresp.Original)
	} else {
		var b [8]byte
		binary.NativeEndian.PutUint64(b[:], r.aresp.Original)
		for _, p := range d {
			copy(p, b[:])
			copy(b[:], b[len(p):])
		}
	}
	o.sge.MR.AddPlaced(8)
	o.sge.MR.UnholdWrite()
	e := o.sq
	*o = orqEntry{}
	q.orqHead++
	if q.orqHead == q.orqTail {
		q.drainedLocked()
	}
	e.readsLeft--
	if e.readsLeft == 0 {
		e.done = true
		q.retireLocked(true)
	}
	q.mu.Unlock()
	q.kick()
}
