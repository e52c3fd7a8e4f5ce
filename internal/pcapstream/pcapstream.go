// Package pcapstream reassembles the TCP byte streams of a packet capture.
//
// It is test support: wire-format tests read real captures of the Linux
// kernel's siw (see wire/testdata/siw) and need, for every TCP connection,
// the bytes each side sent, in order, exactly once. Packet decoding is done
// by github.com/google/gopacket (pcapgo and layers, pure Go).
//
// Reassembly is strict: a connection is only reported if its SYN is in the
// capture, and a hole in either stream (a segment that was never captured)
// is an error rather than silently missing bytes. Retransmitted, duplicate
// and overlapping segments are folded so every stream byte appears once.
package pcapstream

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// Conn is one TCP connection of a capture.
type Conn struct {
	// InitiatorAddr and InitiatorPort are the side that sent the SYN;
	// ResponderAddr and ResponderPort the side that answered it.
	InitiatorAddr, ResponderAddr netip.Addr
	InitiatorPort, ResponderPort uint16

	// Initiator holds the bytes the initiator sent (initiator→responder),
	// Responder the bytes the responder sent (responder→initiator), each
	// reassembled in sequence order with duplicates removed.
	Initiator, Responder []byte

	// InitiatorFIN and ResponderFIN report whether a FIN from that side was
	// captured; Reset whether either side sent a RST.
	InitiatorFIN, ResponderFIN bool
	Reset                      bool
}

// String gives "addr:port -> addr:port" for messages.
func (c *Conn) String() string {
	return fmt.Sprintf("%s -> %s",
		netip.AddrPortFrom(c.InitiatorAddr, c.InitiatorPort),
		netip.AddrPortFrom(c.ResponderAddr, c.ResponderPort))
}

// ReadFile reads a capture file (classic pcap, or pcapng) and returns its
// TCP connections in the order of their SYNs.
func ReadFile(path string) ([]Conn, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	conns, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return conns, nil
}

// packetSource is the part of pcapgo.Reader and pcapgo.NgReader used here.
type packetSource interface {
	ReadPacketData() ([]byte, gopacket.CaptureInfo, error)
	LinkType() layers.LinkType
}

// pcapng section header block type, as it appears first in the file.
var pcapngMagic = []byte{0x0a, 0x0d, 0x0d, 0x0a}

// Read is ReadFile for an already opened capture.
func Read(r io.Reader) ([]Conn, error) {
	br := bufio.NewReader(r)
	head, err := br.Peek(4)
	if err != nil {
		return nil, fmt.Errorf("reading capture header: %w", err)
	}
	var src packetSource
	if bytes.Equal(head, pcapngMagic) {
		src, err = pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
	} else {
		src, err = pcapgo.NewReader(br)
	}
	if err != nil {
		return nil, err
	}

	a := &assembler{byKey: map[flowKey]*conn{}}
	for n := 1; ; n++ {
		data, ci, err := src.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("packet %d: %w", n, err)
		}
		if err := a.packet(data, ci, src.LinkType()); err != nil {
			return nil, fmt.Errorf("packet %d: %w", n, err)
		}
	}
	return a.finish()
}

// endpoint is one side of a connection.
type endpoint struct {
	addr netip.Addr
	port uint16
}

// flowKey identifies a connection irrespective of direction: lo < hi.
type flowKey struct{ lo, hi endpoint }

func less(a, b endpoint) bool {
	if c := a.addr.Compare(b.addr); c != 0 {
		return c < 0
	}
	return a.port < b.port
}

func keyOf(a, b endpoint) flowKey {
	if less(b, a) {
		a, b = b, a
	}
	return flowKey{a, b}
}

// segment is a captured piece of one direction's stream, at offset off
// (bytes after the SYN).
type segment struct {
	off  int64
	data []byte
}

// half is one direction of a connection.
type half struct {
	ep      endpoint
	isn     uint32 // sequence number of the SYN
	haveISN bool
	segs    []segment
	fin     bool
}

// offset gives the stream offset of sequence number seq (first data byte
// after the SYN is offset 0), allowing for 32-bit wrap-around. Streams are
// thus limited to 2 GiB, plenty for test captures.
func (h *half) offset(seq uint32) int64 {
	return int64(int32(seq - (h.isn + 1)))
}

type conn struct {
	init, resp half
	reset      bool
}

type assembler struct {
	conns []*conn
	byKey map[flowKey]*conn
}

