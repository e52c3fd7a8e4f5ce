package engine

import "github.com/gowarp/gowarp/wire"

// Transmit of RFC 7306's operations (toward a peer that negotiated them;
// postSendLocked refuses them otherwise).
//
// A Write with immediate data is an RDMA Write followed by an Immediate
// Data message (RFC 7306 §4.1: the ULP learns from it that the Write
// before it, in order, has landed). A Send with immediate data is one
// Immediate Data message that carries the Send's payload after its 8-byte
// body, every segment repeating the body (gowarp's form, between gowarp
// peers: RFC 7306's Immediate Data message carries only the 8 bytes, and a
// Send followed by one would take two receives where verbs takes one).
// The 4-byte immediate value of verbs travels as the low half of the
// RFC's 8 bytes.

// immBody appends an Immediate Data body.
type immBody uint64

func (v immBody) append(b []byte) []byte { return wire.AppendImmediate(b, uint64(v)) }

func immOpcode(wr *SendWR) wire.Opcode {
	if wr.Flags&Solicited != 0 {
		return wire.OpImmediateSE
	}
	return wire.OpImmediate
}

// frameWriteImm frames a Write with immediate data: the Write's FPDUs,
// then the Immediate Data message (t.immDue between the two, should the
// batch fill).
func (t *txState) frameWriteImm(e *sqEntry, sges []SGE) bool {
	for !t.immDue && t.room() {
		n := t.fit(t.vecFit(sges, t.cut(t.maxTagged, e.length, t.off)), e.length-t.off, wire.TaggedHeaderLen, t.off == 0)
		last := t.off+n == e.length
		h := header(wire.OpWrite)
		h.Last, h.STag, h.TO = last, e.wr.RKey, e.wr.RemoteAddr+uint64(t.off)
		t.begin(&h, nil, n)
		t.addSGEs(sges, n)
		t.end(n)
		t.off += n
		t.immDue = last
	}
	if !t.immDue || !t.room() {
		return true
	}
	t.msn[wire.QNSend]++
	e.msn = t.msn[wire.QNSend]
	h := header(immOpcode(&e.wr))
	h.Last, h.MSN = true, e.msn
	t.begin(&h, immBody(e.wr.Imm).append, 0)
	t.end(0)
	t.immDue = false
	t.finish(e)
	return true
}

// frameSendImm frames a Send with immediate data: one Immediate Data
// message whose segments each carry the body before their payload.
func (t *txState) frameSendImm(e *sqEntry, sges []SGE) bool {
	if t.off == 0 {
		t.msn[wire.QNSend]++
		e.msn = t.msn[wire.QNSend]
	}
	const hdr = wire.UntaggedHeaderLen + wire.ImmediateLen
	for t.room() {
		n := t.fit(t.vecFit(sges, t.cut(t.maxUntagged-wire.ImmediateLen, e.length, t.off)), e.length-t.off, hdr, t.off == 0)
		last := t.off+n == e.length
		h := header(immOpcode(&e.wr))
		h.Last, h.MSN, h.MO = last, e.msn, uint32(t.off)
		t.begin(&h, immBody(e.wr.Imm).append, n)
		t.addSGEs(sges, n)
		t.end(n)
		t.off += n
		if last {
			t.finish(e)
			return true
		}
	}
	return true
}

// frameAtomic frames an Atomic Request (RFC 7306 §5.2.1) on the Read
// queue: it takes an ORQ slot and a Read Request MSN, so ORD counts it,
// and its Request Identifier is that MSN. An Atomic Write is a CmpSwap
// whose Compare Mask is 0: the comparison always holds.
func (t *txState) frameAtomic(e *sqEntry, sges []SGE) bool {
	q := t.q
	if q.orqTail-q.orqHead == uint64(len(q.orq)) {
		return false // ORD reached: the send queue waits for a response
	}
	q.orq[q.orqTail%uint64(len(q.orq))] = orqEntry{sq: e, sge: sges[0], atomic: true}
	q.orqTail++
	t.msn[wire.QNRead]++
	e.msn = t.msn[wire.QNRead]
	ar := wire.AtomicRequest{Op: wire.AtomicFetchAdd, ReqID: e.msn, RemoteSTag: e.wr.RKey, RemoteTO: e.wr.RemoteAddr,
		AddSwap: e.wr.CompareAdd}
	switch e.wr.Op {
	case OpCmpSwap:
		ar.Op, ar.AddSwap, ar.AddSwapMask, ar.Compare, ar.CompareMask = wire.AtomicCmpSwap, e.wr.Swap, ^uint64(0), e.wr.CompareAdd, ^uint64(0)
	case OpAtomicWrite:
		ar.Op, ar.AddSwap, ar.AddSwapMask = wire.AtomicCmpSwap, e.wr.Swap, ^uint64(0)
	}
	h := header(wire.OpAtomicRequest)
	h.Last, h.MSN = true, e.msn
	t.begin(&h, ar.Append, 0)
	t.end(0)
	t.finish(e)
	return true
}

// frameAtomicResponse frames the Atomic Response of the IRQ's head: it
// leaves in order with the Read Responses queued before it.
func (t *txState) frameAtomicResponse(r *irqEntry) {
	q := t.q
	t.msn[wire.QNAtomicResponse]++
	resp := wire.AtomicResponse{ReqID: r.reqID, Original: r.orig}
	h := header(wire.OpAtomicResponse)
	h.Last, h.MSN = true, t.msn[wire.QNAtomicResponse]
	t.begin(&h, resp.Append, 0)
	t.end(0)
	*r = irqEntry{}
	q.irqHead++
}
