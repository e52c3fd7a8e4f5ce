package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/gowarp/gowarp/internal/pcapstream"
)

// Fuzz targets, one per decoder. Each is seeded with encoded valid frames
// and a few broken ones, and checks that the decoder never panics, never
// claims more bytes than it was given, fails only with its documented
// errors, and that what it accepts encodes back to the bytes it consumed.

func FuzzParseMPAFrame(f *testing.F) {
	for _, fr := range []MPAFrame{
		{Enhanced: true, Revision: 2, IRD: 1, ORD: 1},
		{Reply: true, Enhanced: true, Revision: 2, IRD: 128, ORD: 128},
		{Revision: 1, CRC: true, Markers: true},
		{Reply: true, Reject: true, Revision: 1, PrivateData: []byte("go away")},
		{Enhanced: true, Revision: 2, IRD: MaxIRDORD, ORD: 16, P2P: true, RTR: RTRSend | RTRWrite | RTRRead},
		{Reply: true, Enhanced: true, ReservedFlags: 0x08, Revision: 2, P2P: true, RTR: RTRRead, PrivateData: pattern(508)},
	} {
		b, err := fr.Append(nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
		f.Add(append(b, 0x00, 0x22, 0x41, 0x43))
	}
	f.Add([]byte("MPA ID Req Frame\x10\x02\x00\x02\x00\x01"))    // enhanced, 2-byte block
	f.Add([]byte("MPA ID Req Frame\x00\x01\x02\x01"))            // 513 bytes of private data
	f.Add([]byte("MPA ID Rep Fram\x00\x10\x02\x00\x04\x00\x01")) // bad key
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, b []byte) {
		fr, n, err := ParseMPAFrame(b)
		l, lerr := MPAFrameLen(b)
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with %d bytes consumed", err, n)
			}
			if err != ErrShort && err != ErrMPAKey && err != ErrMPAPrivateData && err != ErrMPAEnhanced {
				t.Fatalf("undocumented error %v", err)
			}
			if lerr == nil && l <= len(b) && err != ErrMPAEnhanced {
				t.Fatalf("MPAFrameLen = %d but ParseMPAFrame: %v", l, err)
			}
			return
		}
		if n < MPAHeaderLen || n > len(b) {
			t.Fatalf("consumed %d of %d bytes", n, len(b))
		}
		if lerr != nil || l != n {
			t.Fatalf("MPAFrameLen = %d, %v; ParseMPAFrame consumed %d", l, lerr, n)
		}
		if fr.Len() != n {
			t.Fatalf("Len() = %d, consumed %d", fr.Len(), n)
		}
		enc, err := fr.Append(nil)
		if err != nil || !bytes.Equal(enc, b[:n]) {
			t.Fatalf("re-encoded (%v):\n got % x\nwant % x", err, enc, b[:n])
		}
	})
}

func FuzzParseFPDU(f *testing.F) {
	send := append((&Header{Opcode: OpSend, Last: true, DDPVersion: 1, RDMAPVersion: 1, MSN: 1}).Append(nil), pattern(16)...)
	write := (&Header{Opcode: OpWrite, Tagged: true, Last: true, DDPVersion: 1, RDMAPVersion: 1, STag: 1}).Append(nil)
	for _, u := range [][]byte{nil, {1}, {1, 2}, {1, 2, 3}, send, write, pattern(1500)} {
		for _, withCRC := range []bool{false, true} {
			b, err := AppendFPDU(nil, u, withCRC)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b, withCRC)
			f.Add(b[:len(b)-1], withCRC)
			bad := append([]byte(nil), b...)
			bad[len(bad)-1] ^= 0x80
			f.Add(bad, true)
		}
	}
	// Real streams (after the MPA frames), several FPDUs back to back.
	if conns, err := pcapstream.ReadFile("testdata/siw/rping-64x3.pcap"); err == nil {
		for _, c := range conns {
			f.Add(c.Initiator[24:], false)
			f.Add(c.Responder[24:], false)
		}
	}
	f.Add([]byte{0xff, 0xff}, false)

	f.Fuzz(func(t *testing.T, b []byte, checkCRC bool) {
		p, n, err := ParseFPDU(b, checkCRC)
		if err != nil {
			if n != 0 || p.ULPDU != nil {
				t.Fatalf("error %v with %d bytes consumed", err, n)
			}
			if err != ErrShort && !(err == ErrCRC && checkCRC) {
				t.Fatalf("undocumented error %v (checkCRC %v)", err, checkCRC)
			}
			return
		}
		if n > len(b) || n != FPDULen(len(p.ULPDU)) || n%4 != 0 {
			t.Fatalf("consumed %d of %d bytes for a %d-byte ULPDU", n, len(b), len(p.ULPDU))
		}
		if p.CRC != binary.LittleEndian.Uint32(b[n-CRCLen:n]) {
			t.Fatalf("CRC %#08x, field holds % x", p.CRC, b[n-CRCLen:n])
		}
		enc, err := AppendFPDU(nil, p.ULPDU, false)
		if err != nil {
			t.Fatal(err)
		}
		binary.LittleEndian.PutUint32(enc[n-CRCLen:], p.CRC)
		// Everything but the pad, which the receiver ignores, is exact.
		padAt := LengthFieldLen + len(p.ULPDU)
		if !bytes.Equal(enc[:padAt], b[:padAt]) || !bytes.Equal(enc[n-CRCLen:], b[n-CRCLen:n]) {
			t.Fatalf("re-encoded:\n got % x\nwant % x", enc, b[:n])
		}
		zeroPad := bytes.Equal(b[padAt:n-CRCLen], make([]byte, n-CRCLen-padAt))
		if zeroPad && !bytes.Equal(enc, b[:n]) {
			t.Fatalf("zero pad, yet re-encoded:\n got % x\nwant % x", enc, b[:n])
		}
		if checkCRC && zeroPad {
			withCRC, err := AppendFPDU(nil, p.ULPDU, true)
			if err != nil || !bytes.Equal(withCRC, b[:n]) {
				t.Fatalf("CRC accepted, yet AppendFPDU with CRC gives % x", withCRC)
			}
		}
		again, m, err := ParseFPDU(enc, false)
		if err != nil || m != n || !bytes.Equal(again.ULPDU, p.ULPDU) || again.CRC != p.CRC {
			t.Fatalf("re-encoded FPDU parses as %+v, %d, %v", again, m, err)
		}
	})
}

