//go:build !linux

package engine

import "net"

// NewLink returns the portable Link for c.
func NewLink(c net.Conn) Link { return &streamLink{c: c} }

// wireCopy is copy. On Linux race builds it is a copy the race detector
// does not see (link_race.go); elsewhere links write through net.Conn,
// which copies as the kernel does.
func wireCopy(dst, src []byte) int { return copy(dst, src) }
