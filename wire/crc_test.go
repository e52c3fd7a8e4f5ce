package wire

import (
	"bytes"
	"testing"
)

// crc32cRef is a bit-at-a-time CRC32c (Castagnoli, reflected polynomial
// 0x82F63B78, initial value and final XOR all ones), written from the
// definition in RFC 3385/3720 as an independent check of CRC32c.
func crc32cRef(b []byte) uint32 {
	crc := ^uint32(0)
	for _, c := range b {
		crc ^= uint32(c)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0x82f63b78
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

func TestCRC32cKnownVectors(t *testing.T) {
	inc := make([]byte, 32)
	dec := make([]byte, 32)
	for i := range 32 {
		inc[i] = byte(i)
		dec[i] = byte(31 - i)
	}
	tests := []struct {
		name string
		in   []byte
		want uint32
	}{
		{"empty", nil, 0},
		{"check value 123456789", []byte("123456789"), 0xe3069283},
		// RFC 3720 Appendix B.4, whose byte lists (aa 36 91 8a ...) are
		// these values least-significant byte first.
		{"32 zero bytes", make([]byte, 32), 0x8a9136aa},
		{"32 0xff bytes", bytes.Repeat([]byte{0xff}, 32), 0x62a8ab43},
		{"32 incrementing bytes", inc, 0x46dd794e},
		{"32 decrementing bytes", dec, 0x113fdb5c},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := crc32cRef(tt.in); got != tt.want {
				t.Errorf("reference CRC32c = %#08x, want %#08x", got, tt.want)
			}
			if got := CRC32c(tt.in); got != tt.want {
				t.Errorf("CRC32c = %#08x, want %#08x", got, tt.want)
			}
		})
	}
}

func TestCRC32cMatchesReference(t *testing.T) {
	data := pattern(1100)
	for n := 0; n <= len(data); n += 1 + n/16 {
		if got, want := CRC32c(data[:n]), crc32cRef(data[:n]); got != want {
			t.Fatalf("CRC32c of %d bytes = %#08x, reference %#08x", n, got, want)
		}
	}
}

func TestUpdateCRC32cAnySplit(t *testing.T) {
	data := pattern(70)
	want := CRC32c(data)
	for i := 0; i <= len(data); i++ {
		for j := i; j <= len(data); j += 7 {
			crc := UpdateCRC32c(0, data[:i])
			crc = UpdateCRC32c(crc, data[i:j])
			crc = UpdateCRC32c(crc, data[j:])
			if crc != want {
				t.Fatalf("split at %d,%d: %#08x, want %#08x", i, j, crc, want)
			}
		}
	}
}
