package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/gowarp/gowarp/wire"
)

// Prepared work requests (C8). A work request's shape — opcode, SGE
// lengths and regions, remote STag and address, flags — decides the checks
// its local memory needs and most of its wire header. A shape seen before
// is recognised by a fingerprint: its checks are not repeated and its
// encoded header is reused, with only the fields that change per FPDU (the
// L bit, MSN, MO, TO) patched in. Posts hit a small per-QP cache of shapes
// implicitly; Prepare makes a handle that also pins the memory once, so a
// post carries nothing but the work request ID.

// headerTmpl is an encoded DDP/RDMAP header (and Read Request body) kept
// for a shape.
type headerTmpl struct {
	b [wire.UntaggedHeaderLen + wire.ReadRequestLen]byte
	n uint8 // 0: none
}

// Offsets of the per-FPDU fields in an encoded header.
const (
	tmplCtl = 0  // control byte with the L bit
	tmplTO  = 6  // tagged: TO
	tmplMSN = 10 // untagged: MSN
	tmplMO  = 14 // untagged: MO
)

// shapeSlots is the size of the per-QP shape cache (direct-mapped).
const shapeSlots = 8

// shape is a cached, checked work-request shape.
type shape struct {
	fp uint64
	wr SendWR // SGL nil, ID 0, Signaled clear
	// sges are a Prepared's SGEs. The QP's cache of shapes keeps their
	// offsets and lengths there but no region: a region's ID in ids
	// instead, so that a shape cached does not keep the memory of a
	// region deregistered since (nor a closed queue pair, which the
	// device's events name, keep its last work's buffers).
	sges   [MaxSGE]SGE
	ids    [MaxSGE]uint64
	nsge   int
	length int
	tmpl   headerTmpl
	// A Prepared's, under q.mu: its posted copies not yet retired, and
	// whether it was released. Its one pin on the regions lasts until
	// both say it may go, so a post costs no atomic per region.
	copies   int
	released bool
}

// fingerprint hashes the fields of a work request that make its shape.
func fingerprint(wr *SendWR) uint64 {
	const prime = 0x100000001b3
	h := uint64(0xcbf29ce484222325)
	mix := func(v uint64) { h = (h ^ v) * prime }
	mix(uint64(wr.Op) | uint64(wr.Flags&^Signaled)<<8 | uint64(wr.RKey)<<16 | uint64(len(wr.SGL))<<48)
	mix(wr.RemoteAddr)
	mix(uint64(wr.InvalidateSTag))
	for i := range wr.SGL {
		s := &wr.SGL[i]
		mix(uint64(uintptr(unsafe.Pointer(s.MR))))
		mix(uint64(uint32(s.Offset)) | uint64(uint32(s.Length))<<32)
	}
	return h
}

// same reports whether wr has exactly the shape s holds.
func (s *shape) same(wr *SendWR) bool {
	if s.wr.Op != wr.Op || s.wr.Flags != wr.Flags&^Signaled || s.wr.RKey != wr.RKey ||
		s.wr.RemoteAddr != wr.RemoteAddr || s.wr.InvalidateSTag != wr.InvalidateSTag || s.wr.Imm != wr.Imm || s.wr.CompareAdd != wr.CompareAdd || s.wr.Swap != wr.Swap || s.nsge != len(wr.SGL) {
		return false
	}
	for i, g := range wr.SGL {
		if g.MR == nil || s.ids[i] != g.MR.ID() || s.sges[i].Offset != g.Offset || s.sges[i].Length != g.Length || !g.MR.Valid() {
			return false
		}
	}
	return true
}

