package cm

import (
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// sockopts are the options SetLinkTimeout sets, as the kernel reports them.
type sockopts struct{ userTimeoutMs, keepAlive, idle, intvl, cnt int }

func readSockopts(t *testing.T, c syscall.Conn) sockopts {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var o sockopts
	get := func(fd, level, opt int) int {
		v, err := unix.GetsockoptInt(fd, level, opt)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	rc.Control(func(fd uintptr) {
		o.userTimeoutMs = get(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		o.keepAlive = get(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		o.idle = get(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		o.intvl = get(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
		o.cnt = get(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
	})
	return o
}

// rawOnly hides everything of a TCP connection but its descriptor: a
// connection type of the caller's own.
type rawOnly struct {
	net.Conn
	sc syscall.Conn
}

func (r rawOnly) SyscallConn() (syscall.RawConn, error) { return r.sc.SyscallConn() }

// TestSetLinkTimeout: the timeout reaches the socket as TCP_USER_TIMEOUT
// and a keepalive schedule that ends with it, on a TCP connection, under
// a TLS one and behind a SyscallConn method; a negative timeout leaves
// the socket alone, and a stream with no socket says so.
func TestSetLinkTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    time.Duration
		wrap func(*net.TCPConn) net.Conn
		want sockopts
	}{
		{"default", 0, nil, sockopts{30000, 1, 10, 5, 4}},
		{"3s", 3 * time.Second, nil, sockopts{3000, 1, 1, 1, 2}},
		{"90s", 90 * time.Second, nil, sockopts{90000, 1, 30, 15, 4}},
		{"tls", 3 * time.Second, func(c *net.TCPConn) net.Conn { return tls.Client(c, &tls.Config{}) }, sockopts{3000, 1, 1, 1, 2}},
		{"syscallconn", 12 * time.Second, func(c *net.TCPConn) net.Conn { return rawOnly{c, c} }, sockopts{12000, 1, 4, 2, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := tcpPair(t)
			var conn net.Conn = c
			if tc.wrap != nil {
				conn = tc.wrap(c)
			}
			if err := SetLinkTimeout(conn, tc.d); err != nil {
				t.Fatal(err)
			}
			if got := readSockopts(t, c); got != tc.want {
				t.Errorf("socket options %+v, want %+v", got, tc.want)
			}
		})
	}
	t.Run("off", func(t *testing.T) {
		c, _ := tcpPair(t)
		before := readSockopts(t, c)
		if err := SetLinkTimeout(c, -1); err != nil {
			t.Fatal(err)
		}
		if got := readSockopts(t, c); got != before || got.userTimeoutMs != 0 {
			t.Errorf("socket options %+v, want them untouched (%+v)", got, before)
		}
	})
	t.Run("pipe", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		if err := SetLinkTimeout(a, 0); !errors.Is(err, errNoSocket) {
			t.Errorf("SetLinkTimeout on a pipe: %v, want %v", err, errNoSocket)
		}
	})
	t.Run("unix", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "s")
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := SetLinkTimeout(c, 0); err == nil {
			t.Error("SetLinkTimeout on a Unix socket succeeded")
		}
	})
}

// TestMPASetsLinkTimeout: both sides of the MPA exchange set the link
// timeout on their sockets before they send.
func TestMPASetsLinkTimeout(t *testing.T) {
	c, s := tcpPair(t)
	errc := make(chan error, 1)
	go func() {
		req, err := ReadRequest(t.Context(), s)
		if err == nil {
			_, err = req.Accept(t.Context(), Options{LinkTimeout: 4 * time.Second})
		}
		errc <- err
	}()
	if _, err := Initiate(t.Context(), c, Options{LinkTimeout: 7 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if got := readSockopts(t, c).userTimeoutMs; got != 7000 {
		t.Errorf("initiator's TCP_USER_TIMEOUT %d ms, want 7000", got)
	}
	if got := readSockopts(t, s).userTimeoutMs; got != 4000 {
		t.Errorf("responder's TCP_USER_TIMEOUT %d ms, want 4000", got)
	}
}
