//go:build !race

package engine

import "golang.org/x/sys/cpu"

// useRepMovsb: the processor says its REP MOVSB is fast (ERMS). Not in
// race builds, whose detector sees only the copies Go makes.
var useRepMovsb = cpu.X86.HasERMS

// repMovsb copies n bytes from src to dst, which must not overlap.
//
//go:noescape
func repMovsb(dst, src *byte, n int)
