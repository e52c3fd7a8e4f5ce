package wire

import (
	"bytes"
	"fmt"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	var tests []Header
	for op := Opcode(0); op < 16; op++ {
		for _, last := range []bool{true, false} {
			// Each opcode in its own buffer model, and in the other one:
			// the codec does not judge, the receiver does.
			for _, tagged := range []bool{op.Info().Tagged, !op.Info().Tagged} {
				h := Header{Opcode: op, Tagged: tagged, Last: last, DDPVersion: DDPVersion, RDMAPVersion: RDMAPVersion}
				if tagged {
					h.STag, h.TO = 0x8f85c300+uint32(op), 0x0000561db92205b0+uint64(op)<<32
				} else {
					h.QN, h.MSN, h.MO = op.Info().QN, 1+uint32(op), 1424*uint32(op)
					if op.Invalidates() {
						h.RsvdULP = 0xd3a9d300
					}
				}
				tests = append(tests, h)
			}
		}
	}
	tests = append(tests,
		Header{Opcode: OpSend, Last: true, DDPReserved: 0xf, RDMAPReserved: 3, DDPVersion: 3, RDMAPVersion: 3,
			RsvdULP: 0xffffffff, QN: 0xffffffff, MSN: 0xffffffff, MO: 0xffffffff},
		Header{Opcode: OpWrite, Tagged: true, DDPReserved: 0x5, RDMAPReserved: 2, STag: 0xffffffff, TO: 0xffffffffffffffff},
		Header{Opcode: OpReadResponse, Tagged: true, Last: true, DDPReserved: 0xa, RDMAPReserved: 1},
		Header{}, // all zero: untagged, version 0
	)
	for _, h := range tests {
		name := fmt.Sprintf("%v T=%v L=%v rsvd=%x/%x", h.Opcode, h.Tagged, h.Last, h.DDPReserved, h.RDMAPReserved)
		t.Run(name, func(t *testing.T) {
			b := h.Append([]byte{0xaa})
			if b[0] != 0xaa {
				t.Fatal("Append overwrote the buffer's prefix")
			}
			enc := b[1:]
			if len(enc) != h.Len() {
				t.Fatalf("Append wrote %d bytes, Len() = %d", len(enc), h.Len())
			}
			put := bytes.Repeat([]byte{0x55}, h.Len()+3)
			if n := h.Put(put); n != h.Len() || !bytes.Equal(put[:n], enc) || !bytes.Equal(put[n:], []byte{0x55, 0x55, 0x55}) {
				t.Errorf("Put = %d, % x; Append % x", n, put, enc)
			}
			got, n, err := ParseHeader(append(enc, "payload"...))
			if err != nil || n != h.Len() {
				t.Fatalf("ParseHeader = %d, %v", n, err)
			}
			if got != h {
				t.Errorf("round trip:\n got %+v\nwant %+v", got, h)
			}
			// Decoded in place over a header with every field set, as a
			// receiver reuses one: nothing of the old one may remain.
			dirty := Header{Opcode: 0xf, Tagged: !h.Tagged, Last: true, DDPVersion: 3, RDMAPVersion: 3, DDPReserved: 0xf, RDMAPReserved: 3,
				STag: ^uint32(0), TO: ^uint64(0), RsvdULP: ^uint32(0), QN: ^uint32(0), MSN: ^uint32(0), MO: ^uint32(0)}
			if n, err := dirty.Decode(enc); err != nil || n != h.Len() || dirty != h {
				t.Errorf("Decode over a used header = %d, %v:\n got %+v\nwant %+v", n, err, dirty, h)
			}
		})
	}
}

