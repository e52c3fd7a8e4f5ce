// Package failover is the codec of gowarp's session fail-over: the
// header a session puts in front of each message it sends, and the
// handshake a connection carries in its MPA private data when it joins a
// session. Standard library only; no I/O.
//
// Header, 16 bytes, big-endian:
//
//	0  magic 0x6746 ("gF")
//	2  version (1)
//	3  kind: Data, Ack, Ping, Pong
//	4  session tag: the low 32 bits of the session's id
//	8  sequence: a Data message's number in its direction (from 1);
//	   an Ack's cumulative count (every message up to it delivered);
//	   a Ping's number, which its Pong returns
//
// Hello (the handshake), 24 bytes, big-endian:
//
//	0  magic "gwFS"
//	4  version (1)
//	5  flags: Rejoin (the initiator has had the session before: a
//	   responder that does not know it must refuse), Reply
//	6  window: how many messages the sender buffers from its peer
//	8  session id
//	16 max message: the largest Send payload the sender receives
//	20 path: the index of the connection's path in the session
//	21 reserved, zero
package failover

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderLen is the size of a Header on the wire; HelloLen of a Hello.
const (
	HeaderLen = 16
	HelloLen  = 24
)

const (
	headerMagic = 0x6746
	helloMagic  = 0x67774653 // "gwFS"
	version     = 1
)

// Kind is what a message of a session carries.
type Kind uint8

// Message kinds.
const (
	Data Kind = iota + 1 // an application's Send
	Ack                  // cumulative acknowledgement of the peer's messages
	Ping                 // liveness probe of one connection
	Pong                 // its answer
)

func (k Kind) String() string {
	switch k {
	case Data:
		return "data"
	case Ack:
		return "ack"
	case Ping:
		return "ping"
	case Pong:
		return "pong"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Errors of the decoders.
var (
	ErrShort   = errors.New("failover: message too short")
	ErrMagic   = errors.New("failover: not a fail-over message (bad magic)")
	ErrVersion = errors.New("failover: unknown version")
	ErrKind    = errors.New("failover: unknown message kind")
	ErrField   = errors.New("failover: invalid field")
)

// Header is the fail-over header in front of each message.
type Header struct {
	Kind    Kind
	Session uint32
	Seq     uint64
}

// Append appends h's encoding to b.
func (h Header) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, headerMagic)
	b = append(b, version, byte(h.Kind))
	b = binary.BigEndian.AppendUint32(b, h.Session)
	return binary.BigEndian.AppendUint64(b, h.Seq)
}

// Put writes h's encoding into b[:HeaderLen], which must be that long.
func (h Header) Put(b []byte) { h.Append(b[:0:HeaderLen]) }

// ParseHeader decodes the header at the start of b and returns it and
// the bytes it took.
func ParseHeader(b []byte) (Header, int, error) {
	if len(b) < HeaderLen {
		return Header{}, 0, ErrShort
	}
	if binary.BigEndian.Uint16(b) != headerMagic {
		return Header{}, 0, ErrMagic
	}
	if b[2] != version {
		return Header{}, 0, ErrVersion
	}
	h := Header{Kind: Kind(b[3]), Session: binary.BigEndian.Uint32(b[4:]), Seq: binary.BigEndian.Uint64(b[8:])}
	if h.Kind < Data || h.Kind > Pong {
		return Header{}, 0, ErrKind
	}
	return h, HeaderLen, nil
}

// Hello flags.
const (
	Rejoin = 1 << iota
	Reply
	knownFlags = Rejoin | Reply
)

// Hello is the handshake a connection carries when it joins a session.
type Hello struct {
	Flags      uint8
	Window     uint16
	Session    uint64
	MaxMessage uint32
	Path       uint8
}

// Append appends h's encoding to b.
func (h Hello) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, helloMagic)
	b = append(b, version, h.Flags)
	b = binary.BigEndian.AppendUint16(b, h.Window)
	b = binary.BigEndian.AppendUint64(b, h.Session)
	b = binary.BigEndian.AppendUint32(b, h.MaxMessage)
	return append(b, h.Path, 0, 0, 0)
}

// ParseHello decodes the hello at the start of b and returns it and the
// bytes it took. A window or max message of 0, unknown flags or reserved
// bytes that are not zero are ErrField.
func ParseHello(b []byte) (Hello, int, error) {
	if len(b) < HelloLen {
		return Hello{}, 0, ErrShort
	}
	if binary.BigEndian.Uint32(b) != helloMagic {
		return Hello{}, 0, ErrMagic
	}
	if b[4] != version {
		return Hello{}, 0, ErrVersion
	}
	h := Hello{Flags: b[5], Window: binary.BigEndian.Uint16(b[6:]), Session: binary.BigEndian.Uint64(b[8:]),
		MaxMessage: binary.BigEndian.Uint32(b[16:]), Path: b[20]}
	if h.Flags&^knownFlags != 0 || h.Window == 0 || h.MaxMessage == 0 || b[21]|b[22]|b[23] != 0 {
		return Hello{}, 0, ErrField
	}
	return h, HelloLen, nil
}
