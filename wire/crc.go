package wire

import (
	"hash/crc32"
	"math/bits"
)

// castagnoli is the CRC32c table. hash/crc32 uses the SSE4.2/ARMv8 CRC
// instructions for this polynomial where the CPU has them.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32c returns the MPA CRC of b (RFC 5044 §6: CRC32c over the length
// field, the ULPDU and the pad).
func CRC32c(b []byte) uint32 { return UpdateCRC32c(0, b) }

// UpdateCRC32c continues a running MPA CRC with more bytes, so that a
// header, payload slices and pad held in separate buffers can be summed
// without being gathered first. Start from 0. On CPUs with AVX-512 and
// VPCLMULQDQ it sums runs of 64 bytes or more with carry-less multiplies,
// at about twice hash/crc32's rate.
func UpdateCRC32c(crc uint32, b []byte) uint32 {
	// Segment-sized FPDUs carry about 1.4 KB, where hash/crc32's CRC32
	// instruction runs at two thirds of its large-block rate and looks up
	// tables to join its three streams: in place it ran at about half its
	// benchmark's rate (that the data just sent or received evicts the
	// tables is our reading). Folding needs no tables (see foldCRC). With
	// CRC on across a veth pair, where hash/crc32 was a fifth of both
	// processes' CPU, it raised write_bw by about a tenth.
	if !haveFold || len(b) < foldMin {
		return crc32.Update(crc, castagnoli, b)
	}
	return ^foldCRC(^crc, b, &foldK)
}

// foldMin is the shortest run folded: foldCRC needs a 512-bit register's
// worth, and below it hash/crc32 is about as fast.
const foldMin = 64

// foldK holds the folding constants, pairs of 64-bit multipliers that
// move a 128-bit lane of the running value F bits further on in the
// message, for F = 2048 (a step of four registers of four lanes), 1536,
// 1024 and 512 (the registers onto the last one; 512 is also a step of
// one register), 384, 256 and 128 (the lanes onto the last one; 128 is
// also a step of one lane), in that order.
var foldK = func() (k [14]uint64) {
	for i, f := range []int{2048, 1536, 1024, 512, 384, 256, 128} {
		k[2*i], k[2*i+1] = foldPair(f)
	}
	return k
}()

// foldPair gives the multipliers for moving a lane F bits on. A lane
// loaded from memory is bit-reflected: bit t of it is the coefficient of
// x^(E-t), E falling by 128 from one lane to the next. A carry-less
// product of two reflected values is reflected, with the exponents' base
// the sum of theirs. So the low quadword (base E) times x^(F+63) mod P,
// stored reflected with base 63, and the high one (base E-64) times
// x^(F-1) mod P, give 127-bit products whose sum, read as a lane of base
// E-F, is congruent to the lane modulo P: it contributes to the CRC as
// the lane did.
func foldPair(f int) (lo, hi uint64) {
	return uint64(bits.Reverse32(xPowMod(f+63))) << 32, uint64(bits.Reverse32(xPowMod(f-1))) << 32
}

// xPowMod returns x^n mod P for the CRC32c polynomial P, in the normal
// (not reflected) order: bit d is the coefficient of x^d.
func xPowMod(n int) uint32 {
	const p = 0x1edc6f41 // x^32 is implicit
	r := uint32(1)
	for range n {
		carry := r&(1<<31) != 0
		r <<= 1
		if carry {
			r ^= p
		}
	}
	return r
}
