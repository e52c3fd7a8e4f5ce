package wire

import (
	"encoding/hex"
	"strings"
	"testing"
)

// unhex decodes a hex string written for people: spaces, newlines and
// quoted ASCII ("MPA ID Req Frame") may be mixed with hex digits.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	var out []byte
	for len(s) > 0 {
		if s[0] == '"' {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				t.Fatalf("unhex: unterminated string in %q", s)
			}
			out = append(out, s[1:1+end]...)
			s = s[end+2:]
			continue
		}
		i := strings.IndexByte(s, '"')
		if i < 0 {
			i = len(s)
		}
		h := strings.Join(strings.Fields(s[:i]), "")
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatalf("unhex %q: %v", h, err)
		}
		out = append(out, b...)
		s = s[i:]
	}
	return out
}

// pattern returns n bytes of a fixed, non-repeating-looking pattern.
func pattern(n int) []byte {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}
