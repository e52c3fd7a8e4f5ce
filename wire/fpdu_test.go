package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
)

func TestPadLen(t *testing.T) {
	// 2 + n + pad must be a multiple of 4.
	want := []int{2, 1, 0, 3, 2, 1, 0, 3, 2}
	for n, w := range want {
		if got := PadLen(n); got != w {
			t.Errorf("PadLen(%d) = %d, want %d", n, got, w)
		}
		if got := FPDULen(n); got != 2+n+w+4 || got%4 != 0 {
			t.Errorf("FPDULen(%d) = %d, want %d", n, got, 2+n+w+4)
		}
	}
	for _, n := range []int{1428, 4096, 4110, 65534, 65535} {
		if p := PadLen(n); p < 0 || p > 3 || (2+n+p)%4 != 0 {
			t.Errorf("PadLen(%d) = %d", n, p)
		}
	}
}

// fpduByHand builds an FPDU field by field from RFC 5044 §4.1 and §6:
// length, ULPDU, zero pad, then the CRC32c of all that (computed by the
// bitwise reference) least-significant byte first, or four zero bytes.
func fpduByHand(ulpdu []byte, withCRC bool) []byte {
	b := []byte{byte(len(ulpdu) >> 8), byte(len(ulpdu))}
	b = append(b, ulpdu...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	var crc uint32
	if withCRC {
		crc = crc32cRef(b)
	}
	return append(b, byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24))
}

func TestFPDURoundTrip(t *testing.T) {
	lens := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 14, 18, 46, 1428, 4096, 65532, 65533, 65534, 65535}
	for _, n := range lens {
		for _, withCRC := range []bool{false, true} {
			t.Run(fmt.Sprintf("len %d crc %v", n, withCRC), func(t *testing.T) {
				ulpdu := pattern(n)
				want := fpduByHand(ulpdu, withCRC)
				b, err := AppendFPDU([]byte{0xaa, 0xbb}, ulpdu, withCRC)
				if err != nil {
					t.Fatalf("AppendFPDU: %v", err)
				}
				if b[0] != 0xaa || b[1] != 0xbb {
					t.Fatal("AppendFPDU overwrote the buffer's prefix")
				}
				enc := b[2:]
				if !bytes.Equal(enc, want) {
					t.Fatalf("AppendFPDU differs from the hand-built FPDU (len %d vs %d)", len(enc), len(want))
				}
				if len(enc) != FPDULen(n) {
					t.Errorf("encoded %d bytes, FPDULen = %d", len(enc), FPDULen(n))
				}
				// A following FPDU is not consumed.
				stream := append(append([]byte(nil), enc...), fpduByHand([]byte("next"), withCRC)...)
				for _, check := range []bool{false, withCRC} {
					p, m, err := ParseFPDU(stream, check)
					if err != nil || m != len(enc) {
						t.Fatalf("ParseFPDU(check %v) = %d, %v; want %d", check, m, err, len(enc))
					}
					if !bytes.Equal(p.ULPDU, ulpdu) {
						t.Errorf("ULPDU differs")
					}
					if len(p.ULPDU) > 0 && &p.ULPDU[0] != &stream[2] {
						t.Errorf("ULPDU is a copy, not a sub-slice of the input")
					}
					if cap(p.ULPDU) != len(p.ULPDU) {
						t.Errorf("ULPDU has room to grow into the pad: cap %d", cap(p.ULPDU))
					}
					if want := binary.LittleEndian.Uint32(enc[len(enc)-4:]); p.CRC != want {
						t.Errorf("CRC field = %#08x, want %#08x", p.CRC, want)
					}
				}
				if !withCRC && n > 0 {
					// A zero CRC field is wrong when CRC is on.
					if _, _, err := ParseFPDU(enc, true); err != ErrCRC {
						t.Errorf("zero CRC field with checking on: %v, want ErrCRC", err)
					}
				}
			})
		}
	}
}

