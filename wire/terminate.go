package wire

import (
	"encoding/binary"
	"fmt"
)

// Layer is the protocol layer a Terminate blames (RFC 5040 §7.1).
type Layer uint8

const (
	LayerRDMAP Layer = 0
	LayerDDP   Layer = 1
	LayerMPA   Layer = 2 // the LLP: MPA over TCP
)

func (l Layer) String() string {
	switch l {
	case LayerRDMAP:
		return "RDMAP"
	case LayerDDP:
		return "DDP"
	case LayerMPA:
		return "MPA"
	}
	return fmt.Sprintf("layer %d", uint8(l))
}

// Error types, per layer (RFC 5040 §7.2, RFC 5041 §7.2, RFC 5044 §8).
const (
	RDMAPCatastrophic     = 0x0
	RDMAPRemoteProtection = 0x1
	RDMAPRemoteOperation  = 0x2

	DDPCatastrophic   = 0x0
	DDPTaggedBuffer   = 0x1
	DDPUntaggedBuffer = 0x2
	DDPReserved       = 0x3

	MPAError = 0x0
)

// TermError is an iWARP error as a Terminate message carries it: layer,
// error type and error code. The engine returns one for every error it
// detects in peer input, sends it in a Terminate, and reports a received
// Terminate as one. errors.Is matches two TermErrors with equal fields.
type TermError struct {
	Layer Layer
	Type  uint8
	Code  uint8
}

func (e *TermError) Error() string {
	if d, ok := termNames[*e]; ok {
		return "iwarp: " + d
	}
	return fmt.Sprintf("iwarp: %s error type %#x code %#x", e.Layer, e.Type, e.Code)
}

// Is makes errors.Is match on the three fields.
func (e *TermError) Is(target error) bool {
	t, ok := target.(*TermError)
	return ok && t != nil && *t == *e
}

// The errors of the RFCs' tables that gowarp detects or may receive.
var (
	ErrRDMAPCatastrophic     = &TermError{LayerRDMAP, RDMAPCatastrophic, 0x00}
	ErrRDMAPInvalidSTag      = &TermError{LayerRDMAP, RDMAPRemoteProtection, 0x00}
	ErrRDMAPBaseBounds       = &TermError{LayerRDMAP, RDMAPRemoteProtection, 0x01}
	ErrRDMAPAccessRights     = &TermError{LayerRDMAP, RDMAPRemoteProtection, 0x02}
	ErrRDMAPSTagNotAssoc     = &TermError{LayerRDMAP, RDMAPRemoteProtection, 0x03}
	ErrRDMAPTOWrap           = &TermError{LayerRDMAP, RDMAPRemoteProtection, 0x04}
	ErrRDMAPCannotInvalidate = &TermError{LayerRDMAP, RDMAPRemoteProtection, 0x09}
	ErrRDMAPVersion          = &TermError{LayerRDMAP, RDMAPRemoteOperation, 0x05}
	ErrRDMAPOpcode           = &TermError{LayerRDMAP, RDMAPRemoteOperation, 0x06}
	ErrRDMAPStream           = &TermError{LayerRDMAP, RDMAPRemoteOperation, 0x07}
	ErrRDMAPGlobal           = &TermError{LayerRDMAP, RDMAPRemoteOperation, 0x08}
	ErrRDMAPUnspecified      = &TermError{LayerRDMAP, RDMAPRemoteOperation, 0xff}

	ErrDDPCatastrophic    = &TermError{LayerDDP, DDPCatastrophic, 0x00}
	ErrDDPInvalidSTag     = &TermError{LayerDDP, DDPTaggedBuffer, 0x00}
	ErrDDPBaseBounds      = &TermError{LayerDDP, DDPTaggedBuffer, 0x01}
	ErrDDPSTagNotAssoc    = &TermError{LayerDDP, DDPTaggedBuffer, 0x02}
	ErrDDPTOWrap          = &TermError{LayerDDP, DDPTaggedBuffer, 0x03}
	ErrDDPTaggedVersion   = &TermError{LayerDDP, DDPTaggedBuffer, 0x04}
	ErrDDPInvalidQN       = &TermError{LayerDDP, DDPUntaggedBuffer, 0x01}
	ErrDDPNoBuffer        = &TermError{LayerDDP, DDPUntaggedBuffer, 0x02}
	ErrDDPInvalidMSN      = &TermError{LayerDDP, DDPUntaggedBuffer, 0x03}
	ErrDDPInvalidMO       = &TermError{LayerDDP, DDPUntaggedBuffer, 0x04}
	ErrDDPTooLong         = &TermError{LayerDDP, DDPUntaggedBuffer, 0x05}
	ErrDDPUntaggedVersion = &TermError{LayerDDP, DDPUntaggedBuffer, 0x06}

	ErrMPAStreamLost      = &TermError{LayerMPA, MPAError, 0x01}
	ErrMPACRC             = &TermError{LayerMPA, MPAError, 0x02}
	ErrMPAFPDUStart       = &TermError{LayerMPA, MPAError, 0x03}
	ErrMPAInvalidReqRep   = &TermError{LayerMPA, MPAError, 0x04}
	ErrMPACatastrophic    = &TermError{LayerMPA, MPAError, 0x05}
	ErrMPAInsufficientIRD = &TermError{LayerMPA, MPAError, 0x06}
	ErrMPANoMatchingRTR   = &TermError{LayerMPA, MPAError, 0x07}
)

