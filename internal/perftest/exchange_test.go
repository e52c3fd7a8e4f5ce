package perftest

import (
	"bytes"
	"testing"
)

// TestScriptMatchesCaptures checks each test's script against siw's
// perftest talking to itself: every control message of both sides, in
// order, has the form of its step, and the data connection comes where
// the script has it (the second connection of the capture starts between
// the two zero dests; the captures hold no timing, so this is checked by
// the zero dests' positions).
func TestScriptMatchesCaptures(t *testing.T) {
	for _, test := range Tests {
		t.Run(string(test), func(t *testing.T) {
			cp := loadCapture(t, test)
			var msgs []Step
			for _, st := range Script(test) {
				if st.Message() {
					msgs = append(msgs, st)
				}
			}
			if len(cp.client) != len(msgs) || len(cp.server) != len(msgs) {
				t.Fatalf("script has %d messages; siw's client sent %d, its server %d", len(msgs), len(cp.client), len(cp.server))
			}
			for i, st := range msgs {
				for side, m := range map[string][]byte{"client": cp.client[i], "server": cp.server[i]} {
					if err := CheckMessage(st, m); err != nil {
						t.Errorf("message %d (%v) from siw's %s: %v", i, st, side, err)
					}
					if st == StepDest && bytes.Equal(m, make([]byte, DestLen)) {
						t.Errorf("message %d from siw's %s is a zero dest, the script says dest", i, side)
					}
				}
			}
		})
	}
}

// TestScripts pins the shape of each exchange: where the data connection,
// the receives and the traffic come, and how many messages surround them.
func TestScripts(t *testing.T) {
	pre := "version cycle-buffer cache-line MTU zero-dest data-connection zero-dest "
	for _, c := range []struct {
		test Test
		want string
	}{
		{WriteBW, pre + "dest dest dest traffic dest report-field report-field report-field report-field report-field dest"},
		{ReadBW, pre + "dest dest dest traffic dest report-field report-field report-field report-field report-field dest"},
		{SendBW, pre + "dest dest dest post-receives dest traffic dest"},
		{WriteLat, pre + "dest dest dest dest traffic"},
		{ReadLat, pre + "dest dest dest dest traffic dest"},
		{SendLat, pre + "dest dest dest post-receives dest traffic dest"},
	} {
		var b bytes.Buffer
		for i, st := range Script(c.test) {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.Write(bytes.ReplaceAll([]byte(st.String()), []byte(" "), []byte("-")))
		}
		if b.String() != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.test, b.String(), c.want)
		}
	}
	if Script("nope") != nil {
		t.Error("a script for an unknown test")
	}
}

// TestCheckMessage: malformed control messages get an error, never a panic.
func TestCheckMessage(t *testing.T) {
	for _, c := range []struct {
		st  Step
		msg []byte
		ok  bool
	}{
		{StepVersion, AppendVersion(nil, "6.06"), true},
		{StepVersion, []byte("6.06"), false},
		{StepCycle, AppendUint32(nil, 4096), true},
		{StepCycle, AppendUint32(nil, 0), false},
		{StepCycle, []byte{1}, false},
		{StepCacheLine, AppendUint32(nil, 64), true},
		{StepMTU, AppendMTU(nil, "3"), true},
		{StepMTU, []byte("3"), false},
		{StepMTU, nil, false},
		{StepZeroDest, make([]byte, DestLen), true},
		{StepZeroDest, append(make([]byte, DestLen-1), 1), false},
		{StepZeroDest, make([]byte, DestLen+1), false},
		{StepDest, make([]byte, DestLen), true},
		{StepDest, make([]byte, 55), false},
		{StepReport, make([]byte, 8), true},
		{StepReport, make([]byte, 4), false},
		{ActTraffic, nil, false},
	} {
		if err := CheckMessage(c.st, c.msg); (err == nil) != c.ok {
			t.Errorf("CheckMessage(%v, % x) = %v", c.st, c.msg, err)
		}
	}
}
