package perftest

import (
	"bytes"
	"testing"
)

// FuzzMessages feeds perftest's control-message decoders (version,
// pingpong_dest, the bandwidth report) bytes from anywhere: they must
// never panic, and a pingpong_dest they accept encodes back to the same
// bytes but for its padding.
func FuzzMessages(f *testing.F) {
	d := Dest{LID: 1, OutReads: 16, QPN: 0x11, PSN: 0x5eed, RKey: 0xabcdef01, VAddr: 0x7f0000001000, SRQN: 0, GIDIndex: 0}
	f.Add(d.Append(nil))
	f.Add(AppendVersion(nil, "6.10"))
	r := Report{Size: 65536, Iters: 1000, BWPeak: 2400.5, BWAvg: 2300.25, MsgRateMpps: 0.036}
	m := r.reportMsgs()
	f.Add(bytes.Join(m[:], nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = ParseVersion(b)
		_ = VersionAtLeast(ParseVersion(b), 5.0)
		if d, err := ParseDest(b); err == nil {
			got := d.Append(nil)
			pad := [4]byte{}
			want := append(append(bytes.Clone(b[:20]), pad[:]...), b[24:]...)
			if !bytes.Equal(got, want) {
				t.Errorf("pingpong_dest %x re-encodes as %x", b, got)
			}
		}
		if len(b) >= 40 {
			var m [5][]byte
			for i := range m {
				m[i] = b[8*i : 8*i+8]
			}
			if r, err := parseReport(m); err == nil {
				_ = r.Plausible(65536)
				got := r.reportMsgs()
				if !bytes.Equal(bytes.Join(got[:], nil), b[:40]) {
					t.Errorf("report %x re-encodes as %x", b[:40], bytes.Join(got[:], nil))
				}
			}
		}
	})
}