var termNames = map[TermError]string{
	*ErrRDMAPCatastrophic:     "RDMAP local catastrophic error",
	*ErrRDMAPInvalidSTag:      "RDMAP remote protection error: invalid STag",
	*ErrRDMAPBaseBounds:       "RDMAP remote protection error: base or bounds violation",
	*ErrRDMAPAccessRights:     "RDMAP remote protection error: access rights violation",
	*ErrRDMAPSTagNotAssoc:     "RDMAP remote protection error: STag not associated with RDMAP stream",
	*ErrRDMAPTOWrap:           "RDMAP remote protection error: tagged offset wrap",
	*ErrRDMAPCannotInvalidate: "RDMAP remote protection error: STag cannot be invalidated",
	*ErrRDMAPVersion:          "RDMAP remote operation error: invalid RDMAP version",
	*ErrRDMAPOpcode:           "RDMAP remote operation error: unexpected opcode",
	*ErrRDMAPStream:           "RDMAP remote operation error: catastrophic error, localized to RDMAP stream",
	*ErrRDMAPGlobal:           "RDMAP remote operation error: catastrophic error, global",
	*ErrRDMAPUnspecified:      "RDMAP remote operation error: unspecified",
	*ErrDDPCatastrophic:       "DDP local catastrophic error",
	*ErrDDPInvalidSTag:        "DDP tagged buffer error: invalid STag",
	*ErrDDPBaseBounds:         "DDP tagged buffer error: base or bounds violation",
	*ErrDDPSTagNotAssoc:       "DDP tagged buffer error: STag not associated with DDP stream",
	*ErrDDPTOWrap:             "DDP tagged buffer error: tagged offset wrap",
	*ErrDDPTaggedVersion:      "DDP tagged buffer error: invalid DDP version",
	*ErrDDPInvalidQN:          "DDP untagged buffer error: invalid queue number",
	*ErrDDPNoBuffer:           "DDP untagged buffer error: no buffer available",
	*ErrDDPInvalidMSN:         "DDP untagged buffer error: invalid MSN",
	*ErrDDPInvalidMO:          "DDP untagged buffer error: invalid message offset",
	*ErrDDPTooLong:            "DDP untagged buffer error: message too long",
	*ErrDDPUntaggedVersion:    "DDP untagged buffer error: invalid DDP version",
	*ErrMPAStreamLost:         "MPA error: TCP connection closed, terminated or lost",
	*ErrMPACRC:                "MPA error: CRC error",
	*ErrMPAFPDUStart:          "MPA error: marker and ULPDU pointer mismatch",
	*ErrMPAInvalidReqRep:      "MPA error: invalid request or reply frame",
	*ErrMPACatastrophic:       "MPA error: local catastrophic error",
	*ErrMPAInsufficientIRD:    "MPA error: insufficient IRD resources",
	*ErrMPANoMatchingRTR:      "MPA error: no matching RTR model",
}

// terminateCtlLen is the size of the Terminate control word that follows
// the untagged DDP header.
const terminateCtlLen = 4

