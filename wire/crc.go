package wire

import "hash/crc32"

// castagnoli is the CRC32c table. hash/crc32 uses the SSE4.2/ARMv8 CRC
// instructions for this polynomial where the CPU has them.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32c returns the MPA CRC of b (RFC 5044 §6: CRC32c over the length
// field, the ULPDU and the pad).
func CRC32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// UpdateCRC32c continues a running MPA CRC with more bytes, so that a
// header, payload slices and pad held in separate buffers can be summed
// without being gathered first. Start from 0.
func UpdateCRC32c(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }
