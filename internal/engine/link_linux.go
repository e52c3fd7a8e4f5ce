package engine

import (
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxIov bounds the vectors of one readv/writev (Linux IOV_MAX is 1024).
const maxIov = 1024

// fdLink drives a TCP socket through its raw descriptor: scatter reads that
// land payload straight in registered memory, gathered non-blocking writes,
// and the kernel's send-queue counters. The iovec arrays and the callbacks
// handed to syscall.RawConn are built once, so no call allocates.
type fdLink struct {
	c  net.Conn
	rc syscall.RawConn

	riov  []unix.Iovec
	rn    int
	rerr  error
	rfunc func(uintptr) bool

	wiov    []unix.Iovec
	wn      int
	werr    error
	wblock  bool
	wfunc   func(uintptr) bool
	outq    int
	outqErr error
	ofunc   func(uintptr)
	mss     int
}

// NewLink returns the Link for c: the descriptor-level one for TCP on
// Linux, the portable one otherwise.
func NewLink(c net.Conn) Link {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return &streamLink{c: c}
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return &streamLink{c: c}
	}
	l := &fdLink{c: c, rc: rc, riov: make([]unix.Iovec, 0, maxIov), wiov: make([]unix.Iovec, 0, maxIov)}
	l.rfunc, l.wfunc, l.ofunc = l.doRead, l.doWrite, l.doOutq
	_ = rc.Control(func(fd uintptr) {
		l.mss, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG)
	})
	return l
}

func fillIov(iov []unix.Iovec, bufs [][]byte) []unix.Iovec {
	iov = iov[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if len(iov) == cap(iov) {
			break
		}
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	return iov
}

func (l *fdLink) doRead(fd uintptr) bool {
	n, _, e := unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&l.riov[0])), uintptr(len(l.riov)))
	if e == unix.EAGAIN {
		return false
	}
	if e == unix.EINTR {
		return false
	}
	l.rn, l.rerr = int(n), nil
	if e != 0 {
		l.rn, l.rerr = 0, e
	}
	return true
}

func (l *fdLink) Readv(bufs [][]byte) (int, error) {
	l.riov = fillIov(l.riov, bufs)
	if len(l.riov) == 0 {
		return 0, nil
	}
	l.rn, l.rerr = 0, nil
	err := l.rc.Read(l.rfunc)
	clear(l.riov[:cap(l.riov)])
	if err != nil {
		return 0, err
	}
	if l.rerr == nil && l.rn == 0 {
		return 0, io.EOF
	}
	return l.rn, l.rerr
}

func (l *fdLink) doWrite(fd uintptr) bool {
	n, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&l.wiov[0])), uintptr(len(l.wiov)))
	if e == unix.EAGAIN || e == unix.EINTR {
		if l.wblock {
			return false
		}
		l.wn, l.werr = 0, errWouldBlock
		return true
	}
	l.wn, l.werr = int(n), nil
	if e != 0 {
		l.wn, l.werr = 0, e
	}
	return true
}

func (l *fdLink) Writev(bufs [][]byte, block bool) (int, error) {
	l.wiov = fillIov(l.wiov, bufs)
	if len(l.wiov) == 0 {
		return 0, nil
	}
	l.wblock = block
	err := l.rc.Write(l.wfunc)
	clear(l.wiov[:cap(l.wiov)])
	if err != nil {
		return 0, err
	}
	return l.wn, l.werr
}

func (l *fdLink) doOutq(fd uintptr) {
	l.outq, l.outqErr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
}

// Unacked reads SIOCOUTQ: the bytes of the send queue the peer has not
// acknowledged, sent or not. It must not race with another Unacked call.
func (l *fdLink) Unacked() (int, error) {
	if err := l.rc.Control(l.ofunc); err != nil {
		return 0, err
	}
	return l.outq, l.outqErr
}

func (l *fdLink) MSS() int       { return l.mss }
func (l *fdLink) Close() error   { return l.c.Close() }
func (l *fdLink) Conn() net.Conn { return l.c }
