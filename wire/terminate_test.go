package wire

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// The errors the RFCs define (RFC 5040 §7.2, RFC 5041 §7.2, RFC 5044 §8,
// RFC 6581 §7; siw's iwarp.h has the same numbers), with what Error()
// must say about each.
var termErrorTable = []struct {
	err               *TermError
	layer             Layer
	etype, code       uint8
	wantLayer, wantIn string
}{
	{ErrRDMAPCatastrophic, LayerRDMAP, 0, 0x00, "RDMAP", "local catastrophic"},
	{ErrRDMAPInvalidSTag, LayerRDMAP, 1, 0x00, "RDMAP", "protection error: invalid STag"},
	{ErrRDMAPBaseBounds, LayerRDMAP, 1, 0x01, "RDMAP", "protection error: base or bounds violation"},
	{ErrRDMAPAccessRights, LayerRDMAP, 1, 0x02, "RDMAP", "protection error: access rights violation"},
	{ErrRDMAPSTagNotAssoc, LayerRDMAP, 1, 0x03, "RDMAP", "protection error: STag not associated with RDMAP stream"},
	{ErrRDMAPTOWrap, LayerRDMAP, 1, 0x04, "RDMAP", "protection error: tagged offset wrap"},
	{ErrRDMAPCannotInvalidate, LayerRDMAP, 1, 0x09, "RDMAP", "STag cannot be invalidated"},
	{ErrRDMAPVersion, LayerRDMAP, 2, 0x05, "RDMAP", "operation error: invalid RDMAP version"},
	{ErrRDMAPOpcode, LayerRDMAP, 2, 0x06, "RDMAP", "operation error: unexpected opcode"},
	{ErrRDMAPStream, LayerRDMAP, 2, 0x07, "RDMAP", "catastrophic error, localized to RDMAP stream"},
	{ErrRDMAPGlobal, LayerRDMAP, 2, 0x08, "RDMAP", "catastrophic error, global"},
	{ErrRDMAPUnspecified, LayerRDMAP, 2, 0xff, "RDMAP", "unspecified"},
	{ErrDDPCatastrophic, LayerDDP, 0, 0x00, "DDP", "local catastrophic"},
	{ErrDDPInvalidSTag, LayerDDP, 1, 0x00, "DDP", "tagged buffer error: invalid STag"},
	{ErrDDPBaseBounds, LayerDDP, 1, 0x01, "DDP", "tagged buffer error: base or bounds violation"},
	{ErrDDPSTagNotAssoc, LayerDDP, 1, 0x02, "DDP", "tagged buffer error: STag not associated with DDP stream"},
	{ErrDDPTOWrap, LayerDDP, 1, 0x03, "DDP", "tagged buffer error: tagged offset wrap"},
	{ErrDDPTaggedVersion, LayerDDP, 1, 0x04, "DDP", "tagged buffer error: invalid DDP version"},
	{ErrDDPInvalidQN, LayerDDP, 2, 0x01, "DDP", "untagged buffer error: invalid queue number"},
	{ErrDDPNoBuffer, LayerDDP, 2, 0x02, "DDP", "untagged buffer error: no buffer available"},
	{ErrDDPInvalidMSN, LayerDDP, 2, 0x03, "DDP", "untagged buffer error: invalid MSN"},
	{ErrDDPInvalidMO, LayerDDP, 2, 0x04, "DDP", "untagged buffer error: invalid message offset"},
	{ErrDDPTooLong, LayerDDP, 2, 0x05, "DDP", "untagged buffer error: message too long"},
	{ErrDDPUntaggedVersion, LayerDDP, 2, 0x06, "DDP", "untagged buffer error: invalid DDP version"},
	{ErrMPAStreamLost, LayerMPA, 0, 0x01, "MPA", "TCP connection closed"},
	{ErrMPACRC, LayerMPA, 0, 0x02, "MPA", "CRC error"},
	{ErrMPAFPDUStart, LayerMPA, 0, 0x03, "MPA", "marker and ULPDU pointer mismatch"},
	{ErrMPAInvalidReqRep, LayerMPA, 0, 0x04, "MPA", "invalid request or reply"},
	{ErrMPACatastrophic, LayerMPA, 0, 0x05, "MPA", "local catastrophic"},
	{ErrMPAInsufficientIRD, LayerMPA, 0, 0x06, "MPA", "insufficient IRD"},
	{ErrMPANoMatchingRTR, LayerMPA, 0, 0x07, "MPA", "no matching RTR"},
}