// Headers written out by hand from RFC 5040 §4, RFC 5041 §4 and wire.md §1.4.
func TestHeaderBytes(t *testing.T) {
	tests := []struct {
		name string
		h    Header
		want string
	}{
		{
			"first Send of rping",
			Header{Opcode: OpSend, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: 0, MSN: 1},
			"4143 00000000 00000000 00000001 00000000",
		},
		{
			"middle segment of a Send",
			Header{Opcode: OpSend, DDPVersion: 1, RDMAPVersion: 1, QN: 0, MSN: 7, MO: 1424},
			"0143 00000000 00000000 00000007 00000590",
		},
		{
			"Send with Invalidate",
			Header{Opcode: OpSendInv, Last: true, DDPVersion: 1, RDMAPVersion: 1, RsvdULP: 0x12345600, MSN: 2},
			"4144 12345600 00000000 00000002 00000000",
		},
		{
			"Send with SE and Invalidate",
			Header{Opcode: OpSendSEInv, Last: true, DDPVersion: 1, RDMAPVersion: 1, RsvdULP: 0xabcdef00, MSN: 3},
			"4146 abcdef00 00000000 00000003 00000000",
		},
		{
			"Read Request",
			Header{Opcode: OpReadRequest, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: QNRead, MSN: 1},
			"4141 00000000 00000001 00000001 00000000",
		},
		{
			"Terminate",
			Header{Opcode: OpTerminate, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: QNTerminate, MSN: 1},
			"4147 00000000 00000002 00000001 00000000",
		},
		{
			"Write, last segment",
			Header{Opcode: OpWrite, Tagged: true, Last: true, DDPVersion: 1, RDMAPVersion: 1, STag: 0xae4a9600, TO: 0x0000562cae9f05b0},
			"c140 ae4a9600 0000562cae9f05b0",
		},
		{
			"Write, not last",
			Header{Opcode: OpWrite, Tagged: true, DDPVersion: 1, RDMAPVersion: 1, STag: 1, TO: 0x1000},
			"8140 00000001 0000000000001000",
		},
		{
			"Read Response",
			Header{Opcode: OpReadResponse, Tagged: true, Last: true, DDPVersion: 1, RDMAPVersion: 1, STag: 0x8f85c300, TO: 0x0000561db92205b0},
			"c142 8f85c300 0000561db92205b0",
		},
		{
			"reserved bits and versions in place",
			Header{Opcode: OpWrite, Tagged: true, DDPReserved: 0xf, RDMAPReserved: 3, DDPVersion: 2, RDMAPVersion: 2},
			"be b0 00000000 0000000000000000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := unhex(t, tt.want)
			if got := tt.h.Append(nil); !bytes.Equal(got, want) {
				t.Errorf("Append:\n got % x\nwant % x", got, want)
			}
			h, n, err := ParseHeader(want)
			if err != nil || n != len(want) || h != tt.h {
				t.Errorf("ParseHeader = %+v, %d, %v", h, n, err)
			}
		})
	}
}

func TestParseHeaderTruncated(t *testing.T) {
	for _, h := range []Header{
		{Opcode: OpWrite, Tagged: true, Last: true, DDPVersion: 1, RDMAPVersion: 1, STag: 1},
		{Opcode: OpSend, Last: true, DDPVersion: 1, RDMAPVersion: 1, MSN: 1},
	} {
		b := h.Append(nil)
		for n := range len(b) {
			if got, m, err := ParseHeader(b[:n]); err != ErrULPDUTooShort || m != 0 || got != (Header{}) {
				t.Errorf("%v cut to %d bytes: ParseHeader = %+v, %d, %v; want ErrULPDUTooShort", h.Opcode, n, got, m, err)
			}
		}
	}
}

func TestReadRequestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		r    ReadRequest
		want string
	}{
		{
			// The first Read Request of rping-64x3.pcap.
			"rping",
			ReadRequest{SinkSTag: 0x8f85c300, SinkTO: 0x0000561db92205b0, Size: 64, SourceSTag: 0x5c2eac00, SourceTO: 0x0000562cae9f5440},
			"8f85c300 0000561db92205b0 00000040 5c2eac00 0000562cae9f5440",
		},
		{
			// siw's Read RTR: zero size, sink STag 0, source STag 1.
			"zero-length RTR",
			ReadRequest{SourceSTag: 1},
			"00000000 0000000000000000 00000000 00000001 0000000000000000",
		},
		{
			"all ones",
			ReadRequest{SinkSTag: ^uint32(0), SinkTO: ^uint64(0), Size: ^uint32(0), SourceSTag: ^uint32(0), SourceTO: ^uint64(0)},
			"ffffffff ffffffffffffffff ffffffff ffffffff ffffffffffffffff",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := unhex(t, tt.want)
			got := tt.r.Append([]byte{1, 2})
			if !bytes.Equal(got[2:], want) || got[0] != 1 || got[1] != 2 {
				t.Errorf("Append:\n got % x\nwant 01 02 % x", got, want)
			}
			r, n, err := ParseReadRequest(append(want, 0xee))
			if err != nil || n != ReadRequestLen || r != tt.r {
				t.Errorf("ParseReadRequest = %+v, %d, %v", r, n, err)
			}
			for n := range ReadRequestLen {
				if _, m, err := ParseReadRequest(want[:n]); err != ErrULPDUTooShort || m != 0 {
					t.Errorf("cut to %d bytes: %d, %v; want ErrULPDUTooShort", n, m, err)
				}
			}
		})
	}
}
