package perf

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The control protocol rides in the MPA private data; all integers are
// big-endian.
//
// Request (client → server, 48 bytes), in the MPA request:
//
//	0  "GWPF"       magic
//	4  version      1
//	5  test         Test
//	6  flags        flagAsync, flagAcked, flagPoll, flagEach: how the
//	                server's QP transmits and completes, and how it waits
//	7  reserved     0
//	8  size         message size in bytes
//	12 depth        work requests the client keeps outstanding
//	16 max FPDU     for the server's transmit side (0: sized to the segment)
//	20 buffer STag  the client's buffer (target of the server's Writes in
//	24 buffer addr  write_lat)
//	32 buffer len
//	36 credit STag  8 bytes the server Writes to return receive credits
//	40 credit addr  in send_bw (STag 0: none)
//
// Reply (server → client, 32 bytes), in the MPA reply:
//
//	0  "GWPF", 4 version, 5 status 0, 6 reserved (2)
//	8  buffer STag  the server's buffer: target of Writes, source of Reads
//	12 buffer len
//	16 buffer addr
//	24 receives     send_bw: receives the server keeps posted (the initial credit)
//	28 credit batch send_bw: receives reposted per credit Write
//
// Rejection (server → client), in the MPA reject: "GWPF", version, a
// non-zero status, 2 reserved bytes, then the reason as UTF-8 text.
const (
	magic        = "GWPF"
	protoVersion = 1
	requestLen   = 48
	replyLen     = 32
	// maxReason bounds the text of a rejection, keeping the private data
	// within the 252 bytes siw allows.
	maxReason = 200
)

// Request flags.
const (
	flagAsync uint8 = 1 << iota
	flagAcked
	flagPoll
	flagEach
)

// errProto is the error of malformed control messages.
var errProto = errors.New("perf: malformed control message")

type request struct {
	test       Test
	flags      uint8
	size       uint32
	depth      uint32
	maxFPDU    uint32
	bufSTag    uint32
	bufAddr    uint64
	bufLen     uint32
	creditSTag uint32
	creditAddr uint64
}

func (r *request) append(b []byte) []byte {
	b = append(b, magic...)
	b = append(b, protoVersion, byte(r.test), r.flags, 0)
	b = binary.BigEndian.AppendUint32(b, r.size)
	b = binary.BigEndian.AppendUint32(b, r.depth)
	b = binary.BigEndian.AppendUint32(b, r.maxFPDU)
	b = binary.BigEndian.AppendUint32(b, r.bufSTag)
	b = binary.BigEndian.AppendUint64(b, r.bufAddr)
	b = binary.BigEndian.AppendUint32(b, r.bufLen)
	b = binary.BigEndian.AppendUint32(b, r.creditSTag)
	b = binary.BigEndian.AppendUint64(b, r.creditAddr)
	return b
}

// checkHead checks the magic and version common to every control message.
func checkHead(b []byte, min int) error {
	if len(b) < min {
		return fmt.Errorf("%w: %d bytes, want at least %d", errProto, len(b), min)
	}
	if string(b[:4]) != magic {
		return fmt.Errorf("%w: bad magic %q", errProto, b[:4])
	}
	if b[4] != protoVersion {
		return fmt.Errorf("%w: version %d, want %d", errProto, b[4], protoVersion)
	}
	return nil
}

func parseRequest(b []byte) (request, error) {
	if err := checkHead(b, requestLen); err != nil {
		return request{}, err
	}
	r := request{
		test:       Test(b[5]),
		flags:      b[6],
		size:       binary.BigEndian.Uint32(b[8:]),
		depth:      binary.BigEndian.Uint32(b[12:]),
		maxFPDU:    binary.BigEndian.Uint32(b[16:]),
		bufSTag:    binary.BigEndian.Uint32(b[20:]),
		bufAddr:    binary.BigEndian.Uint64(b[24:]),
		bufLen:     binary.BigEndian.Uint32(b[32:]),
		creditSTag: binary.BigEndian.Uint32(b[36:]),
		creditAddr: binary.BigEndian.Uint64(b[40:]),
	}
	if !r.test.valid() || r.test.TCP() {
		return request{}, fmt.Errorf("%w: %v is not an RDMA test", errProto, r.test)
	}
	return r, nil
}

type reply struct {
	bufSTag     uint32
	bufLen      uint32
	bufAddr     uint64
	recvDepth   uint32
	creditBatch uint32
}

func (r *reply) append(b []byte) []byte {
	b = append(b, magic...)
	b = append(b, protoVersion, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, r.bufSTag)
	b = binary.BigEndian.AppendUint32(b, r.bufLen)
	b = binary.BigEndian.AppendUint64(b, r.bufAddr)
	b = binary.BigEndian.AppendUint32(b, r.recvDepth)
	b = binary.BigEndian.AppendUint32(b, r.creditBatch)
	return b
}

func parseReply(b []byte) (reply, error) {
	if err := checkHead(b, replyLen); err != nil {
		return reply{}, err
	}
	if b[5] != 0 {
		return reply{}, fmt.Errorf("%w: reply with status %d", errProto, b[5])
	}
	return reply{
		bufSTag:     binary.BigEndian.Uint32(b[8:]),
		bufLen:      binary.BigEndian.Uint32(b[12:]),
		bufAddr:     binary.BigEndian.Uint64(b[16:]),
		recvDepth:   binary.BigEndian.Uint32(b[24:]),
		creditBatch: binary.BigEndian.Uint32(b[28:]),
	}, nil
}

// rejection encodes the private data of a rejection giving reason.
func rejection(reason string) []byte {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	b := append([]byte(magic), protoVersion, 1, 0, 0)
	return append(b, reason...)
}

// rejectionReason decodes a rejection's reason, or describes what came
// instead.
func rejectionReason(b []byte) string {
	if checkHead(b, 8) != nil {
		return fmt.Sprintf("%d bytes of unknown private data", len(b))
	}
	return string(b[8:])
}

// The plain-TCP tests open with a 12-byte header: "GWPT", version, test,
// two reserved bytes, size. The server answers "GWPT" when it will serve
// and closes the connection when not.
const (
	tcpMagic     = "GWPT"
	tcpHeaderLen = 12
)

func appendTCPHeader(b []byte, t Test, size uint32) []byte {
	b = append(b, tcpMagic...)
	b = append(b, protoVersion, byte(t), 0, 0)
	return binary.BigEndian.AppendUint32(b, size)
}

func parseTCPHeader(b []byte) (Test, uint32, error) {
	if len(b) < tcpHeaderLen || string(b[:4]) != tcpMagic || b[4] != protoVersion {
		return 0, 0, fmt.Errorf("%w: bad TCP test header %x", errProto, b)
	}
	t := Test(b[5])
	if !t.TCP() {
		return 0, 0, fmt.Errorf("%w: %v is not a TCP test", errProto, t)
	}
	return t, binary.BigEndian.Uint32(b[8:]), nil
}
