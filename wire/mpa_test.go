package wire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestMPAFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		f    MPAFrame
	}{
		{"v1 request", MPAFrame{Revision: 1}},
		{"v1 reply with CRC", MPAFrame{Reply: true, CRC: true, Revision: 1}},
		{"v1 request with markers and CRC", MPAFrame{Markers: true, CRC: true, Revision: 1}},
		{"v1 request with private data", MPAFrame{Revision: 1, PrivateData: []byte("hello")}},
		{"v1 reject with private data", MPAFrame{Reply: true, Reject: true, Revision: 1, PrivateData: []byte("go away")}},
		{"v1 request with 512 bytes of private data", MPAFrame{Revision: 1, PrivateData: pattern(512)}},
		{"siw v2 request", MPAFrame{Enhanced: true, Revision: 2, IRD: 1, ORD: 1}},
		{"siw v2 reply", MPAFrame{Reply: true, Enhanced: true, Revision: 2, IRD: 128, ORD: 128}},
		{"v2 request, zero IRD/ORD", MPAFrame{Enhanced: true, Revision: 2}},
		{"v2 request, max IRD/ORD", MPAFrame{Enhanced: true, Revision: 2, IRD: MaxIRDORD, ORD: MaxIRDORD}},
		{"v2 P2P, no RTR", MPAFrame{Enhanced: true, Revision: 2, IRD: 16, ORD: 16, P2P: true}},
		{"v2 P2P, Send RTR", MPAFrame{Enhanced: true, Revision: 2, IRD: 16, ORD: 16, P2P: true, RTR: RTRSend}},
		{"v2 P2P, Write RTR", MPAFrame{Reply: true, Enhanced: true, Revision: 2, IRD: 16, ORD: 16, P2P: true, RTR: RTRWrite}},
		{"v2 P2P, Read RTR", MPAFrame{Reply: true, Enhanced: true, Revision: 2, IRD: 16, ORD: 16, P2P: true, RTR: RTRRead}},
		{"v2 P2P, all RTRs, max IRD/ORD", MPAFrame{Enhanced: true, Revision: 2, IRD: MaxIRDORD, ORD: MaxIRDORD, P2P: true, RTR: RTRSend | RTRWrite | RTRRead}},
		{"v2 RTR bits without P2P", MPAFrame{Enhanced: true, Revision: 2, IRD: 3, ORD: 5, RTR: RTRWrite | RTRRead}},
		{"v2 request with private data", MPAFrame{Enhanced: true, Revision: 2, IRD: 4, ORD: 8, PrivateData: []byte("ulp data")}},
		{"v2 request with 508 bytes of private data", MPAFrame{Enhanced: true, Revision: 2, IRD: 4, ORD: 8, PrivateData: pattern(508)}},
		{"v2 reject with private data", MPAFrame{Reply: true, Reject: true, Enhanced: true, Revision: 2, IRD: 1, ORD: 2, PrivateData: []byte("no")}},
		{"reserved flag 0x08 (siw GSO)", MPAFrame{Enhanced: true, Revision: 2, ReservedFlags: 0x08, IRD: 1, ORD: 1}},
		{"all reserved flags", MPAFrame{Revision: 1, ReservedFlags: 0x0f}},
		{"all flags", MPAFrame{Reply: true, Markers: true, CRC: true, Reject: true, Enhanced: true, ReservedFlags: 0x0f, Revision: 0xff, IRD: 1, ORD: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("prefix")
			b, err := tt.f.Append(append([]byte(nil), prefix...))
			if err != nil {
				t.Fatalf("Append: %v", err)
			}
			if !bytes.HasPrefix(b, prefix) {
				t.Fatalf("Append overwrote the buffer's prefix")
			}
			enc := b[len(prefix):]
			if len(enc) != tt.f.Len() {
				t.Errorf("encoded %d bytes, Len() = %d", len(enc), tt.f.Len())
			}
			if n, err := MPAFrameLen(enc); err != nil || n != len(enc) {
				t.Errorf("MPAFrameLen = %d, %v; want %d", n, err, len(enc))
			}
			// Trailing bytes (the first FPDU) are not consumed.
			withMore := append(append([]byte(nil), enc...), 0x00, 0x22, 0x41, 0x43)
			got, n, err := ParseMPAFrame(withMore)
			if err != nil {
				t.Fatalf("ParseMPAFrame: %v", err)
			}
			if n != len(enc) {
				t.Errorf("consumed %d bytes, want %d", n, len(enc))
			}
			if !reflect.DeepEqual(got, tt.f) {
				t.Errorf("round trip:\n got %+v\nwant %+v", got, tt.f)
			}
		})
	}
}