func TestTermErrorCodes(t *testing.T) {
	seen := map[string]bool{}
	for _, tt := range termErrorTable {
		want := TermError{tt.layer, tt.etype, tt.code}
		if *tt.err != want {
			t.Errorf("%v is %+v, want %+v", tt.err, *tt.err, want)
		}
		s := tt.err.Error()
		if !strings.HasPrefix(s, "iwarp: "+tt.wantLayer+" ") || !strings.Contains(s, tt.wantIn) {
			t.Errorf("%+v: Error() = %q, want the %s condition %q", want, s, tt.wantLayer, tt.wantIn)
		}
		if seen[s] {
			t.Errorf("Error() %q used twice", s)
		}
		seen[s] = true
	}
	// Combinations no RFC names still say what they are.
	for _, tt := range []struct {
		e    TermError
		want string
	}{
		{TermError{LayerDDP, 3, 0x07}, "iwarp: DDP error type 0x3 code 0x7"},
		{TermError{LayerRDMAP, 1, 0x42}, "iwarp: RDMAP error type 0x1 code 0x42"},
		{TermError{9, 0xf, 0xff}, "iwarp: layer 9 error type 0xf code 0xff"},
	} {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("%+v: Error() = %q, want %q", tt.e, got, tt.want)
		}
	}
}

func TestTermErrorIs(t *testing.T) {
	for i, a := range termErrorTable {
		for j, b := range termErrorTable {
			copyOfB := *b.err // a received Terminate builds its own value
			if got := errors.Is(a.err, &copyOfB); got != (i == j) {
				t.Errorf("errors.Is(%v, %v) = %v", a.err, b.err, got)
			}
			wrapped := fmt.Errorf("qp 3: %w", &TermError{a.layer, a.etype, a.code})
			if got := errors.Is(wrapped, b.err); got != (i == j) {
				t.Errorf("errors.Is(wrapped %v, %v) = %v", a.err, b.err, got)
			}
		}
		if errors.Is(a.err, ErrShort) || errors.Is(a.err, ErrCRC) || errors.Is(ErrCRC, a.err) {
			t.Errorf("%v matches a codec error", a.err)
		}
		var target *TermError
		if errors.Is(a.err, target) {
			t.Errorf("%v matches a nil *TermError", a.err)
		}
		if !errors.As(fmt.Errorf("x: %w", a.err), &target) || *target != *a.err {
			t.Errorf("errors.As does not find %v", a.err)
		}
	}
}

func TestLayerString(t *testing.T) {
	for l, want := range map[Layer]string{LayerRDMAP: "RDMAP", LayerDDP: "DDP", LayerMPA: "MPA", 3: "layer 3", 15: "layer 15"} {
		if got := l.String(); got != want {
			t.Errorf("Layer(%d).String() = %q, want %q", l, got, want)
		}
	}
}

func TestTerminateRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		t    Terminate
	}{
		{"MPA CRC error, nothing echoed", Terminate{Err: *ErrMPACRC}},
		{"RDMAP catastrophic", Terminate{Err: *ErrRDMAPCatastrophic}},
		{"reserved bits", Terminate{Err: *ErrRDMAPUnspecified, Reserved: 0x1fff}},
		{"unknown layer, type and code", Terminate{Err: TermError{0xf, 0xf, 0xee}, Reserved: 0x0155}},
		{"segment length only", Terminate{Err: *ErrDDPInvalidMO, SegLenValid: true, Rest: []byte{0x01, 0x00}}},
		{
			"DDP error, tagged header",
			Terminate{Err: *ErrDDPBaseBounds, SegLenValid: true, HasDDPHeader: true,
				Rest: unhex(t, "0064 c140 12345600 0000000000001000")},
		},
		{
			"DDP error, untagged header",
			Terminate{Err: *ErrDDPInvalidMSN, SegLenValid: true, HasDDPHeader: true,
				Rest: unhex(t, "0010 4143 00000000 00000000 00000009 00000000")},
		},
		{
			"RDMAP protection error, Read Request",
			Terminate{Err: *ErrRDMAPBaseBounds, SegLenValid: true, HasDDPHeader: true, HasRDMAHeader: true,
				Rest: unhex(t, "0000 4141 00000000 00000001 00000003 00000000  8f85c300 0000561db92205b0 00000040 5c2eac00 0000562cae9f5440")},
		},
		{
			// siw sets R for protection errors on Sends too, with no RDMAP header.
			"siw's RDMAP protection error on a Send with Invalidate",
			Terminate{Err: *ErrRDMAPCannotInvalidate, SegLenValid: true, HasDDPHeader: true, HasRDMAHeader: true,
				Rest: unhex(t, "0010 4144 12345600 00000000 00000002 00000000")},
		},
		{
			// The codec keeps whatever follows; the engine judges.
			"trailing bytes",
			Terminate{Err: *ErrDDPInvalidQN, SegLenValid: true, HasDDPHeader: true,
				Rest: unhex(t, "0000 4143 00000000 00000007 00000001 00000000 deadbeef")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.t.Append([]byte{0x77})
			if b[0] != 0x77 {
				t.Fatal("Append overwrote the buffer's prefix")
			}
			enc := b[1:]
			if len(enc) != tt.t.Len() {
				t.Errorf("encoded %d bytes, Len() = %d", len(enc), tt.t.Len())
			}
			got, n, err := ParseTerminate(enc)
			if err != nil || n != len(enc) {
				t.Fatalf("ParseTerminate = %d, %v", n, err)
			}
			if !reflect.DeepEqual(got, tt.t) {
				t.Errorf("round trip:\n got %+v\nwant %+v", got, tt.t)
			}
		})
	}
}

// TestSiwTerminateLayout decodes Terminates the Linux kernel's siw sent
// (captured from a guest, docs/interop.md): siw lays the control word out
// as little-endian bitfields, Layer and EType swapped and M, D, R in the
// low bits of the third byte. They decode to the errors siw meant and
// re-encode byte for byte.
func TestSiwTerminateLayout(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		err        *TermError
		m, d, r    bool
		echoOp     Opcode
		readSource uint32
	}{
		{
			// An RDMA Write to an STag siw never issued: DDP, tagged, invalid
			// STag (layer and type are both 1, so the swap is invisible).
			"Write to a bad STag", "11000300 0010 c140 bad57a00 0000000000001000",
			ErrDDPInvalidSTag, true, true, false, OpWrite, 0,
		},
		{
			// An RDMA Read of an STag siw never issued: RDMAP, remote
			// protection, invalid STag, the Read Request echoed. Read the
			// RFC's way this is a DDP local catastrophic error.
			"Read of a bad STag", "10000700 0000 4141 00000000 00000001 00000001 00000000 4fa4df00 000019e60162b230 00000010 bad57a00 0000000000001000",
			ErrRDMAPInvalidSTag, true, true, true, OpReadRequest, 0xbad57a00,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := unhex(t, tt.body)
			term, n, err := ParseTerminate(b)
			if err != nil || n != len(b) {
				t.Fatalf("ParseTerminate = %d, %v", n, err)
			}
			if !term.SiwLayout || term.Err != *tt.err || term.SegLenValid != tt.m || term.HasDDPHeader != tt.d || term.HasRDMAHeader != tt.r {
				t.Errorf("decoded %+v, want %v with M %v D %v R %v in siw's layout", term, tt.err, tt.m, tt.d, tt.r)
			}
			if h, ok := term.DDPHeader(); !ok || h.Opcode != tt.echoOp {
				t.Errorf("echoed header %+v, %v; want a %v", h, ok, tt.echoOp)
			}
			if rr, ok := term.ReadRequest(); tt.r && (!ok || rr.SourceSTag != tt.readSource) {
				t.Errorf("echoed Read Request %+v, %v", rr, ok)
			}
			if enc := term.Append(nil); !bytes.Equal(enc, b) {
				t.Errorf("re-encoded as % x, want % x", enc, b)
			}
		})
	}
	// What gowarp sends stays in the RFC's layout.
	rfc := NewTerminate(ErrDDPNoBuffer, unhex(t, "4143 00000000 00000000 00000001 00000000"), 30, nil)
	if enc := rfc.Append(nil); !bytes.Equal(enc[:4], []byte{0x12, 0x02, 0xc0, 0x00}) {
		t.Errorf("gowarp's control word % x, want 12 02 c0 00", enc[:4])
	}
}

