package perftest

import (
	"bytes"
	"math"
	"slices"
	"strings"
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
	// Bidirectional: a dest before the traffic and the reports straight
	// after it; over all sizes, a dest after each size's traffic too
	// (write_bw.c's RUN_ALL loop, checked against siw's ib_write_bw -b -a).
	reports := " report-field report-field report-field report-field report-field"
	duplex := pre + "dest dest dest dest traffic" + reports + " dest"
	all := pre + "dest dest dest" + strings.Repeat(" dest traffic dest"+reports, 23) + " dest"
	for o, want := range map[*Options]string{
		{Test: WriteBW, Duplex: true}:            duplex,
		{Test: ReadBW, Duplex: true, All: true}:  all,
		{Test: WriteBW, Duplex: true, All: true}: all,
	} {
		var b strings.Builder
		for i, st := range ScriptFor(o) {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(strings.ReplaceAll(st.String(), " ", "-"))
		}
		if b.String() != want {
			t.Errorf("%s -b all %v:\n got %s\nwant %s", o.Test, o.All, b.String(), want)
		}
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

// TestScriptQPs: with several queue pairs, each one's dest goes in turn
// twice, then the first one's, as siw's ib_write_bw -q 2 sent them.
func TestScriptQPs(t *testing.T) {
	dests := 0
	for _, st := range ScriptFor(&Options{Test: WriteBW, QPs: 3}) {
		if st == ActTraffic {
			break
		}
		if st == StepDest {
			dests++
		}
	}
	if dests != 7 {
		t.Errorf("%d dests before the traffic on 3 queue pairs, want 7", dests)
	}
	var got []int
	for k := range 9 {
		got = append(got, qpOfDest(k, 3))
	}
	if want := []int{0, 1, 2, 0, 1, 2, 0, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("queue pairs of the dests %v, want %v", got, want)
	}
	// Both ways at once: the sides meet before the traffic, and the
	// reports follow it at once (siw's ib_write_bw -b).
	var b bytes.Buffer
	for _, st := range ScriptFor(&Options{Test: WriteBW, Duplex: true})[7:] {
		b.WriteString(st.String() + ",")
	}
	if want := "dest,dest,dest,dest,traffic,report field,report field,report field,report field,report field,dest,"; b.String() != want {
		t.Errorf("bidirectional write_bw after the data connection:\n got %s\nwant %s", b.String(), want)
	}
	if !slices.Equal(ScriptFor(&Options{Test: SendLat, QPs: 1}), Script(SendLat)) {
		t.Error("one queue pair's script is not Script's")
	}
}

// TestReportGbits: --report_gbits figures are perftest's Gb/sec, 10^9 bits
// a second, and below 0.1 perftest prints them with six decimals (as siw's
// ib_write_bw --report_gbits did under TCG).
func TestReportGbits(t *testing.T) {
	tp := []int64{0, 1e6}
	tc := []int64{1e6, 2e6} // two messages of 1 MB in 2 ms
	mb, gb := report(1e6, tp, tc, mib), report(1e6, tp, tc, gbits)
	if math.Abs(gb.BWAvg-8) > 1e-9 || math.Abs(mb.BWAvg*mib/gbits-gb.BWAvg) > 1e-9 {
		t.Errorf("1e6 B twice in 2 ms: %v Gb/s, %v MB/s; want 8 Gb/s", gb.BWAvg, mb.BWAvg)
	}
	r := Report{Size: 65536, Iters: 5000, BWPeak: 0.081253, BWAvg: 0.056513, MsgRateMpps: 0.000108}
	if got, want := r.Line(true), " 65536      5000           0.081253            0.056513            0.000108"; got != want {
		t.Errorf("Line(true) = %q\n           want %q", got, want)
	}
	r.BWAvg = 0.5
	if got := r.Line(true); got != r.Line(false) {
		t.Errorf("Line(true) of 0.5 Gb/s = %q, want perftest's usual %q", got, r.Line(false))
	}
}