// FPDUs written out by hand from RFC 5044, wire.md and captures.
func TestFPDUBytes(t *testing.T) {
	// rping's first Send (siwvm README "rping on the wire").
	rpingInfo := unhex(t, "000055a6b5854b80 d3a9d300 00000040")
	send := Header{Opcode: OpSend, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: QNSend, MSN: 1}
	write := Header{Opcode: OpWrite, Tagged: true, Last: true, DDPVersion: 1, RDMAPVersion: 1, STag: 1}
	rreq := Header{Opcode: OpReadRequest, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: QNRead, MSN: 1}
	rtr := ReadRequest{SourceSTag: 1}
	tests := []struct {
		name    string
		ulpdu   []byte
		withCRC bool
		want    string
	}{
		{
			"rping Send",
			append(send.Append(nil), rpingInfo...),
			false,
			"0022 4143 00000000 00000000 00000001 00000000 000055a6b5854b80 d3a9d300 00000040 00000000",
		},
		{
			// 20 bytes: the smallest FPDU, and siw's Write RTR (STag 1, TO 0).
			"zero-length Write",
			write.Append(nil),
			false,
			"000e c140 00000001 0000000000000000 00000000",
		},
		{
			// 52 bytes: siw's Read RTR (sink STag 0, source STag 1, size 0).
			"zero-size Read Request",
			rtr.Append(rreq.Append(nil)),
			false,
			"002e 4141 00000000 00000001 00000001 00000000 00000000 0000000000000000 00000000 00000001 0000000000000000 00000000",
		},
		{
			"one-byte Send, 3 pad bytes",
			append(send.Append(nil), 'x'),
			false,
			"0013 4143 00000000 00000000 00000001 00000000 78 000000 00000000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := unhex(t, tt.want)
			got, err := AppendFPDU(nil, tt.ulpdu, tt.withCRC)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("AppendFPDU:\n got % x\nwant % x", got, want)
			}
		})
	}
	if n := FPDULen(TaggedHeaderLen); n != 20 {
		t.Errorf("zero-length Write FPDU is %d bytes, want 20", n)
	}
	if n := FPDULen(UntaggedHeaderLen + ReadRequestLen); n != 52 {
		t.Errorf("Read Request FPDU is %d bytes, want 52", n)
	}
}

// The CRC covers length, ULPDU and pad, and goes on the wire least
// significant byte first (siw, RFC 5044 §6 via the iSCSI CRC).
func TestFPDUCRCBytes(t *testing.T) {
	for _, tt := range []struct {
		name  string
		ulpdu []byte
	}{
		{"rping Send, no pad", append((&Header{Opcode: OpSend, Last: true, DDPVersion: 1, RDMAPVersion: 1, MSN: 1}).Append(nil), unhex(t, "000055a6b5854b80 d3a9d300 00000040")...)},
		{"one-byte Send, 3 pad bytes", append((&Header{Opcode: OpSend, Last: true, DDPVersion: 1, RDMAPVersion: 1, MSN: 1}).Append(nil), 'x')},
		{"empty ULPDU", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			covered := fpduByHand(tt.ulpdu, false)
			covered = covered[:len(covered)-4]
			crc := crc32cRef(covered)
			want := append(append([]byte(nil), covered...), byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24))
			got, err := AppendFPDU(nil, tt.ulpdu, true)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("AppendFPDU with CRC:\n got % x\nwant % x (CRC %#08x, LSB first)", got, want, crc)
			}
			if _, _, err := ParseFPDU(want, true); err != nil {
				t.Errorf("ParseFPDU of the hand-built FPDU: %v", err)
			}
			// The same CRC stored big-endian is wrong.
			swapped := append([]byte(nil), want...)
			binary.BigEndian.PutUint32(swapped[len(swapped)-4:], crc)
			if _, _, err := ParseFPDU(swapped, true); err != ErrCRC {
				t.Errorf("CRC stored MSB first: %v, want ErrCRC", err)
			}
		})
	}
}

func TestParseFPDUTruncated(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 5, 14, 46, 1428} {
		for _, withCRC := range []bool{false, true} {
			b, err := AppendFPDU(nil, pattern(n), withCRC)
			if err != nil {
				t.Fatal(err)
			}
			for cut := range len(b) {
				if p, m, err := ParseFPDU(b[:cut], withCRC); err != ErrShort || m != 0 || p.ULPDU != nil {
					t.Errorf("ULPDU %d cut to %d bytes: %d, %v; want ErrShort", n, cut, m, err)
				}
			}
		}
	}
}

