package cache

// crc32Combine gives the CRC32c of a‖b from crcA = CRC32c(a), crcB =
// CRC32c(b) and len(b), without the bytes (zlib's crc32_combine, for
// the reflected Castagnoli polynomial): a value of several pieces gets
// its whole sum from its pieces' CRCs rather than a second pass over
// its bytes (from crcA 0, the CRC of nothing, it gives crcB). hash/crc32
// has no combine.
func crc32Combine(crcA, crcB uint32, lenB int64) uint32 {
	return crcMulMod(crcX8n(lenB), crcA) ^ crcB
}

// castagnoliRev is the Castagnoli polynomial, bit-reversed.
const castagnoliRev = 0x82f63b78

// crcMulMod is a(x)·b(x) modulo the polynomial, in reflected bit order
// (bit 31 holds x^0).
func crcMulMod(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				break
			}
		}
		if b&1 != 0 {
			b = b>>1 ^ castagnoliRev
		} else {
			b >>= 1
		}
	}
	return p
}

// crcX2k[k] is x^(2^k) modulo the polynomial, for every k crcX8n needs
// (3 to 65: lengths up to 2^63).
var crcX2k = func() (t [66]uint32) {
	t[0] = 1 << 30 // x^1
	for k := 1; k < len(t); k++ {
		t[k] = crcMulMod(t[k-1], t[k-1])
	}
	return
}()

// crcX8n is x^(8n) modulo the polynomial: what appending n zero bytes
// multiplies a CRC's register by.
func crcX8n(n int64) uint32 {
	p := uint32(1) << 31 // x^0
	for k := 3; n > 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			p = crcMulMod(crcX2k[k], p)
		}
	}
	return p
}
