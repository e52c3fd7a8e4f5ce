package engine

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestBigCopy: bigCopy copies what copy does, at every size around its
// threshold and at odd alignments, and touches nothing beyond.
func TestBigCopy(t *testing.T) {
	src := make([]byte, 3*bigCopyMin+64)
	for i := range src {
		src[i] = byte(rand.Uint32())
	}
	for _, n := range []int{0, 1, 63, bigCopyMin - 1, bigCopyMin, bigCopyMin + 1, 2*bigCopyMin + 17, 3 * bigCopyMin} {
		for _, a := range []int{0, 1, 7, 31} {
			for _, extra := range []int{0, 5} { // a shorter dst, then a longer one
				dst := bytes.Repeat([]byte{0xee}, n+a+64)
				k := bigCopy(dst[a:a+n+extra], src[a+extra:a+extra+n])
				if k != n {
					t.Fatalf("n=%d a=%d: copied %d", n, a, k)
				}
				if !bytes.Equal(dst[a:a+n], src[a+extra:a+extra+n]) {
					t.Fatalf("n=%d a=%d: bytes differ", n, a)
				}
				for i, b := range dst[:a] {
					if b != 0xee {
						t.Fatalf("n=%d a=%d: byte %d before dst touched", n, a, i)
					}
				}
				for i, b := range dst[a+n+extra:] {
					if b != 0xee {
						t.Fatalf("n=%d a=%d: byte %d after dst touched", n, a, i)
					}
				}
			}
		}
	}
	if got := bigCopy(make([]byte, 10), src); got != 10 {
		t.Fatalf("short dst: copied %d", got)
	}
}

// BenchmarkBigCopy copies 1 MiB in the pieces a shared-memory reader
// copies (64 KiB FPDUs) between buffers written first (a buffer never
// written reads the zero page and shows a false rate), with bigCopy and
// with the runtime's copy.
func BenchmarkBigCopy(b *testing.B) {
	for _, size := range []int{256 << 10, 1 << 20} {
		src, dst := make([]byte, size), make([]byte, size)
		for i := range src {
			src[i], dst[i] = byte(i), byte(i)
		}
		const piece = 64 << 10
		for _, c := range []struct {
			name string
			f    func(d, s []byte) int
		}{{"big", bigCopy}, {"copy", func(d, s []byte) int { return copy(d, s) }}} {
			b.Run(fmt.Sprintf("%s/%dK", c.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					for off := 0; off < size; off += piece {
						c.f(dst[off:off+piece], src[off:off+piece])
					}
				}
			})
		}
	}
}
