// Package perf is the logic of `gowarp perf`: bandwidth and latency of
// RDMA Write, Read and Send over gowarp, and of plain TCP over the same
// path as a floor, measured between a Server and a Client that may live in
// two processes or, for loopback, in one.
//
// The client describes each run in the MPA private data of its connection
// request (see proto.go); the server answers with the address, STag and
// size of a buffer it registered for that connection, plays its side of
// the test, and frees everything when the client goes away. The plain-TCP
// tests use their own listener, on the port after the iWARP one.
package perf

import (
	"fmt"
	"strings"
)

// Test names one measurement.
type Test uint8

// The tests. The *_bw tests keep many requests outstanding and report
// bandwidth; the *_lat tests run one request at a time and report latency.
const (
	WriteBW Test = iota + 1
	WriteLat
	ReadBW
	ReadLat
	SendBW
	SendLat
	TCPBW
	TCPLat
)

var testNames = [...]string{
	WriteBW:  "write_bw",
	WriteLat: "write_lat",
	ReadBW:   "read_bw",
	ReadLat:  "read_lat",
	SendBW:   "send_bw",
	SendLat:  "send_lat",
	TCPBW:    "tcp_bw",
	TCPLat:   "tcp_lat",
}

// AllTests lists every test in the order they are run by "all".
func AllTests() []Test {
	return []Test{WriteBW, ReadBW, SendBW, TCPBW, WriteLat, ReadLat, SendLat, TCPLat}
}

func (t Test) valid() bool { return t >= WriteBW && t <= TCPLat }

func (t Test) String() string {
	if t.valid() {
		return testNames[t]
	}
	return fmt.Sprintf("test(%d)", uint8(t))
}

// Bandwidth reports whether t measures bandwidth (else latency).
func (t Test) Bandwidth() bool {
	switch t {
	case WriteBW, ReadBW, SendBW, TCPBW:
		return true
	}
	return false
}

// TCP reports whether t is one of the plain-TCP floor tests.
func (t Test) TCP() bool { return t == TCPBW || t == TCPLat }

// ParseTest returns the test called name.
func ParseTest(name string) (Test, error) {
	for t := WriteBW; t <= TCPLat; t++ {
		if testNames[t] == name {
			return t, nil
		}
	}
	return 0, fmt.Errorf("unknown test %q (want one of %s, or all)", name, strings.Join(testNames[1:], ", "))
}
