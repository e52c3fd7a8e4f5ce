package cm

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// DefaultLinkTimeout is how long a peer may go unheard before its
// connection fails, unless Options.LinkTimeout says otherwise: without a
// bound, TCP retransmits to a dead link for about 15 minutes and an idle
// connection to one never ends.
const DefaultLinkTimeout = 30 * time.Second

// linkTimeout returns the timeout d asks for: the default for 0, none
// (0) for a negative d.
func linkTimeout(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return DefaultLinkTimeout
	case d < 0:
		return 0
	}
	return d
}

// keepAlive is the keepalive schedule that gives up on a silent peer
// after about d: the first probe after a third of d idle, then one every
// sixth. On Linux TCP_USER_TIMEOUT, set to d as well, decides when the
// unanswered probes end the connection; the count is for systems without
// it. Keepalive times are whole seconds, at least 1.
func keepAlive(d time.Duration) net.KeepAliveConfig {
	idle := max((d / 3).Truncate(time.Second), time.Second)
	intvl := max((d / 6).Truncate(time.Second), time.Second)
	return net.KeepAliveConfig{Enable: true, Idle: idle, Interval: intvl, Count: max(int((d-idle)/intvl), 1)}
}

// errNoSocket: the connection has no socket under it to set options on.
var errNoSocket = errors.New("no TCP socket under the connection")

// SetLinkTimeout bounds how long c's peer may go unheard, for d (0 for
// DefaultLinkTimeout, negative to leave the socket alone): bytes sent
// that stay unacknowledged for d (TCP_USER_TIMEOUT, Linux only; it also
// bounds a window the peer keeps closed), and keepalive probes that go
// unanswered on an idle connection, end the connection with ETIMEDOUT.
// It works on a *net.TCPConn, on anything whose NetConn method leads to
// one (a *tls.Conn), and on a connection with a SyscallConn method whose
// socket is TCP; on other streams (net.Pipe, a Unix socket) it returns an
// error and changes nothing.
func SetLinkTimeout(c net.Conn, d time.Duration) error {
	d = linkTimeout(d)
	if d == 0 {
		return nil
	}
	for range 4 { // a few layers of wrapping at most
		switch t := c.(type) {
		case *net.TCPConn:
			if err := t.SetKeepAliveConfig(keepAlive(d)); err != nil {
				return err
			}
			rc, err := t.SyscallConn()
			if err != nil {
				return err
			}
			return setUserTimeout(rc, d)
		case syscall.Conn:
			rc, err := t.SyscallConn()
			if err != nil {
				return err
			}
			return setSockopts(rc, d)
		case interface{ NetConn() net.Conn }:
			c = t.NetConn()
		default:
			return errNoSocket
		}
	}
	return errNoSocket
}
