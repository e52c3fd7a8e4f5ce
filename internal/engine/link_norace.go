//go:build linux && !race

package engine

import (
	"net"
	"unsafe"
)

func linkRaceAddr(net.Conn) unsafe.Pointer { return nil }
func linkRelease(unsafe.Pointer)           {}
func linkAcquire(unsafe.Pointer)           {}

// wireCopy is copy; in race builds, a copy the race detector does not
// see (link_race.go).
func wireCopy(dst, src []byte) int { return copy(dst, src) }
