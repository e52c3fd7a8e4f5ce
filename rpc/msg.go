package rpc

import (
	"encoding/binary"
	"fmt"
)

// Message kinds: the first byte of every message.
const (
	kindCall   = 1 // client → server: a call
	kindReply  = 2 // server → client: the answer to a call
	kindCancel = 3 // client → server: the caller gave up on a call
)

// Reply statuses.
const (
	statusOK            = 0
	statusError         = 1 // the handler returned an error; its message follows
	statusUnknownMethod = 2
	statusBadCall       = 3 // the call message was malformed
	statusBadHandle     = 4 // a handle was refused (forged, stale, out of range)
	statusCanceled      = 5 // the handler saw its context end
	statusTooLarge      = 6 // the reply did not fit in a message
	statusInternal      = 7 // the handler panicked
	statusDeadline      = 8 // the handler saw the call's deadline pass
	statusMax           = 8
)

const (
	callHeaderLen  = 24
	replyHeaderLen = 16
	cancelLen      = 16
	handleLen      = 40

	// callMore, in a call's flags word, says the client had other calls
	// in flight when it sent this one: more are likely to follow at once,
	// so the server may gather its replies (see session.flusher).
	callMore = 1

	// MaxRefs is the most handles one call may carry.
	MaxRefs = 8
	// maxMethod bounds a method name.
	maxMethod = 255
)

// Handle is the wire form of a reference to a span of the client's heap:
// the STag of a region registered for this call alone, the tagged offset
// and length of the span, and the session and call it was granted for.
type Handle struct {
	STag     uint32
	Writable bool
	Addr     uint64
	Len      uint64
	Session  uint64
	Call     uint64
}

// AppendHandle appends h's 40-byte wire form to b.
func AppendHandle(b []byte, h Handle) []byte {
	var flags uint32
	if h.Writable {
		flags = 1
	}
	b = binary.BigEndian.AppendUint32(b, h.STag)
	b = binary.BigEndian.AppendUint32(b, flags)
	b = binary.BigEndian.AppendUint64(b, h.Addr)
	b = binary.BigEndian.AppendUint64(b, h.Len)
	b = binary.BigEndian.AppendUint64(b, h.Session)
	return binary.BigEndian.AppendUint64(b, h.Call)
}

// ParseHandle decodes a handle from the front of b.
func ParseHandle(b []byte) (Handle, int, error) {
	if len(b) < handleLen {
		return Handle{}, 0, fmt.Errorf("%w: handle of %d bytes, want %d", ErrMalformed, len(b), handleLen)
	}
	flags := binary.BigEndian.Uint32(b[4:])
	if flags&^1 != 0 {
		return Handle{}, 0, fmt.Errorf("%w: handle flags %#x", ErrMalformed, flags)
	}
	h := Handle{
		STag:     binary.BigEndian.Uint32(b),
		Writable: flags&1 != 0,
		Addr:     binary.BigEndian.Uint64(b[8:]),
		Len:      binary.BigEndian.Uint64(b[16:]),
		Session:  binary.BigEndian.Uint64(b[24:]),
		Call:     binary.BigEndian.Uint64(b[32:]),
	}
	if h.Addr+h.Len < h.Addr {
		return Handle{}, 0, fmt.Errorf("%w: handle at %#x of %d bytes wraps", ErrMalformed, h.Addr, h.Len)
	}
	return h, handleLen, nil
}

// callMsg is a decoded call. Method, refs and Arg are sub-slices of the
// message.
type callMsg struct {
	ID      uint64
	Timeout uint32 // µs the caller will still wait, 0 for no deadline
	More    bool   // the callMore flag
	Method  []byte
	refs    []byte // NRefs handles of handleLen bytes
	NRefs   int
	Arg     []byte
}

// Ref returns the i-th handle.
func (c *callMsg) Ref(i int) Handle {
	h, _, _ := ParseHandle(c.refs[i*handleLen:]) // checked by parseCall
	return h
}

// callLen is the size of a call message.
func callLen(method string, nrefs, arg int) int {
	return callHeaderLen + len(method) + nrefs*handleLen + arg
}

// appendCallHeader appends a call's header, method and handles; the
// argument follows.
func appendCallHeader(b []byte, id uint64, timeout uint32, method string, refs []Handle, arg int) []byte {
	b = append(b, kindCall, byte(len(refs)))
	b = binary.BigEndian.AppendUint16(b, uint16(len(method)))
	b = binary.BigEndian.AppendUint32(b, uint32(arg))
	b = binary.BigEndian.AppendUint64(b, id)
	b = binary.BigEndian.AppendUint32(b, timeout)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = append(b, method...)
	for _, h := range refs {
		b = AppendHandle(b, h)
	}
	return b
}

