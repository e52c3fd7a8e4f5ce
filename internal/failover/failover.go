// Package failover is the codec of gowarp's session fail-over: the
// header a session puts in front of each message it sends, and the
// handshake a connection carries in its MPA private data when it joins a
// session, the redirect a listener answers a moved session's rejoin with,
// and the hand-off of a node's sessions to another. Standard library
// only; no I/O.
//
// Header, 16 bytes, big-endian:
//
//	0  magic 0x6746 ("gF")
//	2  version (1)
//	3  kind: Data, Ack, Ping, Pong, Close
//	4  session tag: the low 32 bits of the session's id
//	8  sequence: a Data message's number in its direction (from 1);
//	   an Ack's cumulative count (every message up to it delivered);
//	   a Ping's number, which its Pong returns; 0 in a Close
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
	"hash/crc32"
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
	Data  Kind = iota + 1 // an application's Send
	Ack                   // cumulative acknowledgement of the peer's messages
	Ping                  // liveness probe of one connection
	Pong                  // its answer
	Close                 // the sender closed the session (Session.Close)
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
	case Close:
		return "close"
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
	if h.Kind < Data || h.Kind > Close {
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

// Redirect is the private data a session listener rejects a rejoining
// connection with when the session has moved to another node (see
// gowarp's SessionListener.Export): the addresses to dial instead, one
// per path. Big-endian:
//
//	0  magic "gwFR"
//	4  version (1)
//	5  count of addresses, 0 to MaxRedirect (0: moved, ask elsewhere
//	   where to)
//	6  each address: its length (1 to 255), then its bytes (printable
//	   ASCII without space: host:port)
//
// It must fit an MPA reject's private data (MaxRedirectLen bytes).
const (
	redirectMagic  = 0x67774652 // "gwFR"
	MaxRedirect    = 255
	MaxRedirectLen = 508
)

// AppendRedirect appends the redirect to addrs to b; ErrField if there
// are too many, an address is empty, too long or not printable ASCII, or
// the whole is longer than MaxRedirectLen.
func AppendRedirect(b []byte, addrs []string) ([]byte, error) {
	if len(addrs) > MaxRedirect {
		return b, fmt.Errorf("%w: %d redirect addresses, want at most %d", ErrField, len(addrs), MaxRedirect)
	}
	start := len(b)
	b = binary.BigEndian.AppendUint32(b, redirectMagic)
	b = append(b, version, byte(len(addrs)))
	for _, a := range addrs {
		if !printable(a) {
			return b[:start], fmt.Errorf("%w: redirect address %q", ErrField, a)
		}
		b = append(append(b, byte(len(a))), a...)
	}
	if len(b)-start > MaxRedirectLen {
		return b[:start], fmt.Errorf("%w: a redirect of %d bytes, at most %d fit", ErrField, len(b)-start, MaxRedirectLen)
	}
	return b, nil
}

func printable(a string) bool {
	if len(a) == 0 || len(a) > 255 {
		return false
	}
	for i := range len(a) {
		if a[i] <= ' ' || a[i] > '~' {
			return false
		}
	}
	return true
}

// ParseRedirect decodes a redirect at the start of b and returns its
// addresses and the bytes it took.
func ParseRedirect(b []byte) ([]string, int, error) {
	if len(b) < 6 {
		return nil, 0, ErrShort
	}
	if binary.BigEndian.Uint32(b) != redirectMagic {
		return nil, 0, ErrMagic
	}
	if b[4] != version {
		return nil, 0, ErrVersion
	}
	n := int(b[5])
	addrs := make([]string, 0, n)
	off := 6
	for range n {
		if off >= len(b) {
			return nil, 0, ErrShort
		}
		l := int(b[off])
		if off+1+l > len(b) {
			return nil, 0, ErrShort
		}
		a := string(b[off+1 : off+1+l])
		if !printable(a) {
			return nil, 0, fmt.Errorf("%w: redirect address %q", ErrField, a)
		}
		addrs = append(addrs, a)
		off += 1 + l
	}
	return addrs, off, nil
}

// Handoff is the state of a node's sessions that moves with their STag
// table to another node (gowarp's SessionListener.Export): it travels in
// the export stream in front of the table. Big-endian:
//
//	0  magic "gwSX"
//	4  version (1)
//	5  reserved, zero (3 bytes)
//	8  length of the whole block, this prefix and the CRC included
//	12 count of sessions
//	16 anchor: an STag of the listening protection domain's, 0 if it
//	   had no region (the importer finds the imported PD by it)
//	20 count × SessionStateLen bytes, each:
//	   0  session id
//	   8  delivered: the peer's messages delivered to the application
//	   16 sent: this side's messages sent, every one acknowledged
//	   24 the peer's max message
//	   28 this side's max message
//	   32 the peer's window
//	   34 this side's window
//	   36 reserved, zero (4 bytes)
//	end CRC32c (Castagnoli) of everything before it
type Handoff struct {
	Anchor   uint32
	Sessions []SessionState
}

// SessionState is one session's part of a Handoff.
type SessionState struct {
	ID                    uint64
	Delivered, Sent       uint64
	PeerMax, OwnMax       uint32
	PeerWindow, OwnWindow uint16
}

// Sizes of a Handoff's parts.
const (
	HandoffPrefixLen = 12
	SessionStateLen  = 40
	handoffFixed     = 20 + 4     // before the sessions, and the CRC
	handoffMagic     = 0x67775358 // "gwSX"
	// MaxHandoffSessions bounds a Handoff's count, so that a reader
	// never allocates more than 40 MiB for one.
	MaxHandoffSessions = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Append appends h's encoding to b.
func (h Handoff) Append(b []byte) []byte {
	start := len(b)
	b = binary.BigEndian.AppendUint32(b, handoffMagic)
	b = append(b, version, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(handoffFixed+SessionStateLen*len(h.Sessions)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(h.Sessions)))
	b = binary.BigEndian.AppendUint32(b, h.Anchor)
	for _, s := range h.Sessions {
		b = binary.BigEndian.AppendUint64(b, s.ID)
		b = binary.BigEndian.AppendUint64(b, s.Delivered)
		b = binary.BigEndian.AppendUint64(b, s.Sent)
		b = binary.BigEndian.AppendUint32(b, s.PeerMax)
		b = binary.BigEndian.AppendUint32(b, s.OwnMax)
		b = binary.BigEndian.AppendUint16(b, s.PeerWindow)
		b = binary.BigEndian.AppendUint16(b, s.OwnWindow)
		b = append(b, 0, 0, 0, 0)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// HandoffLen returns the length of the whole Handoff that the
// HandoffPrefixLen bytes of prefix begin, so a reader knows how much to
// read: ErrMagic, ErrVersion or ErrField for a prefix that is not one.
func HandoffLen(prefix []byte) (int, error) {
	if len(prefix) < HandoffPrefixLen {
		return 0, ErrShort
	}
	if binary.BigEndian.Uint32(prefix) != handoffMagic {
		return 0, ErrMagic
	}
	if prefix[4] != version {
		return 0, ErrVersion
	}
	if prefix[5]|prefix[6]|prefix[7] != 0 {
		return 0, ErrField
	}
	n := binary.BigEndian.Uint32(prefix[8:])
	if n < handoffFixed || (n-handoffFixed)%SessionStateLen != 0 || (n-handoffFixed)/SessionStateLen > MaxHandoffSessions {
		return 0, fmt.Errorf("%w: a session hand-off of %d bytes", ErrField, n)
	}
	return int(n), nil
}

// ParseHandoff decodes a whole Handoff from b (exactly HandoffLen bytes
// of it) and returns it and the bytes it took.
func ParseHandoff(b []byte) (Handoff, int, error) {
	n, err := HandoffLen(b)
	if err != nil {
		return Handoff{}, 0, err
	}
	if len(b) < n {
		return Handoff{}, 0, ErrShort
	}
	if crc32.Checksum(b[:n-4], castagnoli) != binary.BigEndian.Uint32(b[n-4:]) {
		return Handoff{}, 0, fmt.Errorf("%w: session hand-off CRC", ErrField)
	}
	count := binary.BigEndian.Uint32(b[12:])
	if int(count) != (n-handoffFixed)/SessionStateLen {
		return Handoff{}, 0, fmt.Errorf("%w: %d sessions in a hand-off of %d bytes", ErrField, count, n)
	}
	h := Handoff{Anchor: binary.BigEndian.Uint32(b[16:]), Sessions: make([]SessionState, count)}
	seen := make(map[uint64]bool, count)
	for i := range h.Sessions {
		p := b[20+i*SessionStateLen:]
		s := SessionState{ID: binary.BigEndian.Uint64(p), Delivered: binary.BigEndian.Uint64(p[8:]), Sent: binary.BigEndian.Uint64(p[16:]),
			PeerMax: binary.BigEndian.Uint32(p[24:]), OwnMax: binary.BigEndian.Uint32(p[28:]),
			PeerWindow: binary.BigEndian.Uint16(p[32:]), OwnWindow: binary.BigEndian.Uint16(p[34:])}
		if s.PeerMax == 0 || s.OwnMax == 0 || s.PeerWindow == 0 || s.OwnWindow == 0 || p[36]|p[37]|p[38]|p[39] != 0 || seen[s.ID] {
			return Handoff{}, 0, fmt.Errorf("%w: session %d of the hand-off", ErrField, i)
		}
		seen[s.ID] = true
		h.Sessions[i] = s
	}
	return h, n, nil
}
