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
		n := t.fit(t.cut(t.maxTagged, e.length, t.off), e.length-t.off, wire.TaggedHeaderLen, t.off == 0)
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
		n := t.fit(t.cut(t.maxUntagged-wire.ImmediateLen, e.length, t.off), e.length-t.off, hdr, t.off == 0)
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