func (a *assembler) packet(data []byte, ci gopacket.CaptureInfo, lt layers.LinkType) error {
	p := gopacket.NewPacket(data, lt, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	tl, _ := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if tl == nil {
		return nil
	}
	var src, dst netip.Addr
	switch nl := p.NetworkLayer().(type) {
	case *layers.IPv4:
		if nl.Flags&layers.IPv4MoreFragments != 0 || nl.FragOffset != 0 {
			return errors.New("fragmented IPv4 TCP segment is not supported")
		}
		src, _ = netip.AddrFromSlice(nl.SrcIP.To4())
		dst, _ = netip.AddrFromSlice(nl.DstIP.To4())
	case *layers.IPv6:
		src, _ = netip.AddrFromSlice(nl.SrcIP)
		dst, _ = netip.AddrFromSlice(nl.DstIP)
	default:
		return nil
	}
	if ci.CaptureLength < ci.Length || p.Metadata().Truncated {
		return fmt.Errorf("TCP frame truncated by capture (%d of %d bytes)", ci.CaptureLength, ci.Length)
	}
	from := endpoint{src, uint16(tl.SrcPort)}
	to := endpoint{dst, uint16(tl.DstPort)}
	key := keyOf(from, to)
	c := a.byKey[key]

	if tl.SYN && !tl.ACK {
		// A new connection, unless this is a retransmitted SYN. A SYN with
		// a new ISN on the same ports starts a new connection (port reuse).
		if c == nil || c.init.ep != from || c.init.isn != tl.Seq {
			c = &conn{init: half{ep: from, isn: tl.Seq, haveISN: true}, resp: half{ep: to}}
			a.conns = append(a.conns, c)
			a.byKey[key] = c
		}
	}
	if c == nil {
		return nil // connection began before the capture: ignored
	}
	var h *half
	switch from {
	case c.init.ep:
		h = &c.init
	case c.resp.ep:
		h = &c.resp
	default:
		return nil
	}
	if tl.SYN && tl.ACK && h == &c.resp {
		if h.haveISN && h.isn != tl.Seq {
			return fmt.Errorf("SYN-ACK from %v with a second ISN %d (had %d)",
				netip.AddrPortFrom(from.addr, from.port), tl.Seq, h.isn)
		}
		h.isn, h.haveISN = tl.Seq, true
	}
	if tl.RST {
		c.reset = true
	}
	if tl.FIN {
		h.fin = true
	}
	if len(tl.Payload) == 0 {
		return nil
	}
	if !h.haveISN {
		return fmt.Errorf("data from %v before its SYN", netip.AddrPortFrom(from.addr, from.port))
	}
	seq := tl.Seq
	if tl.SYN {
		seq++ // data carried on a SYN starts after it
	}
	h.segs = append(h.segs, segment{off: h.offset(seq), data: bytes.Clone(tl.Payload)})
	return nil
}

// stream puts a direction's segments together in order, dropping bytes
// already seen, and fails on a hole.
func (h *half) stream() ([]byte, error) {
	segs := h.segs
	sort.SliceStable(segs, func(i, j int) bool { return segs[i].off < segs[j].off })
	var out []byte
	for _, s := range segs {
		next := int64(len(out))
		end := s.off + int64(len(s.data))
		switch {
		case s.off > next:
			return nil, fmt.Errorf("hole in stream from %v: bytes %d..%d never captured",
				netip.AddrPortFrom(h.ep.addr, h.ep.port), next, s.off-1)
		case end <= next:
			// duplicate or retransmission of bytes already placed
		default:
			out = append(out, s.data[next-s.off:]...)
		}
	}
	return out, nil
}

func (a *assembler) finish() ([]Conn, error) {
	out := make([]Conn, 0, len(a.conns))
	for _, c := range a.conns {
		ini, err := c.init.stream()
		if err != nil {
			return nil, err
		}
		rsp, err := c.resp.stream()
		if err != nil {
			return nil, err
		}
		out = append(out, Conn{
			InitiatorAddr: c.init.ep.addr, InitiatorPort: c.init.ep.port,
			ResponderAddr: c.resp.ep.addr, ResponderPort: c.resp.ep.port,
			Initiator: ini, Responder: rsp,
			InitiatorFIN: c.init.fin, ResponderFIN: c.resp.fin,
			Reset: c.reset,
		})
	}
	return out, nil
}
