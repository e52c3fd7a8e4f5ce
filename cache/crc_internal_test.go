package cache

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCRC32Combine: the combined CRC of two parts is the CRC of the
// whole, for empty parts, short ones and long ones, split anywhere.
func TestCRC32Combine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1<<20+7)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	lens := []int{0, 1, 2, 3, 7, 8, 64, 4095, 4096, 65537, 1<<20 + 7}
	for _, n := range lens {
		splits := []int{0, n / 3, n / 2, n}
		for range 4 {
			splits = append(splits, r.IntN(n+1))
		}
		for _, k := range splits {
			a, b := buf[:k], buf[k:n]
			want := crc32.Checksum(buf[:n], crc32.MakeTable(crc32.Castagnoli))
			if got := crc32Combine(crc32Of(a), crc32Of(b), int64(len(b))); got != want {
				t.Errorf("%d bytes split at %d: combined %#x, whole %#x", n, k, got, want)
			}
		}
	}
}
