//go:build !purego

package wire

import "golang.org/x/sys/cpu"

// haveFold says the CPU (and the OS, which saves its registers) has
// AVX-512 with VPCLMULQDQ, which foldCRC needs.
var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ

// foldCRC continues the raw CRC state s (the CRC inverted) over p, at
// least 64 bytes, and returns the new state. k is foldK.
//
//go:noescape
func foldCRC(s uint32, p []byte, k *[14]uint64) uint32
