package failover

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []Header{{Kind: Data, Session: 1, Seq: 1}, {Kind: Ack, Session: 0xffffffff, Seq: 1<<64 - 1}, {Kind: Ping}, {Kind: Pong, Seq: 7}, {Kind: Close, Session: 5}} {
		b := h.Append(nil)
		if len(b) != HeaderLen {
			t.Fatalf("%+v: %d bytes, want %d", h, len(b), HeaderLen)
		}
		got, n, err := ParseHeader(append(b, 0xaa))
		if err != nil || n != HeaderLen || got != h {
			t.Errorf("%+v: parsed %+v, %d, %v", h, got, n, err)
		}
		var p [HeaderLen]byte
		h.Put(p[:])
		if !bytes.Equal(p[:], b) {
			t.Errorf("Put %x, Append %x", p, b)
		}
	}
}

func TestHeaderBad(t *testing.T) {
	good := Header{Kind: Data, Session: 3, Seq: 9}.Append(nil)
	for _, tc := range []struct {
		name string
		mod  func([]byte) []byte
		want error
	}{
		{"short", func(b []byte) []byte { return b[:HeaderLen-1] }, ErrShort},
		{"empty", func([]byte) []byte { return nil }, ErrShort},
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }, ErrMagic},
		{"version", func(b []byte) []byte { b[2] = 2; return b }, ErrVersion},
		{"kind 0", func(b []byte) []byte { b[3] = 0; return b }, ErrKind},
		{"kind 6", func(b []byte) []byte { b[3] = 6; return b }, ErrKind},
	} {
		if _, _, err := ParseHeader(tc.mod(bytes.Clone(good))); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestHelloRoundTrip(t *testing.T) {
	for _, h := range []Hello{{Window: 1, MaxMessage: 1, Session: 42}, {Flags: Rejoin | Reply, Window: 65535, Session: 1<<64 - 1, MaxMessage: 1 << 30, Path: 7}} {
		b := h.Append([]byte("app"))[3:]
		got, n, err := ParseHello(b)
		if err != nil || n != HelloLen || got != h {
			t.Errorf("%+v: parsed %+v, %d, %v", h, got, n, err)
		}
	}
}

func TestHelloBad(t *testing.T) {
	good := Hello{Window: 16, MaxMessage: 4096, Session: 5}.Append(nil)
	for _, tc := range []struct {
		name string
		mod  func([]byte) []byte
		want error
	}{
		{"short", func(b []byte) []byte { return b[:HelloLen-1] }, ErrShort},
		{"magic", func(b []byte) []byte { b[3] ^= 1; return b }, ErrMagic},
		{"version", func(b []byte) []byte { b[4] = 0; return b }, ErrVersion},
		{"flags", func(b []byte) []byte { b[5] = 0x80; return b }, ErrField},
		{"window 0", func(b []byte) []byte { b[6], b[7] = 0, 0; return b }, ErrField},
		{"max 0", func(b []byte) []byte { copy(b[16:20], []byte{0, 0, 0, 0}); return b }, ErrField},
		{"reserved", func(b []byte) []byte { b[23] = 1; return b }, ErrField},
	} {
		if _, _, err := ParseHello(tc.mod(bytes.Clone(good))); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestHeaderParseAllocs(t *testing.T) {
	b := Header{Kind: Ack, Seq: 5}.Append(nil)
	var p [HeaderLen]byte
	if n := testing.AllocsPerRun(100, func() {
		Header{Kind: Data, Seq: 6}.Put(p[:])
		if _, _, err := ParseHeader(b); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per Put and ParseHeader, want 0", n)
	}
}

// FuzzHeader: any bytes parse or fail without panicking, and what parses
// encodes back to the bytes it came from.
func FuzzHeader(f *testing.F) {
	for _, h := range []Header{{Kind: Data, Session: 1, Seq: 1}, {Kind: Ack, Seq: 99}, {Kind: Ping, Seq: 3}, {Kind: Pong, Session: 0xdeadbeef, Seq: 3}, {Kind: Close, Session: 9}} {
		f.Add(h.Append(nil))
	}
	f.Add([]byte{0x67, 0x46, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := ParseHeader(b)
		if err != nil {
			return
		}
		if !bytes.Equal(h.Append(nil), b[:n]) {
			t.Fatalf("%x parsed as %+v, which encodes differently", b[:n], h)
		}
	})
}

// FuzzHello: as FuzzHeader, for the handshake.
func FuzzHello(f *testing.F) {
	f.Add(Hello{Window: 16, MaxMessage: 65536, Session: 77}.Append(nil))
	f.Add(Hello{Flags: Reply | Rejoin, Window: 1, MaxMessage: 1, Path: 3}.Append(nil))
	f.Add([]byte("gwFS"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := ParseHello(b)
		if err != nil {
			return
		}
		if !bytes.Equal(h.Append(nil), b[:n]) {
			t.Fatalf("%x parsed as %+v, which encodes differently", b[:n], h)
		}
	})
}

func TestRedirect(t *testing.T) {
	addrs := []string{"10.214.1.1:7000", "[fd00::1]:7001"}
	b, err := AppendRedirect([]byte("x"), addrs)
	if err != nil {
		t.Fatal(err)
	}
	got, n, err := ParseRedirect(b[1:])
	if err != nil || n != len(b)-1 || !slices.Equal(got, addrs) {
		t.Fatalf("parsed %q, %d, %v", got, n, err)
	}
	if b, err := AppendRedirect(nil, nil); err != nil || len(b) != 6 {
		t.Errorf("a redirect to nowhere: %x, %v", b, err)
	} else if got, n, err := ParseRedirect(b); err != nil || n != 6 || len(got) != 0 {
		t.Errorf("a redirect to nowhere parsed as %q, %d, %v", got, n, err)
	}
	for _, bad := range [][]string{{""}, {"a b:1"}, {"\x7f"}, {strings.Repeat("a", 256)}, slices.Repeat([]string{strings.Repeat("a", 100)}, 6)} {
		if _, err := AppendRedirect(nil, bad); !errors.Is(err, ErrField) {
			t.Errorf("AppendRedirect(%d addresses): %v, want ErrField", len(bad), err)
		}
	}
	for i := range len(b) - 1 {
		if _, _, err := ParseRedirect(b[1 : 1+i]); err == nil {
			t.Errorf("redirect cut to %d bytes parsed", i)
		}
	}
}

func TestHandoff(t *testing.T) {
	h := Handoff{Anchor: 0x123456, Sessions: []SessionState{
		{ID: 1, Delivered: 7, Sent: 9, PeerMax: 4096, OwnMax: 65536, PeerWindow: 16, OwnWindow: 32},
		{ID: 1<<64 - 1, PeerMax: 1, OwnMax: 1, PeerWindow: 1, OwnWindow: 1},
	}}
	b := h.Append(nil)
	if n, err := HandoffLen(b); err != nil || n != len(b) {
		t.Fatalf("HandoffLen: %d, %v, want %d", n, err, len(b))
	}
	got, n, err := ParseHandoff(b)
	if err != nil || n != len(b) || got.Anchor != h.Anchor || !slices.Equal(got.Sessions, h.Sessions) {
		t.Fatalf("parsed %+v, %d, %v", got, n, err)
	}
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x10
		if _, _, err := ParseHandoff(c); err == nil {
			t.Errorf("a hand-off with byte %d flipped parsed", i)
		}
		if _, _, err := ParseHandoff(b[:i]); err == nil {
			t.Errorf("a hand-off cut to %d bytes parsed", i)
		}
	}
	dup := Handoff{Sessions: []SessionState{h.Sessions[0], h.Sessions[0]}}.Append(nil)
	if _, _, err := ParseHandoff(dup); !errors.Is(err, ErrField) {
		t.Errorf("a hand-off naming a session twice: %v, want ErrField", err)
	}
}

// FuzzRedirect: a redirect that parses encodes back to the same bytes.
func FuzzRedirect(f *testing.F) {
	b, _ := AppendRedirect(nil, []string{"10.0.0.1:7000", "h:1"})
	f.Add(b)
	f.Add([]byte("gwFR\x01\x01\x03a:1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		addrs, n, err := ParseRedirect(b)
		if err != nil {
			return
		}
		e, err := AppendRedirect(nil, addrs)
		if err != nil && n <= MaxRedirectLen {
			t.Fatalf("%x parsed as %q, which does not encode: %v", b[:n], addrs, err)
		}
		if err == nil && !bytes.Equal(e, b[:n]) {
			t.Fatalf("%x parsed as %q, which encodes differently", b[:n], addrs)
		}
	})
}

// FuzzHandoff: a hand-off that parses encodes back to the same bytes.
func FuzzHandoff(f *testing.F) {
	f.Add(Handoff{Anchor: 5, Sessions: []SessionState{{ID: 3, Delivered: 1, Sent: 2, PeerMax: 9, OwnMax: 9, PeerWindow: 4, OwnWindow: 4}}}.Append(nil))
	f.Add(Handoff{}.Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := ParseHandoff(b)
		if err != nil {
			return
		}
		if !bytes.Equal(h.Append(nil), b[:n]) {
			t.Fatalf("%x parsed as %+v, which encodes differently", b[:n], h)
		}
	})
}
