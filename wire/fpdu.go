package wire

import "encoding/binary"

const (
	// LengthFieldLen is the size of the MPA ULPDU length field.
	LengthFieldLen = 2
	// CRCLen is the size of the MPA CRC field. It is always on the wire;
	// when CRC is not negotiated it is zero and ignored.
	CRCLen = 4
	// MaxULPDULen is the largest ULPDU an FPDU can carry.
	MaxULPDULen = 0xffff
	// MaxTrailerLen is the largest pad plus CRC.
	MaxTrailerLen = 3 + CRCLen
)

// PadLen returns the number of pad bytes after a ULPDU of length n, which
// make the length field plus ULPDU a multiple of 4.
func PadLen(n int) int { return -(LengthFieldLen + n) & 3 }

// FPDULen returns the on-wire length of an FPDU carrying a ULPDU of n bytes.
func FPDULen(n int) int { return LengthFieldLen + n + PadLen(n) + CRCLen }

// FPDU is one MPA frame: a ULPDU (the DDP segment) and its CRC field.
type FPDU struct {
	ULPDU []byte // refers into the parsed input
	CRC   uint32 // as on the wire (little-endian decoded); 0 when CRC is off
}

// ParseFPDU decodes the FPDU at the front of b. With checkCRC it verifies
// the CRC and returns ErrCRC on a mismatch; without, the field is ignored.
// It returns ErrShort when b holds only part of the FPDU.
func ParseFPDU(b []byte, checkCRC bool) (FPDU, int, error) {
	if len(b) < LengthFieldLen {
		return FPDU{}, 0, ErrShort
	}
	ulen := int(binary.BigEndian.Uint16(b))
	n := FPDULen(ulen)
	if len(b) < n {
		return FPDU{}, 0, ErrShort
	}
	crc := binary.LittleEndian.Uint32(b[n-CRCLen:])
	if checkCRC && CRC32c(b[:n-CRCLen]) != crc {
		return FPDU{}, 0, ErrCRC
	}
	return FPDU{ULPDU: b[LengthFieldLen : LengthFieldLen+ulen : LengthFieldLen+ulen], CRC: crc}, n, nil
}

// AppendFPDU appends an FPDU carrying ulpdu, with a CRC when withCRC (else
// a zero CRC field, as RFC 5044 and siw do).
func AppendFPDU(b, ulpdu []byte, withCRC bool) ([]byte, error) {
	if len(ulpdu) > MaxULPDULen {
		return b, ErrULPDUTooLong
	}
	start := len(b)
	b = binary.BigEndian.AppendUint16(b, uint16(len(ulpdu)))
	b = append(b, ulpdu...)
	b = append(b, make([]byte, PadLen(len(ulpdu)))...)
	var crc uint32
	if withCRC {
		crc = CRC32c(b[start:])
	}
	return binary.LittleEndian.AppendUint32(b, crc), nil
}

// PutTrailer writes the pad and CRC field that end an FPDU into t, which
// must hold MaxTrailerLen bytes, and returns the trailer. crc is the
// running CRC of the length field and ULPDU (UpdateCRC32c from 0); it is
// extended over the pad here. With withCRC false the CRC field is zero.
func PutTrailer(t []byte, ulpduLen int, crc uint32, withCRC bool) []byte {
	p := PadLen(ulpduLen)
	t = t[:p+CRCLen]
	clear(t[:p])
	if withCRC {
		crc = UpdateCRC32c(crc, t[:p])
	} else {
		crc = 0
	}
	binary.LittleEndian.PutUint32(t[p:], crc)
	return t
}
