package cache

import (
	"bytes"
	"errors"
	"testing"
)

func sampleMsgs() []Msg {
	return []Msg{
		{Op: OpPut, Flags: FlagDurable, ID: 1<<16 | 3, Key: []byte("key"), Value: []byte("value")},
		{Op: OpGet, ID: 9, Key: []byte("k")},
		{Op: OpGet, Flags: FlagInline, ID: 9, Gen: 77, Size: 3, Value: []byte("abc")},
		{Op: OpAlloc, ID: 2, Key: []byte("big"), Size: 1 << 20},
		{Op: OpLookup, ID: 4, Gen: 5, Size: 1 << 20, Addrs: []Addr{{STag: 0x12345601, Off: 0x7f0000001000, Len: 1 << 19}, {STag: 2, Off: 64, Len: 1 << 19}}},
		{Op: OpLookup, ID: 4, Gen: 5, Size: 3, Value: appendSum(nil, 0xdeadbeef), Addrs: []Addr{{STag: 1, Off: 64, Len: 3}}},
		{Op: OpCommit, ID: 5, Gen: 6, Key: []byte("big")},
		{Op: OpDelete, ID: 6, Status: StatusNotFound, Value: []byte("cache: key not found")},
		{Op: OpList, ID: 7, Flags: FlagMore, Keys: [][]byte{[]byte("a"), []byte("b"), {}}},
		{Op: OpStats, ID: 8, Value: (&Stats{Keys: 1, Puts: 2}).appendTo(nil)},
	}
}

// TestMsgRoundTrip: every op encodes and decodes to itself, and a decode
// in a loop reuses the lists it was given.
func TestMsgRoundTrip(t *testing.T) {
	var m Msg
	for _, want := range sampleMsgs() {
		b := want.Append(nil)
		if len(b) != want.EncodedLen() {
			t.Fatalf("%s: %d bytes, EncodedLen %d", want.Op, len(b), want.EncodedLen())
		}
		if err := Decode(b, &m); err != nil {
			t.Fatalf("%s: %v", want.Op, err)
		}
		if got := m.Append(nil); !bytes.Equal(got, b) {
			t.Fatalf("%s: re-encoded differs:\n%x\n%x", want.Op, got, b)
		}
	}
	b := sampleMsgs()[4].Append(nil)
	if n := testing.AllocsPerRun(100, func() { _ = Decode(b, &m) }); n != 0 {
		t.Errorf("Decode allocates %.1f times", n)
	}
}

// TestMsgMalformed: each kind of damage is refused with a clear error.
func TestMsgMalformed(t *testing.T) {
	good := sampleMsgs()[4].Append(nil)
	set := func(i int, v byte) []byte { b := bytes.Clone(good); b[i] = v; return b }
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"short", good[:10], ErrMalformed},
		{"version", set(0, 2), ErrVersion},
		{"op 0", set(1, 0), ErrMalformed},
		{"op unknown", set(1, 200), ErrMalformed},
		{"status unknown", set(3, 99), ErrMalformed},
		{"truncated", good[:len(good)-3], ErrMalformed},
		{"trailing", append(bytes.Clone(good), 0), ErrMalformed},
		{"key too long", (&Msg{Op: OpGet, Key: make([]byte, MaxKey+1)}).Append(nil), ErrMalformed},
		{"value length past end", set(headerLen+2+3, 0xff), ErrMalformed},
	}
	for _, c := range cases {
		var m Msg
		if err := Decode(c.b, &m); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// TestStatsVersions: a stats block of the first version (an older
// server's) decodes with the fields added since at zero, a newer one's
// with the fields this version knows, and a block shorter than the first
// version is refused.
func TestStatsVersions(t *testing.T) {
	full := Stats{Keys: 1, DurablePuts: 2, IndexBuckets: 3, IndexReads: 4, IndexMisses: 5}
	b := full.appendTo(nil)
	if got, err := decodeStats(b); err != nil || got != full {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	if got, err := decodeStats(b[:8*statsFields]); err != nil || got != (Stats{Keys: 1, DurablePuts: 2}) {
		t.Errorf("first version: %+v, %v", got, err)
	}
	if got, err := decodeStats(append(b, make([]byte, 16)...)); err != nil || got != full {
		t.Errorf("newer version: %+v, %v", got, err)
	}
	if _, err := decodeStats(b[:8*statsFields-1]); !errors.Is(err, ErrMalformed) {
		t.Errorf("short: %v", err)
	}
}

// FuzzDecode: Decode never panics, and what it accepts encodes back to
// the same bytes.
func FuzzDecode(f *testing.F) {
	for _, m := range sampleMsgs() {
		f.Add(m.Append(nil))
	}
	// A stats reply of a server before the index's fields.
	f.Add((&Msg{Op: OpStats, ID: 8, Value: (&Stats{Keys: 1, Puts: 2}).appendTo(nil)[:8*statsFields]}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Msg
		if err := Decode(b, &m); err != nil {
			return
		}
		if got := m.Append(nil); !bytes.Equal(got, b) {
			t.Fatalf("decoded %x, re-encoded %x", b, got)
		}
		switch m.Op {
		case OpStats:
			_, _ = decodeStats(m.Value)
		case OpLookup:
			if sum, ok := parseSum(m.Value); ok != (len(m.Value) == 4) || ok && !bytes.Equal(appendSum(nil, sum), m.Value) {
				t.Fatalf("sum %x: %x, %v", m.Value, sum, ok)
			}
		}
	})
}

// FuzzRecord: the index's record decoder never panics.
func FuzzRecord(f *testing.F) {
	f.Add((&record{gen: 1, size: 10, ext: []extent{{1, 64, 10}}}).encode())
	f.Add((&record{gen: 2, size: 0, ext: []extent{{0, 0, 0}}}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err == nil && !bytes.Equal(r.encode(), b) {
			t.Fatalf("record %x re-encodes differently", b)
		}
	})
}
