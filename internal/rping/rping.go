// Package rping speaks the protocol of rdma-core's rping
// (librdmacm/examples/rping.c) over gowarp, as client and as server, so
// that gowarp can ping the Linux kernel's siw and be pinged by it.
//
// One ping, as rping does it:
//
//  1. The client fills its start buffer ("rdma-ping-N: " and a rolling
//     run of 'A'..'z', NUL last) and Sends its advertisement {addr, rkey,
//     size}: 16 bytes, big-endian (struct rping_rdma_info).
//  2. The server RDMA-Reads the start buffer and Sends a 16-byte "go
//     ahead" (rping leaves it zero; nobody reads it).
//  3. The client Sends the advertisement of its sink buffer.
//  4. The server RDMA-Writes strlen+1 bytes of what it read into the sink
//     and Sends "go ahead" again.
//  5. The client (-V) compares the two buffers.
//
// Each side keeps one receive posted for the 16-byte messages. The server
// reads from the client, so the client must offer IRD ≥ 1 in MPA; rping
// itself asks for IRD = ORD = 1 and no private data.
package rping

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
)

// Defaults and limits of rping.
const (
	DefaultPort = 7174
	DefaultSize = 64
	// MinSize is RPING_MIN_BUFSIZE: room for the "rdma-ping-%d: " prefix
	// with the largest int (sizeof "2147483647" + sizeof "rdma-ping-%d: ").
	MinSize = 11 + 15
	// MaxSize is RPING_BUFSIZE - 1.
	MaxSize = 64*1024 - 1
	// InfoLen is the size of an advertisement on the wire.
	InfoLen = 16
)

// Info is rping's buffer advertisement, struct rping_rdma_info: the
// buffer's tagged offset (its virtual address), its STag and its size.
type Info struct {
	Buf  uint64
	RKey uint32
	Size uint32
}

// Append appends the 16-byte wire form of i to b.
func (i Info) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, i.Buf)
	b = binary.BigEndian.AppendUint32(b, i.RKey)
	return binary.BigEndian.AppendUint32(b, i.Size)
}

// ErrBadMessage is returned for a message that is not a 16-byte
// advertisement (rping: "Received bogus data").
var ErrBadMessage = errors.New("rping: received bogus data")

// ParseInfo decodes an advertisement; b must be exactly 16 bytes, as
// rping checks the receive's byte count.
func ParseInfo(b []byte) (Info, error) {
	if len(b) != InfoLen {
		return Info{}, fmt.Errorf("%w: %d bytes, want %d", ErrBadMessage, len(b), InfoLen)
	}
	return Info{
		Buf:  binary.BigEndian.Uint64(b),
		RKey: binary.BigEndian.Uint32(b[8:]),
		Size: binary.BigEndian.Uint32(b[12:]),
	}, nil
}

// FillPing writes the data of ping number ping into buf as rping's client
// does: the "rdma-ping-N: " prefix, then characters from 'A'+(ping mod 58)
// counting up and wrapping from 'z' to 'A', and a NUL in the last byte.
func FillPing(buf []byte, ping int) {
	if len(buf) == 0 {
		return
	}
	n := copy(buf, fmt.Sprintf("rdma-ping-%d: ", ping))
	c := byte('A' + ping%58)
	for i := n; i < len(buf); i++ {
		buf[i] = c
		c++
		if c > 'z' {
			c = 'A'
		}
	}
	buf[len(buf)-1] = 0
}

// CString returns b up to its first NUL, as C's string functions see it.
func CString(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

// CheckSize reports whether size is one rping accepts.
func CheckSize(size int) error {
	if size < MinSize || size > MaxSize {
		return fmt.Errorf("rping: invalid size %d (valid range is %d to %d)", size, MinSize, MaxSize)
	}
	return nil
}

// ctxErr prefers the context's error, which says why a wait ended.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