// Terminate header-control bits.
const (
	termM = 0x8000 // DDP segment length valid
	termD = 0x4000 // terminated DDP header included
	termR = 0x2000 // terminated RDMAP header (Read Request body) included

	// siw's M, D and R: see Terminate.SiwLayout.
	siwM         = 0x0100
	siwD         = 0x0200
	siwR         = 0x0400
	siwFlags     = siwM | siwD | siwR
	termReserved = 0x1fff
)

// Terminate is the RDMAP body of a Terminate message (RFC 5040 §4.8): the
// error, and optionally the header of the segment that caused it.
type Terminate struct {
	Err TermError
	// M, D and R as on the wire. Reserved holds the 13 reserved bits.
	SegLenValid, HasDDPHeader, HasRDMAHeader bool
	Reserved                                 uint16
	// SiwLayout marks a control word laid out as Linux siw sends it. siw
	// declares it as little-endian C bitfields (iwarp.h: layer:4, etype:4,
	// ecode:8, flag_m:1, flag_d:1, flag_r:1), so on x86 Layer lands in the
	// low nibble of the first byte and EType in the high one, and M, D and
	// R in the three low bits of the third byte, where RFC 5040 §4.8 puts
	// Layer first and the flags at the top. ParseTerminate recognises the
	// layout by its flags: the RFC's clear, siw's set and every other bit
	// of the third and fourth bytes clear (siw zeroes them). It then
	// decodes Err and the flags as siw meant them. A siw Terminate with no
	// flag set cannot be told apart and reads with Layer and EType swapped.
	SiwLayout bool
	// Rest is everything after the control word, as on the wire: with M,
	// D or R a 2-byte DDP segment length, then (D) the offending DDP
	// header, then (R) the offending Read Request body. Accessors decode it.
	Rest []byte
}

// NewTerminate returns the Terminate that reports err about the FPDU whose
// ULPDU begins with head (nil when none is to be echoed) and is ulpduLen
// bytes long; head needs only hold the DDP/RDMAP header and Read Request
// body. Following RFC 5040 §7.1 and siw: DDP errors and RDMAP
// remote-operation errors echo the DDP header; RDMAP protection errors on a
// Read Request also echo its body; nothing is echoed when the header's
// layout cannot be trusted (bad version or opcode), nor for MPA and
// catastrophic errors. The echoed length field holds the DDP segment's
// payload length. scratch is space for Rest.
func NewTerminate(err *TermError, head []byte, ulpduLen int, scratch []byte) Terminate {
	t := Terminate{Err: *err}
	if head == nil || err.Layer == LayerMPA ||
		err.Type == 0 || *err == *ErrRDMAPVersion || *err == *ErrRDMAPOpcode ||
		*err == *ErrDDPTaggedVersion || *err == *ErrDDPUntaggedVersion {
		return t
	}
	h, n, perr := ParseHeader(head)
	if perr != nil {
		return t
	}
	echo := n
	if err.Layer == LayerRDMAP && err.Type == RDMAPRemoteProtection && h.Opcode == OpReadRequest && len(head) >= n+ReadRequestLen {
		echo += ReadRequestLen
		t.HasRDMAHeader = true
	}
	payload := ulpduLen - n
	if h.Opcode.Info().Valid {
		payload -= h.Opcode.Info().Extra
	}
	payload = max(payload, 0)
	t.SegLenValid, t.HasDDPHeader = true, true
	scratch = binary.BigEndian.AppendUint16(scratch[:0], uint16(payload))
	t.Rest = append(scratch, head[:echo]...)
	return t
}

// Len returns the encoded length of the body.
func (t *Terminate) Len() int { return terminateCtlLen + len(t.Rest) }

// termLayout places the fields of the control word: the RFC's, or siw's
// (see Terminate.SiwLayout), which has no reserved bits.
type termLayout struct {
	layerShift, typeShift uint
	m, d, r, reserved     uint32
}

var (
	rfcTermLayout = termLayout{layerShift: 28, typeShift: 24, m: termM, d: termD, r: termR, reserved: termReserved}
	siwTermLayout = termLayout{layerShift: 24, typeShift: 28, m: siwM, d: siwD, r: siwR}
)

