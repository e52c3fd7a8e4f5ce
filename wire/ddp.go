package wire

import "encoding/binary"

// DDP header lengths, not counting the MPA length field (RFC 5041 §4).
const (
	TaggedHeaderLen   = 14 // control(2) STag(4) TO(8)
	UntaggedHeaderLen = 18 // control(2) RsvdULP(4) QN(4) MSN(4) MO(4)
)

// DDP control bits (first byte of the DDP/RDMAP control word).
const (
	ddpTagged = 0x80
	ddpLast   = 0x40
)

// Header is a DDP segment header with its RDMAP control fields: the bytes
// of a ULPDU before the RDMAP body and payload.
type Header struct {
	Opcode       Opcode
	Tagged, Last bool
	DDPVersion   uint8 // DV, 2 bits; 1 on the wire
	RDMAPVersion uint8 // RV, 2 bits; 1 on the wire
	// Reserved bits as received (DDP: 4 bits, RDMAP: 2 bits), kept so a
	// header re-encodes byte for byte.
	DDPReserved, RDMAPReserved uint8

	// Tagged buffer model.
	STag uint32
	TO   uint64

	// Untagged buffer model. RsvdULP is the STag to invalidate in a Send
	// with Invalidate, zero otherwise.
	RsvdULP     uint32
	QN, MSN, MO uint32
}

// Len returns the encoded length of h (without the MPA length field).
func (h *Header) Len() int {
	if h.Tagged {
		return TaggedHeaderLen
	}
	return UntaggedHeaderLen
}

// Control returns the 16-bit DDP/RDMAP control word.
func (h *Header) Control() uint16 {
	c := uint16(h.DDPVersion&3)<<8 | uint16(h.DDPReserved&0xf)<<10 |
		uint16(h.RDMAPVersion&3)<<6 | uint16(h.RDMAPReserved&3)<<4 | uint16(h.Opcode&0xf)
	if h.Tagged {
		c |= ddpTagged << 8
	}
	if h.Last {
		c |= ddpLast << 8
	}
	return c
}

// Append appends the encoded header to b.
func (h *Header) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, h.Control())
	if h.Tagged {
		b = binary.BigEndian.AppendUint32(b, h.STag)
		return binary.BigEndian.AppendUint64(b, h.TO)
	}
	b = binary.BigEndian.AppendUint32(b, h.RsvdULP)
	b = binary.BigEndian.AppendUint32(b, h.QN)
	b = binary.BigEndian.AppendUint32(b, h.MSN)
	return binary.BigEndian.AppendUint32(b, h.MO)
}

// Put writes the encoded header into b, which must hold h.Len() bytes; it
// is the in-place form used on the transmit path.
func (h *Header) Put(b []byte) int {
	binary.BigEndian.PutUint16(b, h.Control())
	if h.Tagged {
		binary.BigEndian.PutUint32(b[2:], h.STag)
		binary.BigEndian.PutUint64(b[6:], h.TO)
		return TaggedHeaderLen
	}
	binary.BigEndian.PutUint32(b[2:], h.RsvdULP)
	binary.BigEndian.PutUint32(b[6:], h.QN)
	binary.BigEndian.PutUint32(b[10:], h.MSN)
	binary.BigEndian.PutUint32(b[14:], h.MO)
	return UntaggedHeaderLen
}

// ParseHeader decodes the DDP/RDMAP header at the front of a ULPDU. It
// checks only that the bytes are there; versions, opcode and queue number
// are the receiver's to judge, since each has its own Terminate code.
func ParseHeader(b []byte) (Header, int, error) {
	var h Header
	n, err := h.Decode(b)
	if err != nil {
		return Header{}, 0, err
	}
	return h, n, nil
}

// Decode is ParseHeader into h, which it overwrites; on an error h is
// left undefined. A receiver that keeps its header decodes in place:
// building the header byte by byte and copying it whole stalls the
// loads that copy it (store forwarding): a tenth of receiving a small
// Send (BenchmarkRecvSend8).
func (h *Header) Decode(b []byte) (int, error) {
	if len(b) < 2 {
		return 0, ErrULPDUTooShort
	}
	c0, c1 := b[0], b[1]
	h.Opcode = Opcode(c1 & 0xf)
	h.Tagged = c0&ddpTagged != 0
	h.Last = c0&ddpLast != 0
	h.DDPVersion = c0 & 3
	h.RDMAPVersion = c1 >> 6
	h.DDPReserved = c0 >> 2 & 0xf
	h.RDMAPReserved = c1 >> 4 & 3
	if h.Tagged {
		if len(b) < TaggedHeaderLen {
			return 0, ErrULPDUTooShort
		}
		h.STag = binary.BigEndian.Uint32(b[2:])
		h.TO = binary.BigEndian.Uint64(b[6:])
		h.RsvdULP, h.QN, h.MSN, h.MO = 0, 0, 0, 0
		return TaggedHeaderLen, nil
	}
	if len(b) < UntaggedHeaderLen {
		return 0, ErrULPDUTooShort
	}
	h.STag, h.TO = 0, 0
	h.RsvdULP = binary.BigEndian.Uint32(b[2:])
	h.QN = binary.BigEndian.Uint32(b[6:])
	h.MSN = binary.BigEndian.Uint32(b[10:])
	h.MO = binary.BigEndian.Uint32(b[14:])
	return UntaggedHeaderLen, nil
}

// ReadRequestLen is the length of the RDMA Read Request body (RFC 5040 §4.4).
const ReadRequestLen = 28

// ReadRequest is the body of an RDMA Read Request: where the data goes
// (sink, at the requester) and where it comes from (source, at the
// responder).
type ReadRequest struct {
	SinkSTag   uint32
	SinkTO     uint64
	Size       uint32
	SourceSTag uint32
	SourceTO   uint64
}

// Append appends the encoded body to b.
func (r *ReadRequest) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, r.SinkSTag)
	b = binary.BigEndian.AppendUint64(b, r.SinkTO)
	b = binary.BigEndian.AppendUint32(b, r.Size)
	b = binary.BigEndian.AppendUint32(b, r.SourceSTag)
	return binary.BigEndian.AppendUint64(b, r.SourceTO)
}

// ParseReadRequest decodes a Read Request body.
func ParseReadRequest(b []byte) (ReadRequest, int, error) {
	if len(b) < ReadRequestLen {
		return ReadRequest{}, 0, ErrULPDUTooShort
	}
	return ReadRequest{
		SinkSTag:   binary.BigEndian.Uint32(b[0:]),
		SinkTO:     binary.BigEndian.Uint64(b[4:]),
		Size:       binary.BigEndian.Uint32(b[12:]),
		SourceSTag: binary.BigEndian.Uint32(b[16:]),
		SourceTO:   binary.BigEndian.Uint64(b[20:]),
	}, ReadRequestLen, nil
}
