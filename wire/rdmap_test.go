package wire

import "testing"

// The opcode table against RFC 5040 §4.3/§5.1 and wire.md §1.4.
func TestOpcodeTable(t *testing.T) {
	tests := []struct {
		op                 Opcode
		name               string
		tagged             bool
		qn                 uint32
		extra              int
		send, sol, inv     bool
		headerAndExtraLen  int // DDP header + RDMAP body, without the length field
		controlL, controlN uint16
	}{
		{OpWrite, "RDMA Write", true, 0, 0, false, false, false, 14, 0xc140, 0x8140},
		{OpReadRequest, "RDMA Read Request", false, QNRead, 28, false, false, false, 46, 0x4141, 0x0141},
		{OpReadResponse, "RDMA Read Response", true, 0, 0, false, false, false, 14, 0xc142, 0x8142},
		{OpSend, "Send", false, QNSend, 0, true, false, false, 18, 0x4143, 0x0143},
		{OpSendInv, "Send with Invalidate", false, QNSend, 0, true, false, true, 18, 0x4144, 0x0144},
		{OpSendSE, "Send with Solicited Event", false, QNSend, 0, true, true, false, 18, 0x4145, 0x0145},
		{OpSendSEInv, "Send with Solicited Event and Invalidate", false, QNSend, 0, true, true, true, 18, 0x4146, 0x0146},
		{OpTerminate, "Terminate", false, QNTerminate, 4, false, false, false, 22, 0x4147, 0x0147},
		// RFC 7306 §4.1, §5.1: Immediate Data on the Send queue with an
		// 8-byte body; Atomic Requests on the Read queue, Responses on 3.
		{OpImmediate, "Immediate Data", false, QNSend, 8, true, false, false, 26, 0x4148, 0x0148},
		{OpImmediateSE, "Immediate Data with Solicited Event", false, QNSend, 8, true, true, false, 26, 0x4149, 0x0149},
		{OpAtomicRequest, "Atomic Request", false, QNRead, 52, false, false, false, 70, 0x414a, 0x014a},
		{OpAtomicResponse, "Atomic Response", false, QNAtomicResponse, 12, false, false, false, 30, 0x414b, 0x014b},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := tt.op.Info()
			if !info.Valid || info.Name != tt.name || info.Tagged != tt.tagged || info.QN != tt.qn ||
				info.Extra != tt.extra || info.Send != tt.send {
				t.Errorf("Info() = %+v", info)
			}
			if info.Ext != (tt.op >= OpImmediate) {
				t.Errorf("Ext = %v", info.Ext)
			}
			if tt.op.String() != tt.name {
				t.Errorf("String() = %q", tt.op.String())
			}
			if tt.op.Solicited() != tt.sol || tt.op.Invalidates() != tt.inv {
				t.Errorf("Solicited() = %v, Invalidates() = %v", tt.op.Solicited(), tt.op.Invalidates())
			}
			h := Header{Opcode: tt.op, Tagged: info.Tagged, DDPVersion: DDPVersion, RDMAPVersion: RDMAPVersion}
			if got := h.Len() + info.Extra; got != tt.headerAndExtraLen {
				t.Errorf("header + body = %d bytes, want %d", got, tt.headerAndExtraLen)
			}
			h.Last = true
			if c := h.Control(); c != tt.controlL {
				t.Errorf("control word with L = %#04x, want %#04x", c, tt.controlL)
			}
			h.Last = false
			if c := h.Control(); c != tt.controlN {
				t.Errorf("control word without L = %#04x, want %#04x", c, tt.controlN)
			}
		})
	}
	for op := Opcode(0); op < 8; op++ {
		if op.Info().Ext {
			t.Errorf("%v is marked as an RFC 7306 extension", op)
		}
	}
	for op := Opcode(0xc); op < 16; op++ {
		if op.Info().Valid {
			t.Errorf("%v is Valid; RFC 5040 and RFC 7306 define opcodes 0-0xb only", op)
		}
		if op.Solicited() || op.Invalidates() {
			t.Errorf("%v claims a solicited event or invalidation", op)
		}
	}
	if s := Opcode(0xc).String(); s != "opcode 0xc" {
		t.Errorf("unknown opcode String() = %q", s)
	}
	if Opcode(0x13).Info() != Ops[3] {
		t.Errorf("Info() does not mask the opcode to 4 bits")
	}
}