// NewTerminate for the cases RFC 5040 §7.1 and siw (siw_send_terminate)
// distinguish; whole Terminate FPDUs written out by hand.
func TestNewTerminate(t *testing.T) {
	termHdr := Header{Opcode: OpTerminate, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: QNTerminate, MSN: 1}
	writeHdr := Header{Opcode: OpWrite, Tagged: true, Last: true, DDPVersion: 1, RDMAPVersion: 1, STag: 0x12345600, TO: 0x1000}
	write := append(writeHdr.Append(nil), pattern(100)...)
	rreqHdr := Header{Opcode: OpReadRequest, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: QNRead, MSN: 3}
	rr := ReadRequest{SinkSTag: 0x8f85c300, SinkTO: 0x0000561db92205b0, Size: 64, SourceSTag: 0x5c2eac00, SourceTO: 0x0000562cae9f5440}
	rreq := rr.Append(rreqHdr.Append(nil))
	sendHdr := Header{Opcode: OpSend, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: QNSend, MSN: 9}
	send := append(sendHdr.Append(nil), pattern(16)...)
	sendInvHdr := Header{Opcode: OpSendInv, Last: true, DDPVersion: 1, RDMAPVersion: 1, RsvdULP: 0xabcdef00, QN: QNSend, MSN: 2}
	sendInv := append(sendInvHdr.Append(nil), pattern(5)...)

	tests := []struct {
		name  string
		err   *TermError
		ulpdu []byte // the head of the ULPDU given to NewTerminate
		// ulpduLen is the length of the whole ULPDU; 0 means len(ulpdu).
		ulpduLen int
		// want is the whole Terminate FPDU, CRC off.
		want      string
		segLen    int // -1: no M
		echoed    *Header
		readReq   *ReadRequest
		wantFlags string
	}{
		{
			"DDP error on a tagged Write",
			ErrDDPInvalidSTag, write, 0,
			"0026 4147 00000000 00000002 00000001 00000000  1100c000  0064 c140 12345600 0000000000001000  00000000",
			100, &writeHdr, nil, "MD",
		},
		{
			// The receive path hands over only the header of a long segment.
			"DDP error on a tagged Write, head only",
			ErrDDPBaseBounds, write[:TaggedHeaderLen], 5000,
			"0026 4147 00000000 00000002 00000001 00000000  1101c000  137a c140 12345600 0000000000001000  00000000",
			5000 - TaggedHeaderLen, &writeHdr, nil, "MD",
		},
		{
			"RDMAP protection error on a Read Request, head is header and body",
			ErrRDMAPAccessRights, rreq, 4096,
			"0046 4147 00000000 00000002 00000001 00000000  0102e000  0fd2 4141 00000000 00000001 00000003 00000000" +
				"  8f85c300 0000561db92205b0 00000040 5c2eac00 0000562cae9f5440  00000000",
			4096 - 46, &rreqHdr, &rr, "MDR",
		},
		{
			"RDMAP protection error on a Read Request",
			ErrRDMAPInvalidSTag, rreq, 0,
			"0046 4147 00000000 00000002 00000001 00000000  0100e000  0000 4141 00000000 00000001 00000003 00000000" +
				"  8f85c300 0000561db92205b0 00000040 5c2eac00 0000562cae9f5440  00000000",
			0, &rreqHdr, &rr, "MDR",
		},
		{
			"MPA CRC error: nothing echoed",
			ErrMPACRC, write, 0,
			"0016 4147 00000000 00000002 00000001 00000000  20020000  00000000",
			-1, nil, nil, "",
		},
		{
			"DDP untagged error on a Send",
			ErrDDPNoBuffer, send, 0,
			"002a 4147 00000000 00000002 00000001 00000000  1202c000  0010 4143 00000000 00000000 00000009 00000000  00000000",
			16, &sendHdr, nil, "MD",
		},
		{
			"RDMAP remote operation error on a Read Request: header only",
			ErrRDMAPStream, rreq, 0,
			"002a 4147 00000000 00000002 00000001 00000000  0207c000  0000 4141 00000000 00000001 00000003 00000000  00000000",
			0, &rreqHdr, nil, "MD",
		},
		{
			"RDMAP protection error on a Send with Invalidate",
			ErrRDMAPCannotInvalidate, sendInv, 0,
			"002a 4147 00000000 00000002 00000001 00000000  0109c000  0005 4144 abcdef00 00000000 00000002 00000000  00000000",
			5, &sendInvHdr, nil, "MD",
		},
		{
			"RDMAP catastrophic: nothing echoed",
			ErrRDMAPCatastrophic, send, 0,
			"0016 4147 00000000 00000002 00000001 00000000  00000000  00000000",
			-1, nil, nil, "",
		},
		{
			"bad opcode: header layout unknown, nothing echoed",
			ErrRDMAPOpcode, send, 0,
			"0016 4147 00000000 00000002 00000001 00000000  02060000  00000000",
			-1, nil, nil, "",
		},
		{
			"bad RDMAP version: nothing echoed",
			ErrRDMAPVersion, send, 0,
			"0016 4147 00000000 00000002 00000001 00000000  02050000  00000000",
			-1, nil, nil, "",
		},
		{
			"bad DDP version, tagged: nothing echoed",
			ErrDDPTaggedVersion, write, 0,
			"0016 4147 00000000 00000002 00000001 00000000  11040000  00000000",
			-1, nil, nil, "",
		},
		{
			"bad DDP version, untagged: nothing echoed",
			ErrDDPUntaggedVersion, send, 0,
			"0016 4147 00000000 00000002 00000001 00000000  12060000  00000000",
			-1, nil, nil, "",
		},
		{
			"no segment to echo",
			ErrDDPInvalidMSN, nil, 0,
			"0016 4147 00000000 00000002 00000001 00000000  12030000  00000000",
			-1, nil, nil, "",
		},
		{
			"segment shorter than its header: nothing echoed",
			ErrDDPInvalidQN, send[:10], 0,
			"0016 4147 00000000 00000002 00000001 00000000  12010000  00000000",
			-1, nil, nil, "",
		},
		{
			"Read Request cut short: header only, no R",
			ErrRDMAPBaseBounds, rreq[:UntaggedHeaderLen+10], 0,
			"002a 4147 00000000 00000002 00000001 00000000  0101c000  0000 4141 00000000 00000001 00000003 00000000  00000000",
			0, &rreqHdr, nil, "MD",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var head []byte
			if tt.ulpdu != nil {
				head = append([]byte(nil), tt.ulpdu...)
			}
			ulpduLen := len(head)
			if tt.ulpduLen != 0 {
				ulpduLen = tt.ulpduLen
			}
			scratch := make([]byte, 0, 64)
			term := NewTerminate(tt.err, head, ulpduLen, scratch)
			flags := ""
			for _, f := range []struct {
				on bool
				s  string
			}{{term.SegLenValid, "M"}, {term.HasDDPHeader, "D"}, {term.HasRDMAHeader, "R"}} {
				if f.on {
					flags += f.s
				}
			}
			if flags != tt.wantFlags {
				t.Errorf("flags %q, want %q", flags, tt.wantFlags)
			}
			if len(term.Rest) > 0 && &term.Rest[0] != &scratch[:1][0] {
				t.Errorf("Rest does not use the scratch buffer")
			}
			// The echo is a copy: the receive buffer may be reused.
			for i := range head {
				head[i] ^= 0xff
			}
			fpdu, err := AppendFPDU(nil, term.Append(termHdr.Append(nil)), false)
			if err != nil {
				t.Fatal(err)
			}
			if want := unhex(t, tt.want); !bytes.Equal(fpdu, want) {
				t.Errorf("Terminate FPDU:\n got % x\nwant % x", fpdu, want)
			}

			// What the peer decodes.
			p, _, err := ParseFPDU(fpdu, false)
			if err != nil {
				t.Fatal(err)
			}
			h, hn, err := ParseHeader(p.ULPDU)
			if err != nil || h != termHdr {
				t.Fatalf("ParseHeader = %+v, %v", h, err)
			}
			got, _, err := ParseTerminate(p.ULPDU[hn:])
			if err != nil {
				t.Fatalf("ParseTerminate: %v", err)
			}
			if !errors.Is(&got.Err, tt.err) {
				t.Errorf("received error %v, want %v", &got.Err, tt.err)
			}
			seg, ok := got.SegmentLength()
			if ok != (tt.segLen >= 0) || (ok && int(seg) != tt.segLen) {
				t.Errorf("SegmentLength() = %d, %v; want %d", seg, ok, tt.segLen)
			}
			eh, ok := got.DDPHeader()
			if ok != (tt.echoed != nil) || (ok && eh != *tt.echoed) {
				t.Errorf("DDPHeader() = %+v, %v; want %+v", eh, ok, tt.echoed)
			}
			r, ok := got.ReadRequest()
			if ok != (tt.readReq != nil) || (ok && r != *tt.readReq) {
				t.Errorf("ReadRequest() = %+v, %v; want %+v", r, ok, tt.readReq)
			}
		})
	}
}