func (t *Terminate) layout() *termLayout {
	if t.SiwLayout {
		return &siwTermLayout
	}
	return &rfcTermLayout
}

// word encodes t's control word in layout l.
func (l *termLayout) word(t *Terminate) uint32 {
	w := uint32(t.Err.Layer&0xf)<<l.layerShift | uint32(t.Err.Type&0xf)<<l.typeShift | uint32(t.Err.Code)<<16 | uint32(t.Reserved)&l.reserved
	if t.SegLenValid {
		w |= l.m
	}
	if t.HasDDPHeader {
		w |= l.d
	}
	if t.HasRDMAHeader {
		w |= l.r
	}
	return w
}

// parse decodes control word w in layout l.
func (l *termLayout) parse(w uint32) Terminate {
	return Terminate{
		Err:           TermError{Layer: Layer(w>>l.layerShift) & 0xf, Type: uint8(w>>l.typeShift) & 0xf, Code: uint8(w >> 16)},
		SegLenValid:   w&l.m != 0,
		HasDDPHeader:  w&l.d != 0,
		HasRDMAHeader: w&l.r != 0,
		Reserved:      uint16(w & l.reserved),
		SiwLayout:     l == &siwTermLayout,
	}
}

// Append appends the encoded body (control word and Rest) to b.
func (t *Terminate) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, t.layout().word(t))
	return append(b, t.Rest...)
}

// ParseTerminate decodes a Terminate body (the bytes after the untagged
// DDP header), in the RFC's layout or in siw's (see SiwLayout). It
// returns ErrTerminateFormat when the body is shorter than its control
// word, or than the parts its M, D and R flags announce.
func ParseTerminate(b []byte) (Terminate, int, error) {
	if len(b) < terminateCtlLen {
		return Terminate{}, 0, ErrTerminateFormat
	}
	w := binary.BigEndian.Uint32(b)
	l := &rfcTermLayout
	if w&0xffff&^siwFlags == 0 && w&siwFlags != 0 {
		l = &siwTermLayout
	}
	t := l.parse(w)
	if rest := b[terminateCtlLen:]; len(rest) > 0 {
		t.Rest = rest
	}
	if len(t.Rest) < t.restLen() {
		return Terminate{}, 0, ErrTerminateFormat
	}
	return t, len(b), nil
}

// restLen returns how many bytes of Rest the flags call for: with M, D or R
// the 2-byte segment length; with D the echoed DDP header, 14 or 18 bytes as
// its T bit says; with R and an echoed Read Request its 28-byte body. (siw
// also sets R when it echoes a Send, with no RDMAP header, so R demands
// nothing on its own.)
func (t *Terminate) restLen() int {
	if !t.SegLenValid && !t.HasDDPHeader && !t.HasRDMAHeader {
		return 0
	}
	n := 2
	if !t.HasDDPHeader {
		return n
	}
	if len(t.Rest) < 2+2 {
		return 2 + TaggedHeaderLen // the shorter header; not there either
	}
	if t.Rest[2]&ddpTagged != 0 {
		return n + TaggedHeaderLen
	}
	n += UntaggedHeaderLen
	if t.HasRDMAHeader && Opcode(t.Rest[3]&0xf) == OpReadRequest {
		n += ReadRequestLen
	}
	return n
}

// SegmentLength returns the echoed DDP segment length, if M is set.
func (t *Terminate) SegmentLength() (uint16, bool) {
	if !t.SegLenValid || len(t.Rest) < 2 {
		return 0, false
	}
	return binary.BigEndian.Uint16(t.Rest), true
}

// DDPHeader decodes the echoed DDP/RDMAP header, if D is set.
func (t *Terminate) DDPHeader() (Header, bool) {
	if !t.HasDDPHeader || len(t.Rest) < 2 {
		return Header{}, false
	}
	h, _, err := ParseHeader(t.Rest[2:])
	return h, err == nil
}

// ReadRequest decodes the echoed Read Request body, if R is set.
func (t *Terminate) ReadRequest() (ReadRequest, bool) {
	if !t.HasRDMAHeader || len(t.Rest) < 2+UntaggedHeaderLen+ReadRequestLen {
		return ReadRequest{}, false
	}
	r, _, err := ParseReadRequest(t.Rest[2+UntaggedHeaderLen:])
	return r, err == nil
}
