package rpc

import (
	"encoding/binary"
	"fmt"
	"log/slog"
)

// Options size a session; the zero value is usable. Client and server
// each propose theirs and the handshake settles on the smaller.
type Options struct {
	// Slots is the number of calls one session may have outstanding
	// (default 128, at most 1024).
	Slots int
	// MaxMessage is the largest call or reply message, header included
	// (default 4096 bytes, at least 256). Arguments and results larger
	// than that travel by reference.
	MaxMessage int
	// HeapSize is the client's session heap, from which Alloc lends
	// buffers (default 16 MiB), made at the first Alloc.
	HeapSize int
	// Logger gets session events (default slog.Default()).
	Logger *slog.Logger
}

const (
	defaultSlots  = 128
	maxSlots      = 1024
	defaultMsg    = 4096
	minMsg        = 256
	defaultHeap   = 16 << 20
	cancelCredits = 16 // receive buffers a server keeps for cancel messages

	// fetchChunk is the server's staging buffer for one reference's
	// fetches and the largest read-ahead; larger reads go straight into
	// the caller's buffer.
	fetchChunk = 256 << 10
	readAhead0 = 16 << 10 // first read-ahead once access looks sequential
)

func (o Options) withDefaults() Options {
	if o.Slots <= 0 {
		o.Slots = defaultSlots
	}
	o.Slots = min(o.Slots, maxSlots)
	if o.MaxMessage <= 0 {
		o.MaxMessage = defaultMsg
	}
	o.MaxMessage = max(o.MaxMessage, minMsg)
	if o.HeapSize <= 0 {
		o.HeapSize = defaultHeap
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// hello is the private data of connection setup, both ways: a magic,
// the slots and message size proposed (client) or granted (server), and
// the session's identity, chosen by the server.
type hello struct {
	Slots      uint16
	MaxMessage uint32
	Session    uint64
}

var helloMagic = [6]byte{'G', 'W', 'R', 'P', 'C', 1}

const helloLen = 20

func (h hello) append(b []byte) []byte {
	b = append(b, helloMagic[:]...)
	b = binary.BigEndian.AppendUint16(b, h.Slots)
	b = binary.BigEndian.AppendUint32(b, h.MaxMessage)
	return binary.BigEndian.AppendUint64(b, h.Session)
}

func parseHello(b []byte) (hello, error) {
	if len(b) != helloLen || [6]byte(b[:6]) != helloMagic {
		return hello{}, fmt.Errorf("%w: not an rpc session (%d bytes of private data)", ErrMalformed, len(b))
	}
	h := hello{
		Slots:      binary.BigEndian.Uint16(b[6:]),
		MaxMessage: binary.BigEndian.Uint32(b[8:]),
		Session:    binary.BigEndian.Uint64(b[12:]),
	}
	if h.Slots == 0 || h.Slots > maxSlots || h.MaxMessage < minMsg || h.MaxMessage > 1<<20 {
		return hello{}, fmt.Errorf("%w: hello with %d slots, %d-byte messages", ErrMalformed, h.Slots, h.MaxMessage)
	}
	return h, nil
}
