package wire

import (
	"errors"
	"testing"
)

var flushSeeds = []Flush{
	{Type: FlushVisibility, STag: 0x8f85c3a7, TO: 0x561db92205b0, Len: 4096},
	{Type: FlushPersistence, STag: 0x8f85c3a7, TO: 0x561db92205b0, Len: 1 << 20},
	{Type: FlushPersistence, STag: 0x00012301}, // whole region
	{Type: FlushVisibility, STag: 0xffffffff, TO: ^uint64(0), Len: ^uint64(0)},
}

// TestFlushRoundTrip: a flush encodes as a zero-length Read Request and
// decodes back; RTRs and other Reads are not flushes.
func TestFlushRoundTrip(t *testing.T) {
	for _, f := range flushSeeds {
		rr := f.ReadRequest()
		if rr.Size != 0 {
			t.Fatalf("%+v: Read Request of size %d", f, rr.Size)
		}
		b := rr.Append(nil)
		g, n, err := ParseFlush(b)
		if err != nil || n != ReadRequestLen || g != f {
			t.Fatalf("ParseFlush(%x) = %+v, %d, %v; want %+v", b, g, n, err, f)
		}
	}
	for _, rr := range []ReadRequest{
		{SourceSTag: 1}, // gowarp's and siw's RTR
		{SinkSTag: 0x12345600, Size: 0, SourceSTag: 0x6500}, // an ordinary zero-length Read
		{SinkSTag: FlushKey, Size: 1},                       // has a size
		{SinkSTag: FlushKey | 2},                            // not a placement type
		{SinkSTag: 0x100 | FlushKey},                        // index not 0
	} {
		if _, _, err := ParseFlush(rr.Append(nil)); !errors.Is(err, ErrNotFlush) {
			t.Errorf("%+v: err %v, want ErrNotFlush", rr, err)
		}
	}
	if _, _, err := ParseFlush(make([]byte, ReadRequestLen-1)); !errors.Is(err, ErrULPDUTooShort) {
		t.Errorf("short body: err %v", err)
	}
}

func FuzzParseFlush(f *testing.F) {
	for _, fl := range flushSeeds {
		b := fl.ReadRequest()
		f.Add(b.Append(nil))
	}
	rtr := ReadRequest{SourceSTag: 1}
	f.Add(rtr.Append(nil))
	f.Add([]byte{0, 0, 0, FlushKey})
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, n, err := ParseFlush(b)
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with n=%d", err, n)
			}
			return
		}
		if n != ReadRequestLen {
			t.Fatalf("n=%d", n)
		}
		rr := fl.ReadRequest()
		if got := rr.Append(nil); string(got) != string(b[:n]) {
			t.Fatalf("re-encoded %x, was %x", got, b[:n])
		}
	})
}
