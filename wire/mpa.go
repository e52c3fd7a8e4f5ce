package wire

import (
	"encoding/binary"
	"fmt"
)

// MPA request/reply keys (RFC 5044 §7.1).
const (
	MPAKeyRequest = "MPA ID Req Frame"
	MPAKeyReply   = "MPA ID Rep Frame"
)

const (
	// MPAHeaderLen is the fixed part of an MPA request or reply: key,
	// flags, revision and private-data length.
	MPAHeaderLen = 20
	// MaxMPAPrivateData is RFC 5044's limit on private data, including
	// RFC 6581's 4-byte IRD/ORD block.
	MaxMPAPrivateData = 512
	// mpaIRDORDLen is the size of RFC 6581's IRD/ORD block.
	mpaIRDORDLen = 4
	// MaxIRDORD is the largest IRD or ORD the 14-bit fields carry.
	MaxIRDORD = 0x3fff
)

// MPA flag bits (the byte after the key).
const (
	mpaFlagMarkers  = 0x80
	mpaFlagCRC      = 0x40
	mpaFlagReject   = 0x20
	mpaFlagEnhanced = 0x10
	mpaFlagReserved = 0x0f
)

// RTR is the set of ready-to-receive message types of RFC 6581 §5: an
// initiator offers one or more, a responder picks exactly one.
type RTR uint8

const (
	RTRSend  RTR = 1 << iota // zero-length Send (IRD bit 14)
	RTRWrite                 // zero-length RDMA Write (ORD bit 15)
	RTRRead                  // zero-length RDMA Read (ORD bit 14)
)

func (r RTR) String() string {
	if r == 0 {
		return "none"
	}
	s := ""
	for _, x := range []struct {
		b RTR
		n string
	}{{RTRSend, "send"}, {RTRWrite, "write"}, {RTRRead, "read"}} {
		if r&x.b != 0 {
			if s != "" {
				s += "|"
			}
			s += x.n
		}
	}
	return s
}

// MPAFrame is an MPA request or reply (RFC 5044 §7.1), with RFC 6581's
// enhanced connection setup when Enhanced is set.
type MPAFrame struct {
	Reply    bool // "MPA ID Rep Frame" rather than "MPA ID Req Frame"
	Markers  bool // M: markers wanted (gowarp refuses them)
	CRC      bool // C: CRC wanted
	Reject   bool // R: the reply rejects the connection
	Enhanced bool // H: RFC 6581 IRD/ORD block leads the private data
	// ReservedFlags holds the four reserved flag bits as received, so a
	// frame re-encodes byte for byte (siw uses 0x08 privately).
	ReservedFlags uint8
	Revision      uint8

	// The IRD/ORD block, meaningful when Enhanced.
	IRD, ORD uint16 // 14-bit values
	P2P      bool   // peer-to-peer mode: an RTR message follows
	RTR      RTR    // RTR types offered (request) or chosen (reply)

	// PrivateData is the consumer's private data, after the IRD/ORD block.
	PrivateData []byte
}

// Len returns the encoded length of f.
func (f *MPAFrame) Len() int {
	n := MPAHeaderLen + len(f.PrivateData)
	if f.Enhanced {
		n += mpaIRDORDLen
	}
	return n
}

// Append appends the encoded frame to b.
func (f *MPAFrame) Append(b []byte) ([]byte, error) {
	pd := len(f.PrivateData)
	if f.Enhanced {
		pd += mpaIRDORDLen
		if f.IRD > MaxIRDORD || f.ORD > MaxIRDORD {
			return b, fmt.Errorf("wire: IRD %d / ORD %d exceed %d", f.IRD, f.ORD, MaxIRDORD)
		}
	}
	if pd > MaxMPAPrivateData {
		return b, ErrMPAPrivateData
	}
	if f.Reply {
		b = append(b, MPAKeyReply...)
	} else {
		b = append(b, MPAKeyRequest...)
	}
	flags := f.ReservedFlags & mpaFlagReserved
	if f.Markers {
		flags |= mpaFlagMarkers
	}
	if f.CRC {
		flags |= mpaFlagCRC
	}
	if f.Reject {
		flags |= mpaFlagReject
	}
	if f.Enhanced {
		flags |= mpaFlagEnhanced
	}
	b = append(b, flags, f.Revision)
	b = binary.BigEndian.AppendUint16(b, uint16(pd))
	if f.Enhanced {
		ird, ord := f.IRD, f.ORD
		if f.P2P {
			ird |= 0x8000
		}
		if f.RTR&RTRSend != 0 {
			ird |= 0x4000
		}
		if f.RTR&RTRWrite != 0 {
			ord |= 0x8000
		}
		if f.RTR&RTRRead != 0 {
			ord |= 0x4000
		}
		b = binary.BigEndian.AppendUint16(b, ird)
		b = binary.BigEndian.AppendUint16(b, ord)
	}
	return append(b, f.PrivateData...), nil
}

// MPAFrameLen returns the total length of the MPA frame whose first
// MPAHeaderLen bytes are in b, so a reader knows how much more to read.
func MPAFrameLen(b []byte) (int, error) {
	if len(b) < MPAHeaderLen {
		return 0, ErrShort
	}
	key := string(b[:16])
	if key != MPAKeyRequest && key != MPAKeyReply {
		return 0, ErrMPAKey
	}
	pd := int(binary.BigEndian.Uint16(b[18:20]))
	if pd > MaxMPAPrivateData {
		return 0, ErrMPAPrivateData
	}
	return MPAHeaderLen + pd, nil
}

// ParseMPAFrame decodes an MPA request or reply from the front of b. The
// private data refers into b.
func ParseMPAFrame(b []byte) (MPAFrame, int, error) {
	n, err := MPAFrameLen(b)
	if err != nil {
		return MPAFrame{}, 0, err
	}
	if len(b) < n {
		return MPAFrame{}, 0, ErrShort
	}
	flags := b[16]
	f := MPAFrame{
		Reply:         string(b[:16]) == MPAKeyReply,
		Markers:       flags&mpaFlagMarkers != 0,
		CRC:           flags&mpaFlagCRC != 0,
		Reject:        flags&mpaFlagReject != 0,
		Enhanced:      flags&mpaFlagEnhanced != 0,
		ReservedFlags: flags & mpaFlagReserved,
		Revision:      b[17],
	}
	pd := b[MPAHeaderLen:n:n]
	if f.Enhanced {
		if len(pd) < mpaIRDORDLen {
			return MPAFrame{}, 0, ErrMPAEnhanced
		}
		ird := binary.BigEndian.Uint16(pd[0:2])
		ord := binary.BigEndian.Uint16(pd[2:4])
		f.IRD, f.ORD = ird&MaxIRDORD, ord&MaxIRDORD
		f.P2P = ird&0x8000 != 0
		if ird&0x4000 != 0 {
			f.RTR |= RTRSend
		}
		if ord&0x8000 != 0 {
			f.RTR |= RTRWrite
		}
		if ord&0x4000 != 0 {
			f.RTR |= RTRRead
		}
		pd = pd[mpaIRDORDLen:]
	}
	if len(pd) > 0 {
		f.PrivateData = pd
	}
	return f, n, nil
}
