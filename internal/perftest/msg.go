// Package perftest speaks linux-rdma/perftest's tests over rdma_cm (-R)
// both ways: Run is the client of a perftest server (ib_write_bw -R, and
// the other five), Serve the server of a perftest client, for write_bw,
// read_bw, send_bw, write_lat, read_lat and send_lat, so that gowarp and
// the Linux kernel's siw running perftest can be measured against each
// other. The control exchange of each test is a Script (data, the same
// for both roles); the latency figures and the table are perftest's.
//
// With -R perftest makes two iWARP connections to the server's port: a
// control connection, over which the two sides exchange fixed-size Sends
// (the client Sends, then receives the server's Send), and a data
// connection that carries the test. The exchange implemented here is the
// one of perftest 4.5-0.17 (version string "6.06", Debian 12's), byte for
// byte as the captures in wire/testdata/siw show it:
//
//	version   16 bytes, NUL-padded "6.06"
//	cycle     4 bytes, BE: the page size (cycle buffer)
//	cacheline 4 bytes, BE: 64
//	mtu       2 bytes: the ibv_mtu enum in ASCII, NUL ("3" = 1024)
//	dest      56 bytes of zeros; the data connection; 56 zeros again
//	dest      the client's pingpong_dest, three times (four for send_bw)
//	-- traffic on the data connection --
//	dest      once more, then five 8-byte reports (write_bw, read_bw)
//	dest      closing handshake
//
// The latency tests exchange four dests before the traffic and, but for
// write_lat, one closing dest after it, and no reports (see Script).
// A pingpong_dest is {lid, out_reads, qpn, psn, rkey u32; 4 bytes of
// padding; vaddr u64; gid [16]; srqn, gid_index u32}, every integer
// big-endian. The reports are size and iterations (u64) and peak and
// average bandwidth and message rate (float64), each byte-swapped to big
// endian. perftest's write_bw and read_bw servers measure nothing: the
// report they send back is uninitialised memory, and what they print is
// the client's report. The send_bw server measures the receive side and
// exchanges no report; on iWARP it grants credits by RDMA-Writing the
// number of receives it has completed (a little-endian u32) into a buffer
// the client advertised in its pingpong_dest.
package perftest

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Version is the perftest version this client announces. Every later
// step is the one both sides do at that version (perftest skips a step
// unless both versions reach its threshold).
const Version = "6.06"

// Sizes of the control messages.
const (
	VersionLen = 16
	DestLen    = 56
)

// Control message values siw's perftest client sent.
const (
	CycleBuffer = 4096 // the page size
	CacheLine   = 64
	// MTU is IBV_MTU_1024, siw's active MTU, as perftest sends it.
	MTU = "3"
)

// AppendVersion appends the 16-byte version message.
func AppendVersion(b []byte, v string) []byte {
	var m [VersionLen]byte
	copy(m[:VersionLen-1], v)
	return append(b, m[:]...)
}

