package rping

import (
	"bytes"
	"testing"
)

// FuzzParseInfo: rping's buffer advertisement arrives from the peer; any
// bytes give an advertisement or ErrBadMessage, never a panic, and an
// accepted one encodes back to the same bytes.
func FuzzParseInfo(f *testing.F) {
	f.Add(Info{Buf: 0x7f0000001000, RKey: 0x12345678, Size: 64}.Append(nil))
	f.Add([]byte("rdma-ping-0: ABC"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		i, err := ParseInfo(b)
		if err != nil {
			return
		}
		if got := i.Append(nil); !bytes.Equal(got, b) {
			t.Errorf("advertisement %x re-encodes as %x", b, got)
		}
	})
}