// setCallFlags sets the flags word of the call message m.
func setCallFlags(m []byte, flags uint32) { binary.BigEndian.PutUint32(m[20:], flags) }

// parseCall decodes a call message; it checks every length before it
// reads and the whole message is accounted for.
func parseCall(b []byte) (callMsg, error) {
	var c callMsg
	if len(b) < callHeaderLen {
		return c, fmt.Errorf("%w: call of %d bytes", ErrMalformed, len(b))
	}
	if b[0] != kindCall {
		return c, fmt.Errorf("%w: kind %d is not a call", ErrMalformed, b[0])
	}
	c.NRefs = int(b[1])
	ml := int(binary.BigEndian.Uint16(b[2:]))
	al := uint64(binary.BigEndian.Uint32(b[4:]))
	c.ID = binary.BigEndian.Uint64(b[8:])
	c.Timeout = binary.BigEndian.Uint32(b[16:])
	flags := binary.BigEndian.Uint32(b[20:])
	if flags&^callMore != 0 {
		return c, fmt.Errorf("%w: call flags %#x", ErrMalformed, flags)
	}
	c.More = flags&callMore != 0
	if c.NRefs > MaxRefs {
		return c, fmt.Errorf("%w: %d handles, at most %d", ErrMalformed, c.NRefs, MaxRefs)
	}
	if ml == 0 || ml > maxMethod {
		return c, fmt.Errorf("%w: method name of %d bytes", ErrMalformed, ml)
	}
	want := uint64(callHeaderLen) + uint64(ml) + uint64(c.NRefs)*handleLen + al
	if uint64(len(b)) != want {
		return c, fmt.Errorf("%w: call of %d bytes, header says %d", ErrMalformed, len(b), want)
	}
	p := callHeaderLen
	c.Method = b[p : p+ml : p+ml]
	p += ml
	c.refs = b[p : p+c.NRefs*handleLen]
	for i := range c.NRefs {
		if _, _, err := ParseHandle(c.refs[i*handleLen:]); err != nil {
			return c, err
		}
	}
	p += c.NRefs * handleLen
	c.Arg = b[p:len(b):len(b)]
	return c, nil
}

// replyMsg is a decoded reply; Payload (the result, or an error's
// message) is a sub-slice of the message.
type replyMsg struct {
	ID      uint64
	Status  uint8
	Credits uint16 // receive buffers the server reposted for cancels
	Payload []byte
}

func appendReplyHeader(b []byte, id uint64, status uint8, credits uint16, n int) []byte {
	b = append(b, kindReply, status)
	b = binary.BigEndian.AppendUint16(b, credits)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	return binary.BigEndian.AppendUint64(b, id)
}

func parseReply(b []byte) (replyMsg, error) {
	var r replyMsg
	if len(b) < replyHeaderLen {
		return r, fmt.Errorf("%w: reply of %d bytes", ErrMalformed, len(b))
	}
	if b[0] != kindReply {
		return r, fmt.Errorf("%w: kind %d is not a reply", ErrMalformed, b[0])
	}
	r.Status = b[1]
	if r.Status > statusMax {
		return r, fmt.Errorf("%w: reply status %d", ErrMalformed, r.Status)
	}
	r.Credits = binary.BigEndian.Uint16(b[2:])
	n := uint64(binary.BigEndian.Uint32(b[4:]))
	r.ID = binary.BigEndian.Uint64(b[8:])
	if uint64(len(b)) != replyHeaderLen+n {
		return r, fmt.Errorf("%w: reply of %d bytes, header says %d", ErrMalformed, len(b), replyHeaderLen+n)
	}
	r.Payload = b[replyHeaderLen:len(b):len(b)]
	return r, nil
}

func appendCancel(b []byte, id uint64) []byte {
	b = append(b, kindCancel, 0, 0, 0, 0, 0, 0, 0)
	return binary.BigEndian.AppendUint64(b, id)
}

func parseCancel(b []byte) (uint64, error) {
	if len(b) != cancelLen || b[0] != kindCancel {
		return 0, fmt.Errorf("%w: cancel of %d bytes", ErrMalformed, len(b))
	}
	for _, x := range b[1:8] {
		if x != 0 {
			return 0, fmt.Errorf("%w: cancel with reserved bytes set", ErrMalformed)
		}
	}
	return binary.BigEndian.Uint64(b[8:]), nil
}
