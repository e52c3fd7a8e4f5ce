package wire

import (
	"encoding/binary"
	"fmt"
)

// RFC 7306 (RDMA Protocol Extensions): Immediate Data and Atomic
// Operations. The layouts here are the RFC's; urdma's protocol headers
// and Chelsio's firmware agree on the opcodes (0x8–0xB). gowarp speaks
// them only to a peer that offered them while connecting (see OpInfo.Ext).

// ImmediateLen is the length of an Immediate Data message's body: the
// 8 bytes of Immediate Data (RFC 7306 §4.1).
const ImmediateLen = 8

// AppendImmediate appends an Immediate Data body carrying v to b.
func AppendImmediate(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }

// ParseImmediate decodes an Immediate Data body.
func ParseImmediate(b []byte) (uint64, int, error) {
	if len(b) < ImmediateLen {
		return 0, 0, ErrULPDUTooShort
	}
	return binary.BigEndian.Uint64(b), ImmediateLen, nil
}

// AtomicOp is the Atomic Operation code of an Atomic Request (RFC 7306
// §5.2.1, the low 4 bits of its first word).
type AtomicOp uint8

const (
	AtomicFetchAdd AtomicOp = 0x0 // FetchAdd (masked when a mask is given)
	AtomicCmpSwap  AtomicOp = 0x1 // CmpSwap (masked when masks are given)
)

func (o AtomicOp) String() string {
	switch o {
	case AtomicFetchAdd:
		return "FetchAdd"
	case AtomicCmpSwap:
		return "CmpSwap"
	}
	return fmt.Sprintf("atomic op %#x", uint8(o))
}

// Valid reports whether the peer defined o.
func (o AtomicOp) Valid() bool { return o <= AtomicCmpSwap }

// AtomicRequestLen is the length of an Atomic Request body: reserved
// bits and opcode (4), Request Identifier (4), Remote STag (4), Remote
// Tagged Offset (8), Add or Swap Data and Mask (8 each), Compare Data and
// Mask (8 each).
const AtomicRequestLen = 52

// AtomicRequest is the body of an Atomic Request (RFC 7306 §5.2.1). The
// target is the 8 aligned bytes at RemoteTO in the region RemoteSTag
// names. FetchAdd adds AddSwap to them (with AddSwapMask, the RFC's
// masked form: a set bit ends a field, no carry crosses it); CmpSwap
// replaces the bits of AddSwapMask with AddSwap's where the bits of
// CompareMask equal Compare's. Both return the original value.
type AtomicRequest struct {
	Op AtomicOp
	// Reserved holds the 28 bits before the opcode as received, so a
	// body re-encodes byte for byte.
	Reserved    uint32
	ReqID       uint32
	RemoteSTag  uint32
	RemoteTO    uint64
	AddSwap     uint64
	AddSwapMask uint64
	Compare     uint64
	CompareMask uint64
}

// Append appends the encoded body to b.
func (r *AtomicRequest) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, r.Reserved<<4|uint32(r.Op&0xf))
	b = binary.BigEndian.AppendUint32(b, r.ReqID)
	b = binary.BigEndian.AppendUint32(b, r.RemoteSTag)
	b = binary.BigEndian.AppendUint64(b, r.RemoteTO)
	b = binary.BigEndian.AppendUint64(b, r.AddSwap)
	b = binary.BigEndian.AppendUint64(b, r.AddSwapMask)
	b = binary.BigEndian.AppendUint64(b, r.Compare)
	return binary.BigEndian.AppendUint64(b, r.CompareMask)
}

// ParseAtomicRequest decodes an Atomic Request body. It checks only the
// length: an unknown opcode is the receiver's to refuse, with its
// Terminate.
func ParseAtomicRequest(b []byte) (AtomicRequest, int, error) {
	if len(b) < AtomicRequestLen {
		return AtomicRequest{}, 0, ErrULPDUTooShort
	}
	w := binary.BigEndian.Uint32(b)
	return AtomicRequest{
		Op:          AtomicOp(w & 0xf),
		Reserved:    w >> 4,
		ReqID:       binary.BigEndian.Uint32(b[4:]),
		RemoteSTag:  binary.BigEndian.Uint32(b[8:]),
		RemoteTO:    binary.BigEndian.Uint64(b[12:]),
		AddSwap:     binary.BigEndian.Uint64(b[20:]),
		AddSwapMask: binary.BigEndian.Uint64(b[28:]),
		Compare:     binary.BigEndian.Uint64(b[36:]),
		CompareMask: binary.BigEndian.Uint64(b[44:]),
	}, AtomicRequestLen, nil
}

// AtomicResponseLen is the length of an Atomic Response body: the
// Original Request Identifier (4) and the Original Remote Data Value (8).
const AtomicResponseLen = 12

// AtomicResponse is the body of an Atomic Response (RFC 7306 §5.2.2):
// the value the target held before the operation.
type AtomicResponse struct {
	ReqID    uint32
	Original uint64
}

// Append appends the encoded body to b.
func (r *AtomicResponse) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, r.ReqID)
	return binary.BigEndian.AppendUint64(b, r.Original)
}

// ParseAtomicResponse decodes an Atomic Response body.
func ParseAtomicResponse(b []byte) (AtomicResponse, int, error) {
	if len(b) < AtomicResponseLen {
		return AtomicResponse{}, 0, ErrULPDUTooShort
	}
	return AtomicResponse{ReqID: binary.BigEndian.Uint32(b), Original: binary.BigEndian.Uint64(b[4:])}, AtomicResponseLen, nil
}