func FuzzParseHeader(f *testing.F) {
	for op := Opcode(0); op < 16; op++ {
		h := Header{Opcode: op, Tagged: op.Info().Tagged, Last: op != OpWrite, DDPVersion: 1, RDMAPVersion: 1,
			STag: 0x8f85c300, TO: 0x561db92205b0, QN: op.Info().QN, MSN: 1}
		b := h.Append(nil)
		if op == OpReadRequest {
			b = (&ReadRequest{SinkSTag: 1, Size: 64, SourceSTag: 2}).Append(b)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x41})

	errs := []*TermError{ErrDDPInvalidSTag, ErrDDPInvalidMSN, ErrRDMAPInvalidSTag, ErrRDMAPStream, ErrRDMAPOpcode, ErrMPACRC}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := ParseHeader(b)
		if err != nil {
			if n != 0 || err != ErrULPDUTooShort {
				t.Fatalf("%d, %v", n, err)
			}
			return
		}
		if n > len(b) || n != h.Len() {
			t.Fatalf("consumed %d of %d bytes, Len() %d", n, len(b), h.Len())
		}
		if enc := h.Append(nil); !bytes.Equal(enc, b[:n]) {
			t.Fatalf("re-encoded:\n got % x\nwant % x", enc, b[:n])
		}
		put := make([]byte, n)
		if m := h.Put(put); m != n || !bytes.Equal(put, b[:n]) {
			t.Fatalf("Put = %d, % x", m, put)
		}
		// A Terminate about this segment is one its receiver can parse.
		for _, e := range errs {
			term := NewTerminate(e, b, len(b), nil)
			enc := term.Append(nil)
			got, m, err := ParseTerminate(enc)
			if err != nil || m != len(enc) || !reflect.DeepEqual(got, term) {
				t.Fatalf("%v: NewTerminate gives %+v, which parses as %+v, %d, %v", e, term, got, m, err)
			}
			if echoed, ok := got.DDPHeader(); term.HasDDPHeader && (!ok || echoed != h) {
				t.Fatalf("%v: echoed header %+v, %v; want %+v", e, echoed, ok, h)
			}
		}
	})
}

func FuzzParseReadRequest(f *testing.F) {
	f.Add((&ReadRequest{SinkSTag: 0x8f85c300, SinkTO: 0x561db92205b0, Size: 64, SourceSTag: 0x5c2eac00, SourceTO: 0x562cae9f5440}).Append(nil))
	f.Add((&ReadRequest{SourceSTag: 1}).Append(nil))
	f.Add(make([]byte, ReadRequestLen-1))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, n, err := ParseReadRequest(b)
		if err != nil {
			if n != 0 || err != ErrULPDUTooShort {
				t.Fatalf("%d, %v", n, err)
			}
			return
		}
		if n != ReadRequestLen || n > len(b) {
			t.Fatalf("consumed %d of %d bytes", n, len(b))
		}
		if enc := r.Append(nil); !bytes.Equal(enc, b[:n]) {
			t.Fatalf("re-encoded:\n got % x\nwant % x", enc, b[:n])
		}
	})
}