// checkShape validates a work request: opcode, SGE count and every SGE
// against its region. It returns the total length.
func checkShape(wr *SendWR) (int, error) {
	if len(wr.SGL) > MaxSGE {
		return 0, ErrTooManySGE
	}
	if wr.Flags&^(Signaled|Solicited|Fence) != 0 {
		return 0, fmt.Errorf("%w: unknown flags %#x", ErrBadOp, uint8(wr.Flags&^(Signaled|Solicited|Fence)))
	}
	switch wr.Op {
	case OpSend, OpSendInv, OpWrite, OpRead, OpWriteImm, OpSendImm:
	case OpFetchAdd, OpCmpSwap, OpAtomicWrite:
		if len(wr.SGL) != 1 || wr.SGL[0].Length != 8 || wr.RemoteAddr%8 != 0 {
			return 0, ErrBadAtomic
		}
	default:
		return 0, ErrBadOp
	}
	// Summed in 64 bits: an int of 32 bits would wrap before 4 GiB.
	var total uint64
	for i := range wr.SGL {
		if err := checkLocal(&wr.SGL[i], wr.Op.waits()); err != nil {
			return 0, err
		}
		total += uint64(wr.SGL[i].Length)
	}
	if total > 1<<32-1 {
		return 0, ErrTooLong
	}
	return int(total), nil
}

// sendOpcode is the RDMAP opcode of a Send work request.
func sendOpcode(wr *SendWR) wire.Opcode {
	switch {
	case wr.Op == OpSendInv && wr.Flags&Solicited != 0:
		return wire.OpSendSEInv
	case wr.Op == OpSendInv:
		return wire.OpSendInv
	case wr.Flags&Solicited != 0:
		return wire.OpSendSE
	}
	return wire.OpSend
}

// makeTmpl encodes the header of a work request's first FPDU. Reads with
// more than one SGE (several Read Requests) get none.
func makeTmpl(wr *SendWR, sges []SGE) headerTmpl {
	var t headerTmpl
	var b []byte
	switch wr.Op {
	case OpWrite:
		h := header(wire.OpWrite)
		h.STag, h.TO = wr.RKey, wr.RemoteAddr
		b = h.Append(t.b[:0])
	case OpSend, OpSendInv:
		h := header(sendOpcode(wr))
		if wr.Op == OpSendInv {
			h.RsvdULP = wr.InvalidateSTag
		}
		b = h.Append(t.b[:0])
	case OpRead:
		if len(sges) != 1 {
			return t
		}
		h := header(wire.OpReadRequest)
		h.Last = true
		s := sges[0]
		rr := wire.ReadRequest{SinkSTag: uint32(s.MR.STag()), SinkTO: s.MR.Addr() + uint64(s.Offset), Size: uint32(s.Length), SourceSTag: wr.RKey, SourceTO: wr.RemoteAddr}
		b = rr.Append(h.Append(t.b[:0]))
	}
	t.n = uint8(len(b))
	return t
}

// lookupShapeLocked finds wr's shape in the cache, or checks wr and caches
// its shape. q.mu is held.
func (q *QP) lookupShapeLocked(wr *SendWR) (*shape, error) {
	fp := fingerprint(wr)
	s := &q.shapes[fp%shapeSlots]
	if s.fp == fp && s.wr.Op != 0 && s.same(wr) { // Op 0: an empty slot
		return s, nil
	}
	total, err := checkShape(wr)
	if err != nil {
		return nil, err
	}
	*s = shape{fp: fp, wr: *wr, length: total}
	s.wr.SGL, s.wr.ID, s.wr.Flags = nil, 0, wr.Flags&^Signaled
	s.nsge = len(wr.SGL)
	for i, g := range wr.SGL {
		s.sges[i] = SGE{Offset: g.Offset, Length: g.Length}
		s.ids[i] = g.MR.ID() // checkShape found every MR set
	}
	s.tmpl = makeTmpl(wr, wr.SGL)
	return s, nil
}

// ErrReleased is returned by a post of a released Prepared.
var ErrReleased = errors.New("gowarp: prepared work request released")

// Prepared is a work request checked, pinned and encoded once, to be
// posted many times with Post. Its regions cannot be deregistered until
// Release.
type Prepared struct {
	q *QP
	s shape
}

