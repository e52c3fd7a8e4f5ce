package cm

import (
	"errors"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets TCP_USER_TIMEOUT: how long sent bytes may stay
// unacknowledged (or the peer's window closed, since Linux 5.11), and
// unanswered keepalive probes go on, before the connection fails.
func setUserTimeout(rc syscall.RawConn, d time.Duration) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	})
	return errors.Join(err, serr)
}

// setSockopts sets keepalive and TCP_USER_TIMEOUT on a socket that the
// net package does not know as TCP (a connection type of the caller's
// that exposes its descriptor).
func setSockopts(rc syscall.RawConn, d time.Duration) error {
	ka := keepAlive(d)
	var serr error
	err := rc.Control(func(fd uintptr) {
		set := func(level, opt, v int) {
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), level, opt, v)
			}
		}
		// TCP's own options first: on a socket that is not TCP they fail
		// before keepalive is turned on.
		set(unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
		set(unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(ka.Idle/time.Second))
		set(unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(ka.Interval/time.Second))
		set(unix.IPPROTO_TCP, unix.TCP_KEEPCNT, ka.Count)
		set(unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
	})
	return errors.Join(err, serr)
}