func FuzzParseTerminate(f *testing.F) {
	write := append((&Header{Opcode: OpWrite, Tagged: true, Last: true, DDPVersion: 1, RDMAPVersion: 1, STag: 0x12345600}).Append(nil), pattern(100)...)
	rreq := (&ReadRequest{SinkSTag: 1, Size: 64, SourceSTag: 2}).Append(
		(&Header{Opcode: OpReadRequest, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: QNRead, MSN: 1}).Append(nil))
	send := append((&Header{Opcode: OpSend, Last: true, DDPVersion: 1, RDMAPVersion: 1, MSN: 4}).Append(nil), "3\x00"...)
	for _, tc := range []struct {
		err   *TermError
		ulpdu []byte
	}{
		{ErrDDPInvalidSTag, write}, {ErrRDMAPBaseBounds, rreq}, {ErrDDPNoBuffer, send}, {ErrMPACRC, nil}, {ErrRDMAPCatastrophic, send},
	} {
		b := NewTerminate(tc.err, tc.ulpdu, len(tc.ulpdu), nil)
		enc := b.Append(nil)
		f.Add(enc)
		f.Add(enc[:len(enc)-1])
	}
	f.Add([]byte{0x01, 0x09, 0xe0, 0x00, 0x00, 0x10, 0x41, 0x44}) // siw: R on a Send, cut short
	f.Add([]byte{0x12, 0x03, 0x40, 0x00, 0x00, 0x10})             // D with no header

	f.Fuzz(func(t *testing.T, b []byte) {
		term, n, err := ParseTerminate(b)
		if err != nil {
			if n != 0 || err != ErrTerminateFormat {
				t.Fatalf("%d, %v", n, err)
			}
			return
		}
		if n != len(b) || term.Len() != n {
			t.Fatalf("consumed %d of %d bytes, Len() %d", n, len(b), term.Len())
		}
		if enc := term.Append(nil); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded:\n got % x\nwant % x", enc, b)
		}
		// What the flags announce is there.
		if _, ok := term.SegmentLength(); term.SegLenValid && !ok {
			t.Fatalf("M set, no segment length: % x", b)
		}
		h, ok := term.DDPHeader()
		if term.HasDDPHeader && !ok {
			t.Fatalf("D set, no DDP header: % x", b)
		}
		if _, ok := term.ReadRequest(); term.HasDDPHeader && term.HasRDMAHeader && !h.Tagged && h.Opcode == OpReadRequest && !ok {
			t.Fatalf("R set on a Read Request, no body: % x", b)
		}
		var e error = &term.Err
		if !errors.Is(e, &TermError{term.Err.Layer, term.Err.Type, term.Err.Code}) || e.Error() == "" {
			t.Fatalf("TermError %+v", term.Err)
		}
	})
}

// The receive and transmit paths run these per FPDU: none may allocate.
func TestCodecAllocs(t *testing.T) {
	send := Header{Opcode: OpSend, Last: true, DDPVersion: 1, RDMAPVersion: 1, MSN: 1}
	ulpdu := append(send.Append(nil), pattern(5)...)
	fpdu, err := AppendFPDU(nil, ulpdu, true)
	if err != nil {
		t.Fatal(err)
	}
	rreq := (&ReadRequest{SinkSTag: 1, Size: 64, SourceSTag: 2}).Append(nil)
	term := (&Terminate{Err: *ErrDDPInvalidSTag, SegLenValid: true, HasDDPHeader: true,
		Rest: unhex(t, "0064 c140 12345600 0000000000001000")}).Append(nil)
	mpa, err := (&MPAFrame{Enhanced: true, Revision: 2, IRD: 1, ORD: 1}).Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, UntaggedHeaderLen)
	out := make([]byte, 0, 64)
	var trailer [MaxTrailerLen]byte
	var (
		sinkN   int
		sinkErr error
		sinkB   []byte
	)
	tests := []struct {
		name string
		fn   func()
	}{
		{"ParseFPDU", func() { _, sinkN, sinkErr = ParseFPDU(fpdu, true) }},
		{"ParseHeader", func() { _, sinkN, sinkErr = ParseHeader(ulpdu) }},
		{"Header.Put", func() { sinkN = send.Put(hdr) }},
		{"PutTrailer", func() { sinkB = PutTrailer(trailer[:], len(ulpdu), 0x12345678, true) }},
		{"ParseReadRequest", func() { _, sinkN, sinkErr = ParseReadRequest(rreq) }},
		{"ParseTerminate", func() { _, sinkN, sinkErr = ParseTerminate(term) }},
		{"ParseMPAFrame", func() { _, sinkN, sinkErr = ParseMPAFrame(mpa) }},
		{"Header.Append", func() { sinkB = send.Append(out[:0]) }},
		{"AppendFPDU", func() { sinkB, sinkErr = AppendFPDU(out[:0], ulpdu[:5], true) }},
	}
	for _, tt := range tests {
		if a := testing.AllocsPerRun(100, tt.fn); a != 0 {
			t.Errorf("%s: %v allocations per run, want 0", tt.name, a)
		}
	}
	_, _, _ = sinkN, sinkErr, sinkB
}