// Frames written out by hand from RFC 5044 §7.1, RFC 6581 §5 and wire.md.
func TestMPAFrameBytes(t *testing.T) {
	tests := []struct {
		name string
		f    MPAFrame
		want string
	}{
		{
			// What siw sends as initiator (rping, IRD = ORD = 1).
			"siw v2 request",
			MPAFrame{Enhanced: true, Revision: 2, IRD: 1, ORD: 1},
			`"MPA ID Req Frame" 10 02 0004 0001 0001`,
		},
		{
			"siw v2 reply",
			MPAFrame{Reply: true, Enhanced: true, Revision: 2, IRD: 1, ORD: 1},
			`"MPA ID Rep Frame" 10 02 0004 0001 0001`,
		},
		{
			"v1 request with markers and CRC",
			MPAFrame{Markers: true, CRC: true, Revision: 1},
			`"MPA ID Req Frame" c0 01 0000`,
		},
		{
			"v1 reject with private data",
			MPAFrame{Reply: true, Reject: true, Revision: 1, PrivateData: []byte("no")},
			`"MPA ID Rep Frame" 20 01 0002 "no"`,
		},
		{
			"P2P request offering every RTR",
			MPAFrame{Enhanced: true, Revision: 2, IRD: 16, ORD: 32, P2P: true, RTR: RTRSend | RTRWrite | RTRRead},
			`"MPA ID Req Frame" 10 02 0004 c010 c020`,
		},
		{
			"P2P reply choosing Send",
			MPAFrame{Reply: true, Enhanced: true, Revision: 2, IRD: 16, ORD: 16, P2P: true, RTR: RTRSend},
			`"MPA ID Rep Frame" 10 02 0004 c010 0010`,
		},
		{
			"P2P reply choosing Write",
			MPAFrame{Reply: true, Enhanced: true, Revision: 2, IRD: 16, ORD: 16, P2P: true, RTR: RTRWrite},
			`"MPA ID Rep Frame" 10 02 0004 8010 8010`,
		},
		{
			"P2P reply choosing Read",
			MPAFrame{Reply: true, Enhanced: true, Revision: 2, IRD: 16, ORD: 16, P2P: true, RTR: RTRRead},
			`"MPA ID Rep Frame" 10 02 0004 8010 4010`,
		},
		{
			"max IRD/ORD",
			MPAFrame{Enhanced: true, Revision: 2, IRD: 0x3fff, ORD: 0x3fff},
			`"MPA ID Req Frame" 10 02 0004 3fff 3fff`,
		},
		{
			"enhanced reject with private data, CRC, GSO bit",
			MPAFrame{Reply: true, Reject: true, CRC: true, Enhanced: true, ReservedFlags: 0x08, Revision: 2, IRD: 1, ORD: 0, PrivateData: []byte{0xde, 0xad}},
			`"MPA ID Rep Frame" 78 02 0006 0001 0000 dead`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := unhex(t, tt.want)
			got, err := tt.f.Append(nil)
			if err != nil {
				t.Fatalf("Append: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("Append:\n got % x\nwant % x", got, want)
			}
			f, n, err := ParseMPAFrame(want)
			if err != nil || n != len(want) {
				t.Fatalf("ParseMPAFrame = %d, %v", n, err)
			}
			if !reflect.DeepEqual(f, tt.f) {
				t.Errorf("ParseMPAFrame:\n got %+v\nwant %+v", f, tt.f)
			}
		})
	}
}