// ParseVersion returns the version string of a version message.
func ParseVersion(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// VersionAtLeast reports whether perftest version v is at least min, as
// perftest compares them (atof).
func VersionAtLeast(v string, min float64) bool {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	return err == nil && f >= min
}

// AppendUint32 appends a big-endian 32-bit control message.
func AppendUint32(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }

// AppendMTU appends the MTU message: the enum in ASCII and a NUL.
func AppendMTU(b []byte, mtu string) []byte { return append(append(b, mtu...), 0) }

// Dest is perftest's struct pingpong_dest: what each side tells the other
// about its data queue pair and buffer.
type Dest struct {
	LID      uint32
	OutReads uint32
	QPN      uint32
	PSN      uint32
	RKey     uint32
	VAddr    uint64
	GID      [16]byte
	SRQN     uint32
	GIDIndex uint32
}

// Append appends the 56-byte wire form of d (its padding zeroed).
func (d *Dest) Append(b []byte) []byte {
	for _, v := range []uint32{d.LID, d.OutReads, d.QPN, d.PSN, d.RKey, 0} {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	b = binary.BigEndian.AppendUint64(b, d.VAddr)
	b = append(b, d.GID[:]...)
	b = binary.BigEndian.AppendUint32(b, d.SRQN)
	return binary.BigEndian.AppendUint32(b, d.GIDIndex)
}

// ParseDest decodes a pingpong_dest; the padding is ignored (perftest
// leaves whatever the stack held there).
func ParseDest(b []byte) (Dest, error) {
	if len(b) != DestLen {
		return Dest{}, fmt.Errorf("perftest: pingpong_dest of %d bytes, want %d", len(b), DestLen)
	}
	be := binary.BigEndian
	d := Dest{LID: be.Uint32(b), OutReads: be.Uint32(b[4:]), QPN: be.Uint32(b[8:]), PSN: be.Uint32(b[12:]),
		RKey: be.Uint32(b[16:]), VAddr: be.Uint64(b[24:]), SRQN: be.Uint32(b[48:]), GIDIndex: be.Uint32(b[52:])}
	copy(d.GID[:], b[32:48])
	return d, nil
}

// Report is perftest's struct bw_report_data: what print_report_bw shows.
// Bandwidths are in MB/s of 2^20 bytes, as perftest's MB/sec, or in Gb/s
// with Options.Gbits (a peer's report is in the peer's unit); the message
// rate in millions per second.
type Report struct {
	Size, Iters   uint64
	BWPeak, BWAvg float64
	MsgRateMpps   float64
}

// reportMsgs returns the five report messages in exchange order.
func (r *Report) reportMsgs() [5][]byte {
	be := binary.BigEndian
	return [5][]byte{
		be.AppendUint64(nil, r.Size),
		be.AppendUint64(nil, r.Iters),
		be.AppendUint64(nil, math.Float64bits(r.BWPeak)),
		be.AppendUint64(nil, math.Float64bits(r.BWAvg)),
		be.AppendUint64(nil, math.Float64bits(r.MsgRateMpps)),
	}
}

// parseReport decodes the five report messages.
func parseReport(m [5][]byte) (Report, error) {
	for i, b := range m {
		if len(b) != 8 {
			return Report{}, fmt.Errorf("perftest: report field %d has %d bytes, want 8", i, len(b))
		}
	}
	be := binary.BigEndian
	return Report{Size: be.Uint64(m[0]), Iters: be.Uint64(m[1]),
		BWPeak: math.Float64frombits(be.Uint64(m[2])), BWAvg: math.Float64frombits(be.Uint64(m[3])),
		MsgRateMpps: math.Float64frombits(be.Uint64(m[4]))}, nil
}

// Plausible reports whether a report received from a server describes a
// run of size bytes: perftest's write_bw and read_bw servers send
// uninitialised memory.
func (r *Report) Plausible(size int) bool {
	ok := func(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) && f >= 0 && f < 1e9 }
	return r.Size == uint64(size) && r.Iters > 0 && ok(r.BWPeak) && ok(r.BWAvg) && ok(r.MsgRateMpps)
}

// ResultHeader, ResultHeaderG (--report_gbits) and Line print a report
// the way perftest does.
const (
	ResultHeader  = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
	ResultHeaderG = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
)

// resultHeader is the header of a table in Gb/s or MB/s.
func resultHeader(gbits bool) string {
	if gbits {
		return ResultHeaderG
	}
	return ResultHeader
}

// Line formats r as perftest's result line; gbits says its figures are in
// Gb/s, which perftest prints with more digits below 0.1.
func (r *Report) Line(gbits bool) string { return r.line(gbits && r.BWAvg < 0.1) }

// line formats r with six decimals (perftest's REPORT_FMT_EXT) or two.
func (r *Report) line(ext bool) string {
	if ext {
		return fmt.Sprintf(" %-7d    %d           %-7.6f            %-7.6f            %-7.6f", r.Size, r.Iters, r.BWPeak, r.BWAvg, r.MsgRateMpps)
	}
	return fmt.Sprintf(" %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f", r.Size, r.Iters, r.BWPeak, r.BWAvg, r.MsgRateMpps)
}

// Measured reports whether r is a plausible report with figures in it: a
// gowarp server of write_bw or read_bw sends zero figures (it measures
// nothing), perftest's sends uninitialised memory.
func (r *Report) Measured(size int) bool { return r.Plausible(size) && r.BWAvg > 0 }
