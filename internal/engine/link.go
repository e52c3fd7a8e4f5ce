package engine

import (
	"errors"
	"net"
)

// maxIov bounds the vectors of one gathered write or scattered read
// (Linux's IOV_MAX is 1024).
const maxIov = 1024

// errWouldBlock is returned by a non-blocking Writev that could write nothing.
var errWouldBlock = errors.New("engine: write would block")

// Link is the byte stream under a queue pair: a TCP connection after MPA
// negotiation. The engine reads and writes it from one receive and one
// transmit path; a Link need not be safe for concurrent Readv or
// concurrent Writev calls, but a Readv and a Writev may run at once.
type Link interface {
	// Readv reads into bufs in order and returns the number of bytes read,
	// blocking until at least one byte arrives.
	Readv(bufs [][]byte) (int, error)
	// Writev writes bufs in order. With block false it writes what the
	// socket takes now and returns errWouldBlock if that is nothing; with
	// block true it waits until some bytes are written. Short writes are
	// normal: the caller resumes. records cuts bufs into records (each
	// entry is the index in bufs where one ends; the last ends with bufs):
	// where it can, the link ends a TCP segment at the end of each record.
	Writev(bufs [][]byte, records []int, block bool) (int, error)
	// Unacked returns the bytes written but not yet acknowledged by the
	// peer (unsent plus unacknowledged), or an error where unknown.
	Unacked() (int, error)
	// MSS returns the TCP maximum segment size now, or 0 where unknown.
	// Calls must not race with each other.
	MSS() int
	// Close closes the connection; blocked Readv and Writev calls return.
	Close() error
	// Conn returns the underlying connection.
	Conn() net.Conn
}

// idleReader is a Link that can wait for bytes without holding the
// buffer they will be read into: a queue pair that waits for its peer
// then holds no staging buffer (see rxState.receive).
type idleReader interface {
	// ReadIdle reads into buf, as Readv does into one buffer. When no
	// bytes are there it gives buf back with put and, once bytes come,
	// takes the buffer to read them into with get. It returns the bytes
	// read and the buffer they are in: buf, get's, or nil if it returns
	// with nothing read after giving buf back (a deadline, a close).
	//
	// If more is not nil, bytes read are handed to it before ReadIdle
	// returns: more(n) takes the n bytes at the start of the buffer and
	// returns the buffer to read into next and whether to go on reading;
	// ReadIdle returns 0 and a nil error once more has said no.
	ReadIdle(buf []byte, put func([]byte), get func() []byte, more func(n int) ([]byte, bool)) (int, []byte, error)
}

// streamLink is the portable Link over any net.Conn: reads land in the first
// buffer only and writes block. NewLink uses it where no socket descriptor
// is available (a TLS connection, net.Pipe in tests, non-Linux systems).
//
// A net.Conn has no write that returns at once when the stream is full, so
// a non-blocking Writev writes nothing and says it would block: every
// transmit is the transmit goroutine's. A receive path answering a Read
// inline would otherwise block in Write while the peer's does the same,
// neither reading: both stuck (TestOverTLSReadsBothWays).
type streamLink struct {
	c    net.Conn
	bufs net.Buffers
}

func (l *streamLink) Readv(bufs [][]byte) (int, error) {
	for _, b := range bufs {
		if len(b) > 0 {
			return l.c.Read(b)
		}
	}
	return 0, nil
}

func (l *streamLink) Writev(bufs [][]byte, _ []int, block bool) (int, error) {
	if !block {
		return 0, errWouldBlock
	}
	l.bufs = append(l.bufs[:0], bufs...)
	n, err := l.bufs.WriteTo(l.c)
	clear(l.bufs[:cap(l.bufs)])
	return int(n), err
}

func (l *streamLink) Unacked() (int, error) { return 0, errors.ErrUnsupported }
func (l *streamLink) MSS() int              { return 0 }
func (l *streamLink) Close() error          { return l.c.Close() }
func (l *streamLink) Conn() net.Conn        { return l.c }