func TestParseFPDUBadCRC(t *testing.T) {
	ulpdu := append((&Header{Opcode: OpSend, Last: true, DDPVersion: 1, RDMAPVersion: 1, MSN: 1}).Append(nil), "hello"...)
	good, err := AppendFPDU(nil, ulpdu, true)
	if err != nil {
		t.Fatal(err)
	}
	// Any single bit flipped after the length field, pad and CRC included,
	// is caught; with checking off the FPDU is accepted as it is.
	for i := LengthFieldLen; i < len(good); i++ {
		for bit := range 8 {
			bad := append([]byte(nil), good...)
			bad[i] ^= 1 << bit
			if _, n, err := ParseFPDU(bad, true); err != ErrCRC || n != 0 {
				t.Fatalf("bit %d of byte %d flipped: %d, %v; want ErrCRC", bit, i, n, err)
			}
			if _, n, err := ParseFPDU(bad, false); err != nil || n != len(bad) {
				t.Fatalf("bit %d of byte %d flipped, CRC off: %d, %v", bit, i, n, err)
			}
		}
	}
}

func TestAppendFPDUTooLong(t *testing.T) {
	b, err := AppendFPDU([]byte("keep"), make([]byte, MaxULPDULen+1), false)
	if err != ErrULPDUTooLong {
		t.Errorf("65536-byte ULPDU: %v, want ErrULPDUTooLong", err)
	}
	if string(b) != "keep" {
		t.Errorf("buffer changed on error: %d bytes", len(b))
	}
	if _, err := AppendFPDU(nil, make([]byte, MaxULPDULen), true); err != nil {
		t.Errorf("65535-byte ULPDU: %v", err)
	}
}

// PutTrailer with a running CRC gives the same FPDU as AppendFPDU: the
// transmit path writes header, payload and trailer from separate buffers.
func TestPutTrailer(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1428, 65535} {
		for _, withCRC := range []bool{false, true} {
			ulpdu := pattern(n)
			want, err := AppendFPDU(nil, ulpdu, withCRC)
			if err != nil {
				t.Fatal(err)
			}
			var lenField [2]byte
			binary.BigEndian.PutUint16(lenField[:], uint16(n))
			crc := UpdateCRC32c(0, lenField[:])
			// The ULPDU in two pieces, as header and payload.
			crc = UpdateCRC32c(crc, ulpdu[:n/3])
			crc = UpdateCRC32c(crc, ulpdu[n/3:])
			var t7 [MaxTrailerLen]byte
			for i := range t7 {
				t7[i] = 0xee // stale bytes must not leak into the pad
			}
			tr := PutTrailer(t7[:], n, crc, withCRC)
			if len(tr) != PadLen(n)+CRCLen {
				t.Errorf("len %d: trailer is %d bytes, want %d", n, len(tr), PadLen(n)+CRCLen)
			}
			got := append(append(lenField[:], ulpdu...), tr...)
			if !bytes.Equal(got, want) {
				t.Errorf("len %d crc %v: trailer % x, want % x", n, withCRC, tr, want[2+n:])
			}
		}
	}
}

// RFC 5044 §4.1: the receiver ignores the pad, except that the CRC covers
// it. siw sends stale pad bytes in short FPDUs; this one is perftest's MTU
// Send ("3\0") from perftest-*.pcap.
func TestParseFPDUIgnoresPad(t *testing.T) {
	b := unhex(t, "0014 4143 00000000 00000000 00000004 00000000 3300 0040 00000000")
	p, n, err := ParseFPDU(b, false)
	if err != nil || n != len(b) || !bytes.Equal(p.ULPDU, b[2:22]) {
		t.Fatalf("ParseFPDU = %x, %d, %v", p.ULPDU, n, err)
	}
	// With CRC on, the CRC is computed over the pad as sent.
	binary.LittleEndian.PutUint32(b[24:], crc32cRef(b[:24]))
	if _, _, err := ParseFPDU(b, true); err != nil {
		t.Errorf("CRC over the non-zero pad: %v", err)
	}
	zeroPad := append([]byte(nil), b...)
	zeroPad[22], zeroPad[23] = 0, 0
	if _, _, err := ParseFPDU(zeroPad, true); err != ErrCRC {
		t.Errorf("CRC computed with the pad as sent, pad then zeroed: %v, want ErrCRC", err)
	}
}
