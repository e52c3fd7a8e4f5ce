//go:build !linux

package cm

import (
	"errors"
	"syscall"
	"time"
)

// setUserTimeout: only Linux has TCP_USER_TIMEOUT; elsewhere unacknowledged
// bytes are retransmitted for as long as the system's TCP does, and only
// keepalive (set by the caller) bounds an idle connection.
func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }

// setSockopts: a caller's own socket type is left alone outside Linux.
func setSockopts(syscall.RawConn, time.Duration) error {
	return errors.ErrUnsupported
}