func TestParseMPAFrameTruncated(t *testing.T) {
	for _, f := range []MPAFrame{
		{Revision: 1},
		{Enhanced: true, Revision: 2, IRD: 1, ORD: 1},
		{Reply: true, Reject: true, Enhanced: true, Revision: 2, PrivateData: []byte("private")},
	} {
		b, err := f.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		for n := range len(b) {
			if _, _, err := ParseMPAFrame(b[:n]); err != ErrShort {
				t.Errorf("%+v cut to %d bytes: ParseMPAFrame error %v, want ErrShort", f, n, err)
			}
			if n < MPAHeaderLen {
				if _, err := MPAFrameLen(b[:n]); err != ErrShort {
					t.Errorf("%+v cut to %d bytes: MPAFrameLen error %v, want ErrShort", f, n, err)
				}
			} else if l, err := MPAFrameLen(b[:n]); err != nil || l != len(b) {
				t.Errorf("%+v cut to %d bytes: MPAFrameLen = %d, %v; want %d", f, n, l, err, len(b))
			}
		}
	}
}

func TestParseMPAFrameMalformed(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"lower-case key", `"mpa id req frame" 10 02 0004 0001 0001`, ErrMPAKey},
		{"key one byte off", `"MPA ID Req Fram3" 10 02 0004 0001 0001`, ErrMPAKey},
		{"key with NUL", `"MPA ID Req Fram" 00 10 02 0004 0001 0001`, ErrMPAKey},
		{"an FPDU instead", `0022 4143 00000000 00000000 00000001 00000000 0000000000000000 0000000000000000`, ErrMPAKey},
		{"private data length 513", `"MPA ID Req Frame" 00 01 0201`, ErrMPAPrivateData},
		{"private data length 0xffff", `"MPA ID Rep Frame" 10 02 ffff 0001 0001`, ErrMPAPrivateData},
		{"enhanced, no private data", `"MPA ID Req Frame" 10 02 0000`, ErrMPAEnhanced},
		{"enhanced, 1 byte", `"MPA ID Req Frame" 10 02 0001 00`, ErrMPAEnhanced},
		{"enhanced, 3 bytes", `"MPA ID Rep Frame" 10 02 0003 000100`, ErrMPAEnhanced},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, n, err := ParseMPAFrame(unhex(t, tt.in))
			if err != tt.want || n != 0 {
				t.Errorf("ParseMPAFrame = %d, %v; want 0, %v", n, err, tt.want)
			}
		})
	}
	// 512 bytes is the limit, and allowed.
	b := append(unhex(t, `"MPA ID Req Frame" 00 01 0200`), make([]byte, 512)...)
	if _, n, err := ParseMPAFrame(b); err != nil || n != len(b) {
		t.Errorf("512 bytes of private data: ParseMPAFrame = %d, %v", n, err)
	}
}

func TestMPAFrameAppendRejects(t *testing.T) {
	tests := []struct {
		name string
		f    MPAFrame
		want error
	}{
		{"513 bytes of private data", MPAFrame{Revision: 1, PrivateData: make([]byte, 513)}, ErrMPAPrivateData},
		{"509 bytes after the IRD/ORD block", MPAFrame{Enhanced: true, Revision: 2, PrivateData: make([]byte, 509)}, ErrMPAPrivateData},
		{"IRD over 14 bits", MPAFrame{Enhanced: true, Revision: 2, IRD: 0x4000}, nil},
		{"ORD over 14 bits", MPAFrame{Enhanced: true, Revision: 2, ORD: 0x8000}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte("keep")
			b, err := tt.f.Append(in)
			if err == nil {
				t.Fatalf("Append succeeded: % x", b)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("Append error %v, want %v", err, tt.want)
			}
			if string(b) != "keep" {
				t.Errorf("Append changed the buffer on error: %q", b)
			}
		})
	}
	// Without the H flag the IRD/ORD fields are not encoded, so their range
	// does not matter.
	if _, err := (&MPAFrame{Revision: 1, IRD: 0xffff}).Append(nil); err != nil {
		t.Errorf("IRD without H: %v", err)
	}
}

func TestRTRString(t *testing.T) {
	for r, want := range map[RTR]string{
		0:                            "none",
		RTRSend:                      "send",
		RTRWrite:                     "write",
		RTRRead:                      "read",
		RTRWrite | RTRRead:           "write|read",
		RTRSend | RTRWrite | RTRRead: "send|write|read",
	} {
		if got := r.String(); got != want {
			t.Errorf("RTR(%d).String() = %q, want %q", r, got, want)
		}
	}
}
