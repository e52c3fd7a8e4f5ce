package engine

import "unsafe"

// bigCopyMin is the size from which bigCopy moves bytes with REP MOVSB:
// below it the instruction's start-up costs more than it saves.
const bigCopyMin = 4 << 10

// bigCopy is copy for the shared-memory reader's large pieces, the one
// copy a Write from PD.Alloc memory costs. The runtime's memmove moves
// them with AVX loads and stores; REP MOVSB, on processors that say it is
// fast (ERMS), is faster here (that it writes whole lines without reading
// them first is the usual explanation, not one we measured). Here (AMD
// EPYC with ERMS and FSRM), 1 MiB in 64 KiB pieces between buffers larger
// than the L2: memmove 41-45 GB/s, REP MOVSB 49-51, glibc's memcpy
// (which uses it too) 50-55 (BenchmarkBigCopy). dst and src must not
// overlap.
func bigCopy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < bigCopyMin || !useRepMovsb {
		return copy(dst, src)
	}
	repMovsb(unsafe.SliceData(dst), unsafe.SliceData(src), n)
	return n
}
