package cache

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestReadChecks: a read of a whole piece returns its bytes only if they
// match its header: bytes changed in the block under the same address
// (the header's generation and length still the entry's), another
// generation, or a piece still pending fail with ErrStale, for a small
// value (one Read of header and bytes) and a larger one (a Read of the
// bytes, then of the header). Restored, the piece reads again.
func TestReadChecks(t *testing.T) {
	addr, srv := serveT(t, ServerOptions{})
	dev := gowarp.Open(gowarp.WithLogger(discard))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, ClientOptions{Device: dev, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, n := range []int{4 << 10, 64 << 10} {
		v := bytes.Repeat([]byte{byte(n >> 10)}, n)
		v[n/2] = 7
		key := "v" + string(rune('a'+n>>12))
		if err := c.Put(ctx, key, v, PutOptions{}); err != nil {
			t.Fatal(err)
		}
		e, err := c.Lookup(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Addrs) != 1 {
			t.Fatalf("%d bytes in %d pieces", n, len(e.Addrs))
		}
		a := e.Addrs[0]
		st := srv.st
		st.mu.Lock()
		p := st.blocks[a.Off>>32-1].mr.Bytes()[a.Off&0xffffffff:][:HeaderLen+n]
		st.mu.Unlock()
		dst, err := c.PD().Register(make([]byte, n), gowarp.LocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		read := func() error {
			clear(dst.Bytes())
			got, err := c.ReadEntry(ctx, e, dst, 0, n, 0)
			if err == nil && (got != n || !bytes.Equal(dst.Bytes(), v)) {
				t.Fatalf("%d bytes: read %d bytes, not the value's", n, got)
			}
			return err
		}
		if err := read(); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		hdr := append([]byte(nil), p[:HeaderLen]...)
		h, _ := parseHeader(hdr)
		for _, tc := range []struct {
			name   string
			change func()
		}{
			{"a byte changed", func() { p[HeaderLen+n/2] ^= 1 }},
			{"other bytes", func() { copy(p[HeaderLen:], bytes.Repeat([]byte{9}, n)) }},
			{"another generation", func() { g := h; g.Gen++; g.put(p) }},
			{"pending", func() { g := h; g.Flags |= hdrPending; g.put(p) }},
			{"another length", func() { g := h; g.Len--; g.put(p) }},
		} {
			st.mu.Lock()
			tc.change()
			st.mu.Unlock()
			if err := read(); !errors.Is(err, ErrStale) {
				t.Fatalf("%d bytes, %s: %v, want ErrStale", n, tc.name, err)
			}
			st.mu.Lock()
			copy(p, hdr)
			copy(p[HeaderLen:], v)
			st.mu.Unlock()
			if err := read(); err != nil {
				t.Fatalf("%d bytes, restored after %s: %v", n, tc.name, err)
			}
		}
		dst.Deregister()
	}
}
