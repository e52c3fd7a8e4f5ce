package wire

import "hash/crc32"

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
	return uint64(xPowMod(uint64(f+63), 0)) << 32, uint64(xPowMod(uint64(f-1), 0)) << 32
}

// CombineCRC32c returns the CRC32c of a‖b from crcA = CRC32c(a), crcB =
// CRC32c(b) and len(b), without the bytes (zlib's crc32_combine, for the
// Castagnoli polynomial): a value held in pieces gets its whole sum from
// the pieces' sums rather than a second pass over its bytes. From crcA 0,
// the CRC of nothing, it gives crcB. hash/crc32 has no combine.
func CombineCRC32c(crcA, crcB uint32, lenB int64) uint32 {
	return mulMod(xPowMod(uint64(max(lenB, 0)), 3), crcA) ^ crcB
}

// mulMod is a(x)·b(x) modulo P, in reflected bit order (bit 31 holds
// x^0), as a CRC's register holds its value.
func mulMod(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				break
			}
		}
		if b&1 != 0 {
			b = b>>1 ^ crc32.Castagnoli // the polynomial, reversed
		} else {
			b >>= 1
		}
	}
	return p
}

// xPow2k[k] is x^(2^k) mod P, reflected, for k up to 66: exponents of
// 2^64 bytes.
var xPow2k = func() (t [67]uint32) {
	t[0] = 1 << 30 // x^1
	for k := 1; k < len(t); k++ {
		t[k] = mulMod(t[k-1], t[k-1])
	}
	return
}()

// xPowMod returns x^(n·2^shift) mod P, reflected: shift 0 for n bits,
// 3 for n bytes (what appending n zero bytes multiplies a CRC's register
// by).
func xPowMod(n uint64, shift int) uint32 {
	p := uint32(1) << 31 // x^0
	for k := shift; n > 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			p = mulMod(xPow2k[k], p)
		}
	}
	return p
}