func TestParseTerminateTruncated(t *testing.T) {
	bodies := []struct {
		name string
		body string
	}{
		{"no flags", "20020000"},
		{"M", "1204 8000 0100"},
		{"M D, tagged header", "1100c000 0064 c140 12345600 0000000000001000"},
		{"M D, untagged header", "1203c000 0010 4143 00000000 00000000 00000009 00000000"},
		{"D alone, untagged header", "12034000 0010 4143 00000000 00000000 00000009 00000000"},
		{"R alone", "01002000 0000"},
		{"M D R, Read Request", "0100e000 0000 4141 00000000 00000001 00000003 00000000" +
			" 8f85c300 0000561db92205b0 00000040 5c2eac00 0000562cae9f5440"},
		{"M D R, Send (siw)", "0109e000 0010 4144 12345600 00000000 00000002 00000000"},
	}
	for _, tt := range bodies {
		t.Run(tt.name, func(t *testing.T) {
			b := unhex(t, tt.body)
			if _, n, err := ParseTerminate(b); err != nil || n != len(b) {
				t.Fatalf("whole body: %d, %v", n, err)
			}
			for cut := range len(b) {
				if got, n, err := ParseTerminate(b[:cut]); err != ErrTerminateFormat || n != 0 || got.Rest != nil {
					t.Errorf("cut to %d bytes: %d, %v; want ErrTerminateFormat", cut, n, err)
				}
			}
		})
	}
}
