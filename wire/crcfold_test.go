package wire

import (
	"hash/crc32"
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestUpdateCRC32cFolds checks the folding CRC against hash/crc32 at every
// length up to 4 KiB and some longer, at every alignment mod 64, from
// random running CRCs, and split at random points.
func TestUpdateCRC32cFolds(t *testing.T) {
	if !haveFold {
		t.Log("this CPU has no AVX-512 VPCLMULQDQ: UpdateCRC32c is hash/crc32's, checked all the same")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 70000)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	lengths := []int{65535, 65536, 65536 + 63, 69000}
	for n := 0; n <= 4096; n++ {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		off := rng.IntN(64)
		b := buf[off : off+n]
		seed := rng.Uint32()
		if got, want := UpdateCRC32c(seed, b), crc32.Update(seed, castagnoli, b); got != want {
			t.Fatalf("len %d offset %d from %#x: %#08x, hash/crc32 says %#08x", n, off, seed, got, want)
		}
		if n > 0 {
			k := rng.IntN(n)
			if got, want := UpdateCRC32c(UpdateCRC32c(0, b[:k]), b[k:]), crc32.Checksum(b, castagnoli); got != want {
				t.Fatalf("len %d split at %d: %#08x, want %#08x", n, k, got, want)
			}
		}
	}
}

// TestFoldConstants checks xPowMod against the polynomial's definition
// through the CRC itself: the raw CRC of a 1 followed by n-32 zero bits is
// x^n mod P, reflected (as xPowMod gives it).
func TestFoldConstants(t *testing.T) {
	for _, m := range []int{1, 2, 5, 16, 61, 68} {
		msg := make([]byte, m)
		msg[0] = 1 // bit 0 of the first byte: the highest term, x^(8m-1)
		// The raw CRC from a zero state is the message times x^32 mod P.
		raw := ^crc32.Update(^uint32(0), castagnoli, msg)
		if got, want := raw, xPowMod(uint64(8*m+31), 0); got != want {
			t.Errorf("x^%d mod P: CRC says %#08x, xPowMod %#08x", 8*m+31, got, want)
		}
	}
}

// TestCombineCRC32c: the combined CRC of two parts is the CRC of the
// whole, for empty parts, short ones and long ones, split anywhere.
func TestCombineCRC32c(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1<<20+7)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for _, n := range []int{0, 1, 2, 3, 7, 8, 64, 4095, 4096, 65537, 1<<20 + 7} {
		want := crc32.Checksum(buf[:n], castagnoli)
		splits := []int{0, n / 3, n / 2, n}
		for range 4 {
			splits = append(splits, r.IntN(n+1))
		}
		for _, k := range splits {
			a, b := buf[:k], buf[k:n]
			if got := CombineCRC32c(CRC32c(a), CRC32c(b), int64(len(b))); got != want {
				t.Errorf("%d bytes split at %d: combined %#x, whole %#x", n, k, got, want)
			}
		}
	}
	// Lengths past what the test can sum: moving a CRC on by 2^40 bytes
	// is moving it by 2^39 twice.
	const big = int64(1) << 40
	c := CRC32c(buf[:100])
	if got, want := CombineCRC32c(c, 0, big), CombineCRC32c(CombineCRC32c(c, 0, big/2), 0, big/2); got != want {
		t.Errorf("moved by 2^40 bytes: %#x, by 2^39 twice %#x", got, want)
	}
}

func BenchmarkCRC32c(b *testing.B) {
	for _, n := range []int{64, 100, 256, 1428, 4096, 65536} {
		p := make([]byte, n)
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				UpdateCRC32c(0, p)
			}
		})
		b.Run(strconv.Itoa(n)+"/hash-crc32", func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc32.Update(0, castagnoli, p)
			}
		})
	}
}

// FuzzUpdateCRC32c checks the folding CRC against hash/crc32 on any bytes,
// from any running CRC, at any alignment.
func FuzzUpdateCRC32c(f *testing.F) {
	f.Add(uint32(0), uint8(0), make([]byte, 64))
	f.Add(uint32(0xffffffff), uint8(3), make([]byte, 1500))
	f.Add(uint32(0x12345678), uint8(17), pattern(4200))
	f.Fuzz(func(t *testing.T, seed uint32, off uint8, b []byte) {
		b = b[min(int(off%64), len(b)):]
		if got, want := UpdateCRC32c(seed, b), crc32.Update(seed, castagnoli, b); got != want {
			t.Fatalf("%d bytes from %#x: %#08x, hash/crc32 says %#08x", len(b), seed, got, want)
		}
	})
}
