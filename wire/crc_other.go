//go:build !amd64 || purego

package wire

const haveFold = false

func foldCRC(uint32, []byte, *[14]uint64) uint32 { panic("wire: no folding CRC here") }
