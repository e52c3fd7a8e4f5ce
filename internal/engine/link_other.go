//go:build !linux

package engine

import "net"

// NewLink returns the portable Link for c.
func NewLink(c net.Conn) Link { return &streamLink{c: c} }
