package wire

import "fmt"

// Opcode is the 4-bit RDMAP opcode (RFC 5040 §4.3; RFC 7306 adds 8–12).
type Opcode uint8

const (
	OpWrite        Opcode = 0x0
	OpReadRequest  Opcode = 0x1
	OpReadResponse Opcode = 0x2
	OpSend         Opcode = 0x3
	OpSendInv      Opcode = 0x4 // Send with Invalidate
	OpSendSE       Opcode = 0x5 // Send with Solicited Event
	OpSendSEInv    Opcode = 0x6 // Send with Solicited Event and Invalidate
	OpTerminate    Opcode = 0x7

	// RFC 7306 extensions, spoken only to a peer that offered them
	// (OpInfo.Ext; gowarp negotiates them in the MPA private data).
	OpImmediate      Opcode = 0x8 // Immediate Data
	OpImmediateSE    Opcode = 0x9 // Immediate Data with Solicited Event
	OpAtomicRequest  Opcode = 0xa
	OpAtomicResponse Opcode = 0xb
)

// Untagged queue numbers (RFC 5040 §5.1).
const (
	QNSend      = 0
	QNRead      = 1
	QNTerminate = 2
	// QNAtomicResponse carries Atomic Responses (RFC 7306 §8; Atomic
	// Requests share QNRead with Read Requests, as they share IRD/ORD).
	QNAtomicResponse = 3
)

// RDMAP and DDP versions gowarp speaks (RFC 5040/5041: both 1).
const (
	RDMAPVersion = 1
	DDPVersion   = 1
)

// OpInfo is one row of the opcode table: everything the codec and the
// engine need to know about an opcode's wire shape.
type OpInfo struct {
	Name   string
	Valid  bool   // defined and supported by gowarp
	Tagged bool   // carried in tagged DDP segments
	QN     uint32 // untagged queue number
	// Extra is the number of RDMAP bytes that follow the DDP header before
	// the payload: the Read Request body, the Terminate control word.
	Extra int
	// Send is true for the opcodes that consume a receive WQE: the four
	// Sends and Immediate Data (RFC 7306 §4.1).
	Send bool
	// Ext marks RFC 7306's opcodes: a receiver takes them only from a
	// peer it negotiated them with, and refuses them otherwise as
	// unexpected opcodes.
	Ext bool
}

// Ops is the opcode table, indexed by opcode.
var Ops = [16]OpInfo{
	OpWrite:        {Name: "RDMA Write", Valid: true, Tagged: true},
	OpReadRequest:  {Name: "RDMA Read Request", Valid: true, QN: QNRead, Extra: ReadRequestLen},
	OpReadResponse: {Name: "RDMA Read Response", Valid: true, Tagged: true},
	OpSend:         {Name: "Send", Valid: true, QN: QNSend, Send: true},
	OpSendInv:      {Name: "Send with Invalidate", Valid: true, QN: QNSend, Send: true},
	OpSendSE:       {Name: "Send with Solicited Event", Valid: true, QN: QNSend, Send: true},
	OpSendSEInv:    {Name: "Send with Solicited Event and Invalidate", Valid: true, QN: QNSend, Send: true},
	OpTerminate:    {Name: "Terminate", Valid: true, QN: QNTerminate, Extra: terminateCtlLen},

	OpImmediate:      {Name: "Immediate Data", Valid: true, Ext: true, QN: QNSend, Extra: ImmediateLen, Send: true},
	OpImmediateSE:    {Name: "Immediate Data with Solicited Event", Valid: true, Ext: true, QN: QNSend, Extra: ImmediateLen, Send: true},
	OpAtomicRequest:  {Name: "Atomic Request", Valid: true, Ext: true, QN: QNRead, Extra: AtomicRequestLen},
	OpAtomicResponse: {Name: "Atomic Response", Valid: true, Ext: true, QN: QNAtomicResponse, Extra: AtomicResponseLen},
}

func (o Opcode) String() string {
	if int(o) < len(Ops) && Ops[o].Name != "" {
		return Ops[o].Name
	}
	return fmt.Sprintf("opcode %#x", uint8(o))
}

// Info returns the opcode's table row; an unknown opcode's row is not Valid.
func (o Opcode) Info() OpInfo { return Ops[o&0xf] }

// Solicited reports whether the opcode carries a solicited event.
func (o Opcode) Solicited() bool { return o == OpSendSE || o == OpSendSEInv || o == OpImmediateSE }

// Invalidates reports whether the opcode invalidates an STag at the peer.
func (o Opcode) Invalidates() bool { return o == OpSendInv || o == OpSendSEInv }
