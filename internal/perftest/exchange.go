package perftest

import (
	"encoding/binary"
	"fmt"
)

// Step is one step of a test's -R control exchange. Message steps are
// one Send each way: the client sends its message, the server answers with
// its own of the same kind. Action steps send nothing; each side does what
// the step says before going on.
type Step uint8

// The steps.
const (
	// Messages.
	StepVersion   Step = iota + 1 // 16-byte version string
	StepCycle                     // cycle buffer, 4 bytes BE
	StepCacheLine                 // cache line, 4 bytes BE
	StepMTU                       // MTU enum in ASCII and a NUL
	StepZeroDest                  // an all-zero pingpong_dest (a barrier)
	StepDest                      // the side's pingpong_dest
	StepReport                    // one field of the bandwidth report, 8 bytes
	// Actions.
	ActData    // the client connects the data queue pair, the server accepts it
	ActRecvs   // send tests: post the receives the peer's Sends will take
	ActTraffic // run the test on the data queue pair
)

var stepNames = [...]string{StepVersion: "version", StepCycle: "cycle buffer", StepCacheLine: "cache line",
	StepMTU: "MTU", StepZeroDest: "zero dest", StepDest: "dest", StepReport: "report field",
	ActData: "data connection", ActRecvs: "post receives", ActTraffic: "traffic"}

func (s Step) String() string {
	if int(s) < len(stepNames) && stepNames[s] != "" {
		return stepNames[s]
	}
	return fmt.Sprintf("step(%d)", s)
}

// Message reports whether s is a message step.
func (s Step) Message() bool { return s >= StepVersion && s <= StepReport }

// Script returns the control exchange of test t, as perftest 4.5-0.17
// ("6.06") runs it with -R. The bandwidth tests' exchange is the one of
// the captures in wire/testdata/siw; the latency tests' likewise
// (perftest-*_lat.pcap).
func Script(t Test) []Step { return ScriptFor(&Options{Test: t}) }

// ScriptFor is the exchange of a run with options o. On several data queue
// pairs (write_bw and read_bw) the data connection step connects them all,
// and perftest exchanges each queue pair's dest in turn twice before the
// first queue pair's "additional handshake" (siw's ib_write_bw -q 2 sent
// the dests of its queue pairs 0, 1, 0, 1, then 0). send_lat over all
// sizes, and send_bw, post their receives and shake hands before each
// size.
func ScriptFor(o *Options) []Step {
	t, qps := o.Test, max(o.QPs, 1)
	s := []Step{StepVersion, StepCycle, StepCacheLine, StepMTU, StepZeroDest, ActData, StepZeroDest}
	switch t {
	case WriteBW, ReadBW:
		for range 2 * (qps - 1) {
			s = append(s, StepDest)
		}
		s = append(s, StepDest, StepDest, StepDest)
		if o.Duplex {
			// Both sides run the traffic: they meet before it, and
			// exchange their reports straight after; over all sizes,
			// they meet after each size's traffic too (write_bw.c's
			// RUN_ALL loop, perftest 4.6 and later), then report it.
			for range len(sizesOf(o)) {
				s = append(s, StepDest, ActTraffic)
				if o.All {
					s = append(s, StepDest)
				}
				for range reportFields {
					s = append(s, StepReport)
				}
			}
			return append(s, StepDest)
		}
		// The server waits for the client in a handshake.
		s = append(s, ActTraffic, StepDest)
		for range reportFields {
			s = append(s, StepReport)
		}
		return append(s, StepDest)
	case SendBW:
		// The fourth dest tells the client the server's receives are
		// posted; over all sizes each size's are, and a dest follows
		// each size's traffic (send_bw.c's RUN_ALL loop).
		s = append(s, StepDest, StepDest, StepDest)
		for range len(sizesOf(o)) {
			s = append(s, ActRecvs, StepDest, ActTraffic)
			if o.All {
				s = append(s, StepDest)
			}
		}
		return append(s, StepDest)
	case WriteLat:
		// No closing handshake: each side ends with its last Write.
		return append(s, StepDest, StepDest, StepDest, StepDest, ActTraffic)
	case ReadLat:
		return append(s, StepDest, StepDest, StepDest, StepDest, ActTraffic, StepDest)
	case SendLat:
		// Both sides post their receives before the fourth dest.
		s = append(s, StepDest, StepDest, StepDest)
		for range len(sizesOf(o)) {
			s = append(s, ActRecvs, StepDest, ActTraffic)
		}
		return append(s, StepDest)
	}
	return nil
}

// sizesOf returns the message sizes of a run: perftest's -a runs every
// size from 2 bytes to MaxSize, doubling.
func sizesOf(o *Options) []int {
	if !o.All {
		return []int{o.Size}
	}
	var sizes []int
	for size := 2; size <= MaxSize; size *= 2 {
		sizes = append(sizes, size)
	}
	return sizes
}

// reportFields is the number of report messages (size, iterations, peak,
// average, message rate).
const reportFields = 5

// CheckMessage checks that a message received at step s has that step's
// form; the peer's input never panics the parser that follows.
func CheckMessage(s Step, b []byte) error {
	want := 0
	switch s {
	case StepVersion:
		want = VersionLen
	case StepCycle, StepCacheLine:
		want = 4
	case StepMTU:
		if len(b) < 2 || len(b) > 8 || b[len(b)-1] != 0 {
			return fmt.Errorf("perftest: MTU message % x is not a short NUL-terminated string", b)
		}
		return nil
	case StepZeroDest:
		if len(b) != DestLen {
			return fmt.Errorf("perftest: %v of %d bytes, want %d", s, len(b), DestLen)
		}
		for _, c := range b {
			if c != 0 {
				return fmt.Errorf("perftest: %v is not zero: % x", s, b)
			}
		}
		return nil
	case StepDest:
		want = DestLen
	case StepReport:
		want = 8
	default:
		return fmt.Errorf("perftest: %v carries no message", s)
	}
	if len(b) != want {
		return fmt.Errorf("perftest: %v message of %d bytes, want %d", s, len(b), want)
	}
	if s == StepCycle || s == StepCacheLine {
		if v := binary.BigEndian.Uint32(b); v == 0 || v > 1<<30 {
			return fmt.Errorf("perftest: %v of %d", s, v)
		}
	}
	return nil
}
