//go:build !purego

#include "textflag.h"

// FOLD moves lane (or register of lanes) L on by the step whose pair of
// multipliers K holds, onto ACC: ACC ^= L.hi*K.hi ^ L.lo*K.lo, lane by
// lane. It clobbers L and T.
#define FOLD(K, L, T, ACC) \
	VPCLMULQDQ $0x11, K, L, T; \
	VPCLMULQDQ $0x00, K, L, L; \
	VPTERNLOGD $0x96, T, L, ACC

// func foldCRC(s uint32, p []byte, k *[14]uint64) uint32
//
// The running value is 128-bit lanes, four to a 512-bit register. A step
// multiplies each lane's quadwords by a pair of foldK (see foldPair),
// which moves it on by the step, onto the bytes there, and adds those.
// From 512 bytes on, four registers step 256 bytes at a time; then one
// steps 64; its lanes move onto its last; that lane steps 16 bytes at a
// time; and the CRC32 instruction sums it and the last 0 to 15 bytes.
TEXT ·foldCRC(SB), NOSPLIT, $0-44
	MOVL s+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ k+32(FP), DX
	VMOVD AX, X10 // the state, over the first four bytes; the rest is zeroed

	CMPQ CX, $512
	JB   one

	VMOVDQU64 (SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VPXORQ    Z10, Z1, Z1
	ADDQ      $256, SI
	SUBQ      $256, CX
	VBROADCASTI32X4 (DX), Z0 // 2048 bits on

four:
	VMOVDQU64  (SI), Z11
	VMOVDQU64  64(SI), Z12
	VMOVDQU64  128(SI), Z13
	VMOVDQU64  192(SI), Z14
	FOLD(Z0, Z1, Z5, Z11)
	FOLD(Z0, Z2, Z6, Z12)
	FOLD(Z0, Z3, Z7, Z13)
	FOLD(Z0, Z4, Z8, Z14)
	VMOVDQA64  Z11, Z1
	VMOVDQA64  Z12, Z2
	VMOVDQA64  Z13, Z3
	VMOVDQA64  Z14, Z4
	ADDQ       $256, SI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        four

	// The first three registers onto the fourth.
	VBROADCASTI32X4 16(DX), Z0 // 1536 bits on
	FOLD(Z0, Z1, Z5, Z4)
	VBROADCASTI32X4 32(DX), Z0 // 1024
	FOLD(Z0, Z2, Z5, Z4)
	VBROADCASTI32X4 48(DX), Z0 // 512
	FOLD(Z0, Z3, Z5, Z4)
	VMOVDQA64       Z4, Z1
	JMP             sixtyfour

one:
	VMOVDQU64 (SI), Z1
	VPXORQ    Z10, Z1, Z1
	ADDQ      $64, SI
	SUBQ      $64, CX

sixtyfour:
	VBROADCASTI32X4 48(DX), Z0 // 512 bits on
	CMPQ            CX, $64
	JB              lanes

step:
	VMOVDQU64  (SI), Z11
	FOLD(Z0, Z1, Z5, Z11)
	VMOVDQA64  Z11, Z1
	ADDQ       $64, SI
	SUBQ       $64, CX
	CMPQ       CX, $64
	JAE        step

lanes:
	VEXTRACTI32X4 $1, Z1, X2
	VEXTRACTI32X4 $2, Z1, X3
	VEXTRACTI32X4 $3, Z1, X4
	VMOVDQU       64(DX), X5 // 384 bits on: lane 0
	FOLD(X5, X1, X6, X4)
	VMOVDQU       80(DX), X5 // 256: lane 1
	FOLD(X5, X2, X6, X4)
	VMOVDQU       96(DX), X5 // 128: lane 2, and the 16-byte steps
	FOLD(X5, X3, X6, X4)

sixteen:
	CMPQ       CX, $16
	JB         sum
	VMOVDQU    (SI), X11
	FOLD(X5, X4, X6, X11)
	VMOVDQA    X11, X4
	ADDQ       $16, SI
	SUBQ       $16, CX
	JMP        sixteen

sum:
	// The lane's raw CRC from a zero state, then the bytes after it.
	VMOVQ   X4, R8
	VPEXTRQ $1, X4, R9
	XORL    AX, AX
	CRC32Q  R8, AX
	CRC32Q  R9, AX
	CMPQ    CX, $8
	JB      bytes
	CRC32Q  (SI), AX
	ADDQ    $8, SI
	SUBQ    $8, CX

bytes:
	TESTQ  CX, CX
	JZ     done
	CRC32B (SI), AX
	INCQ   SI
	DECQ   CX
	JMP    bytes

done:
	VZEROUPPER
	MOVL AX, ret+40(FP)
	RET
