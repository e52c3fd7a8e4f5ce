package perf

import (
	"bytes"
	"testing"
)

// FuzzControl feeds the decoders of gowarp perf's control messages (the
// MPA private data of request and reply, and the plain-TCP tests' header)
// bytes from anywhere: they must never panic, and what they accept must
// encode back to the bytes they read.
func FuzzControl(f *testing.F) {
	req := request{test: WriteBW, size: 65536, depth: 16, maxFPDU: 1448, bufSTag: 0x123456ab,
		bufAddr: 0x1000, bufLen: 1 << 20, creditSTag: 7, creditAddr: 64}
	rep := reply{bufSTag: 0xabcdef01, bufLen: 4096, bufAddr: 1 << 40, recvDepth: 64, creditBatch: 8}
	f.Add(req.append(nil))
	f.Add(rep.append(nil))
	f.Add(appendTCPHeader(nil, TCPBW, 65536))
	f.Add(rejection("busy"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := parseRequest(b); err == nil {
			if got := r.append(nil); !sameBut(got, b[:requestLen], 7) {
				t.Errorf("request %x re-encodes as %x", b[:requestLen], got)
			}
		}
		if r, err := parseReply(b); err == nil {
			if got := r.append(nil); !sameBut(got, b[:replyLen], 6, 7) {
				t.Errorf("reply %x re-encodes as %x", b[:replyLen], got)
			}
		}
		if test, size, err := parseTCPHeader(b); err == nil {
			if got := appendTCPHeader(nil, test, size); !sameBut(got, b[:tcpHeaderLen], 6, 7) {
				t.Errorf("TCP header %x re-encodes as %x", b[:tcpHeaderLen], got)
			}
		}
		_ = rejectionReason(b)
	})
}

// sameBut reports whether a and b are equal but for the reserved bytes at
// the given offsets, which decoders ignore and encoders zero.
func sameBut(a, b []byte, reserved ...int) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = bytes.Clone(a), bytes.Clone(b)
	for _, i := range reserved {
		a[i], b[i] = 0, 0
	}
	return bytes.Equal(a, b)
}
