package rpc

import (
	"bytes"
	"errors"
	"testing"
)

func sampleCall() []byte {
	b := appendCallHeader(nil, 0x10002, 500, "kv.Get", []Handle{{STag: 0x1234, Writable: true, Addr: 4096, Len: 100, Session: 7, Call: 0x10002}}, 3)
	return append(b, "arg"...)
}

func TestCallRoundTrip(t *testing.T) {
	m, err := parseCall(sampleCall())
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != 0x10002 || m.Timeout != 500 || string(m.Method) != "kv.Get" || m.NRefs != 1 || string(m.Arg) != "arg" {
		t.Fatalf("%+v", m)
	}
	if h := m.Ref(0); h != (Handle{STag: 0x1234, Writable: true, Addr: 4096, Len: 100, Session: 7, Call: 0x10002}) {
		t.Fatalf("handle %+v", h)
	}
	if m.More {
		t.Fatal("more calls in flight, flag not set")
	}
	b := sampleCall()
	setCallFlags(b, callMore)
	if m, err := parseCall(b); err != nil || !m.More {
		t.Fatalf("flag set: %+v %v", m, err)
	}
}

func TestParseCallRejects(t *testing.T) {
	good := sampleCall()
	for name, mut := range map[string]func([]byte) []byte{
		"short":          func(b []byte) []byte { return b[:callHeaderLen-1] },
		"kind":           func(b []byte) []byte { b[0] = kindReply; return b },
		"too many refs":  func(b []byte) []byte { b[1] = MaxRefs + 1; return b },
		"no method":      func(b []byte) []byte { b[2], b[3] = 0, 0; return b },
		"reserved":       func(b []byte) []byte { b[22] = 1; return b },
		"length short":   func(b []byte) []byte { return b[:len(b)-1] },
		"length long":    func(b []byte) []byte { return append(b, 0) },
		"handle flags":   func(b []byte) []byte { b[callHeaderLen+6+7] = 2; return b },
		"arg len beyond": func(b []byte) []byte { b[4] = 0xff; return b },
	} {
		b := mut(bytes.Clone(good))
		if _, err := parseCall(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestReplyRoundTrip(t *testing.T) {
	b := appendReplyHeader(nil, 99, statusError, 3, 4)
	b = append(b, "oops"...)
	r, err := parseReply(b)
	if err != nil || r.ID != 99 || r.Status != statusError || r.Credits != 3 || string(r.Payload) != "oops" {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := parseReply(b[:len(b)-1]); !errors.Is(err, ErrMalformed) {
		t.Fatal(err)
	}
	b[1] = statusMax + 1
	if _, err := parseReply(b); !errors.Is(err, ErrMalformed) {
		t.Fatal(err)
	}
}

// TestParseAllocs: decoding a call or a reply allocates nothing.
func TestParseAllocs(t *testing.T) {
	c, r := sampleCall(), append(appendReplyHeader(nil, 1, 0, 0, 2), "ok"...)
	if n := testing.AllocsPerRun(100, func() {
		m, _ := parseCall(c)
		_ = m.Ref(0)
		parseReply(r)
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// FuzzMessages feeds any bytes to the decoders of calls, replies,
// cancels and handles: they never panic, and what a decoder accepts
// encodes back to the same bytes.
func FuzzMessages(f *testing.F) {
	f.Add(sampleCall())
	f.Add(append(appendReplyHeader(nil, 5, statusOK, 0, 2), "hi"...))
	f.Add(appendCancel(nil, 0x30001))
	f.Add(appendCallHeader(nil, 1, 0, "m", nil, 0))
	f.Add(AppendHandle(nil, Handle{STag: 1, Addr: 1 << 63, Len: 1 << 62}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := parseCall(b); err == nil {
			refs := make([]Handle, m.NRefs)
			for i := range refs {
				refs[i] = m.Ref(i)
			}
			e := appendCallHeader(nil, m.ID, m.Timeout, string(m.Method), refs, len(m.Arg))
			if m.More {
				setCallFlags(e, callMore)
			}
			if e = append(e, m.Arg...); !bytes.Equal(e, b) {
				t.Fatalf("call re-encodes as %x, was %x", e, b)
			}
		}
		if r, err := parseReply(b); err == nil {
			e := append(appendReplyHeader(nil, r.ID, r.Status, r.Credits, len(r.Payload)), r.Payload...)
			if !bytes.Equal(e, b) {
				t.Fatalf("reply re-encodes as %x, was %x", e, b)
			}
		}
		if id, err := parseCancel(b); err == nil && !bytes.Equal(appendCancel(nil, id), b) {
			t.Fatalf("cancel re-encodes differently: %x", b)
		}
		if h, n, err := ParseHandle(b); err == nil && !bytes.Equal(AppendHandle(nil, h), b[:n]) {
			t.Fatalf("handle re-encodes differently: %x", b[:n])
		}
	})
}