// Prepare checks wr and keeps it ready to post. wr.ID and the Signaled
// flag are ignored: Post supplies them.
func (q *QP) Prepare(wr *SendWR) (*Prepared, error) {
	if wr == nil {
		return nil, ErrNilWR
	}
	total, err := checkShape(wr)
	if err != nil {
		return nil, err
	}
	p := &Prepared{q: q, s: shape{fp: fingerprint(wr), wr: *wr, length: total}}
	p.s.wr.SGL, p.s.wr.ID, p.s.wr.Flags = nil, 0, wr.Flags&^Signaled
	p.s.nsge = copy(p.s.sges[:], wr.SGL)
	p.s.tmpl = makeTmpl(wr, wr.SGL)
	if err := pinSGEs(p.s.sges[:p.s.nsge]); err != nil {
		return nil, err
	}
	return p, nil
}

// Post posts the prepared work request with the given ID, signaled or not.
func (p *Prepared) Post(id uint64, signaled bool) error {
	_, err := p.PostN(id, 1, signaled)
	return err
}

// PostN posts the prepared work request n times with one doorbell, with
// IDs id, id+1, …; only the last is signaled, and only if signaled is set.
// It returns how many were queued.
func (p *Prepared) PostN(id uint64, n int, signaled bool) (int, error) {
	q := p.q
	q.mu.Lock()
	if p.s.released {
		q.mu.Unlock()
		return 0, ErrReleased
	}
	for i := range n {
		e, err := q.sqSlotLocked()
		if err == nil && p.s.wr.Op.waits() && len(q.orq) == 0 {
			err = ErrZeroORD
		}
		if err == nil && p.s.wr.Op.ext() && !q.params.Ext {
			err = ErrNotSupported
		}
		if err != nil {
			if i > 0 {
				q.kickLocked()
			} else {
				q.mu.Unlock()
			}
			return i, err
		}
		e.pre = &p.s
		// The Prepared's pin stays until this copy retires, even after
		// Release, so Deregister refuses while it is outstanding.
		p.s.copies++
		e.wr.ID, e.wr.Op, e.wr.Flags = id+uint64(i), p.s.wr.Op, p.s.wr.Flags
		if signaled && i == n-1 {
			e.wr.Flags |= Signaled
		}
		e.wr.RKey, e.wr.RemoteAddr, e.wr.InvalidateSTag, e.wr.Imm = p.s.wr.RKey, p.s.wr.RemoteAddr, p.s.wr.InvalidateSTag, p.s.wr.Imm
		e.wr.CompareAdd, e.wr.Swap = p.s.wr.CompareAdd, p.s.wr.Swap
		e.length, e.tmpl = p.s.length, p.s.tmpl
		if e.wr.Op.waits() {
			e.readsLeft = max(1, p.s.nsge)
		}
		q.sqTail++
	}
	q.kickLocked()
	return n, nil
}

// Release unpins the prepared request's regions; later posts fail. Work
// already posted is not affected: it pins them until it completes.
func (p *Prepared) Release() {
	p.q.mu.Lock()
	defer p.q.mu.Unlock()
	if p.s.released {
		return
	}
	p.s.released = true
	if p.s.copies == 0 {
		unpinSGEs(p.s.sges[:p.s.nsge])
	} // else the last copy to retire unpins them

}

// putTmpl writes a work request's header template into b for one FPDU,
// patching the L bit and the per-FPDU fields.
func putTmpl(b []byte, t *headerTmpl, last bool, to uint64, msn, mo uint32) []byte {
	b = append(b, t.b[:t.n]...)
	h := b[len(b)-int(t.n):]
	if last {
		h[tmplCtl] |= 0x40
	}
	if h[tmplCtl]&0x80 != 0 {
		binary.BigEndian.PutUint64(h[tmplTO:], to)
	} else {
		binary.BigEndian.PutUint32(h[tmplMSN:], msn)
		binary.BigEndian.PutUint32(h[tmplMO:], mo)
	}
	return b
}
