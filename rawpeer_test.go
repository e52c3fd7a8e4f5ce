package gowarp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp/wire"
)

// A raw iWARP peer for tests: MPA and FPDUs written and read by hand,
// to send what gowarp never would.

// rawPeer is a hostile peer written with the wire codec alone: it speaks
// MPA and sends whatever frames a test wants, byte for byte.
type rawPeer struct {
	t   testing.TB
	c   net.Conn
	crc bool
	msn [3]uint32
}

// dialRaw connects to a gowarp listener as an MPA revision 2 initiator
// without peer-to-peer mode, with the given IRD/ORD.
func dialRaw(t testing.TB, addr string, crc bool, ird, ord uint16) (*rawPeer, wire.MPAFrame) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req := wire.MPAFrame{Revision: 2, Enhanced: true, CRC: crc, IRD: ird, ORD: ord}
	b, _ := req.Append(nil)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, wire.MPAHeaderLen)
	if _, err := io.ReadFull(c, hdr); err != nil {
		t.Fatal(err)
	}
	n, err := wire.MPAFrameLen(hdr)
	if err != nil {
		t.Fatal(err)
	}
	full := append(hdr, make([]byte, n-len(hdr))...)
	if _, err := io.ReadFull(c, full[wire.MPAHeaderLen:]); err != nil {
		t.Fatal(err)
	}
	rep, _, err := wire.ParseMPAFrame(full)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawPeer{t: t, c: c, crc: crc || rep.CRC, msn: [3]uint32{1, 1, 1}}, rep
}

// send writes one FPDU carrying header h, RDMAP body and payload.
func (p *rawPeer) send(h wire.Header, body, payload []byte) {
	p.t.Helper()
	u := h.Append(nil)
	u = append(u, body...)
	u = append(u, payload...)
	b, err := wire.AppendFPDU(nil, u, p.crc)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.c.Write(b); err != nil {
		p.t.Fatal(err)
	}
}

func hdr(op wire.Opcode) wire.Header {
	return wire.Header{Opcode: op, Tagged: op.Info().Tagged, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: op.Info().QN}
}

func (p *rawPeer) write(stag uint32, to uint64, payload []byte) {
	h := hdr(wire.OpWrite)
	h.STag, h.TO = stag, to
	p.send(h, nil, payload)
}

func (p *rawPeer) sendMsg(payload []byte) {
	h := hdr(wire.OpSend)
	h.MSN = p.msn[0]
	p.msn[0]++
	p.send(h, nil, payload)
}

func (p *rawPeer) readReq(rr wire.ReadRequest) {
	h := hdr(wire.OpReadRequest)
	h.MSN = p.msn[1]
	p.msn[1]++
	p.send(h, rr.Append(nil), nil)
}

// next reads the next FPDU and returns its header and the bytes after it.
func (p *rawPeer) next() (wire.Header, []byte, error) {
	var lb [2]byte
	if _, err := io.ReadFull(p.c, lb[:]); err != nil {
		return wire.Header{}, nil, err
	}
	n := wire.FPDULen(int(binary.BigEndian.Uint16(lb[:])))
	b := make([]byte, n)
	copy(b, lb[:])
	if _, err := io.ReadFull(p.c, b[2:]); err != nil {
		return wire.Header{}, nil, err
	}
	f, _, err := wire.ParseFPDU(b, p.crc)
	if err != nil {
		return wire.Header{}, nil, err
	}
	h, k, err := wire.ParseHeader(f.ULPDU)
	return h, f.ULPDU[k:], err
}

// terminate reads FPDUs until a Terminate arrives, then expects the
// connection to close.
func (p *rawPeer) terminate() wire.Terminate {
	p.t.Helper()
	for {
		h, rest, err := p.next()
		if err != nil {
			p.t.Fatalf("waiting for a Terminate: %v", err)
		}
		if h.Opcode != wire.OpTerminate {
			continue
		}
		if h.QN != wire.QNTerminate || h.MSN != 1 || !h.Last {
			p.t.Errorf("Terminate header %+v: want QN 2, MSN 1, L", h)
		}
		t, _, err := wire.ParseTerminate(rest)
		if err != nil {
			p.t.Fatal(err)
		}
		if _, _, err := p.next(); !errors.Is(err, io.EOF) {
			p.t.Errorf("after the Terminate: %v, want the connection closed", err)
		}
		return t
	}
}

// rawResponder listens (with lc's options) as a raw MPA responder: it
// answers the first connection's revision 2 request with a reply carrying
// ird and ord, then hands the connection over, reading nothing more.
func rawResponder(t testing.TB, lc net.ListenConfig, ird, ord uint16) (string, <-chan net.Conn) {
	t.Helper()
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		hdr := make([]byte, wire.MPAHeaderLen+4)
		io.ReadFull(c, hdr)
		rep, _ := (&wire.MPAFrame{Reply: true, Revision: 2, Enhanced: true, IRD: ird, ORD: ord}).Append(nil)
		c.Write(rep)
		conns <- c
	}()
	return ln.Addr().String(), conns
}

func readMPAFrame(c net.Conn) (wire.MPAFrame, error) {
	hdr := make([]byte, wire.MPAHeaderLen)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return wire.MPAFrame{}, err
	}
	n, err := wire.MPAFrameLen(hdr)
	if err != nil {
		return wire.MPAFrame{}, err
	}
	full := append(hdr, make([]byte, n-len(hdr))...)
	if _, err := io.ReadFull(c, full[wire.MPAHeaderLen:]); err != nil {
		return wire.MPAFrame{}, err
	}
	f, _, err := wire.ParseMPAFrame(full)
	return f, err
}

// readTerminate reads FPDUs until a Terminate, then expects the end of the
// connection, returning an error instead of failing the test.
func readTerminate(p *rawPeer) (wire.Terminate, error) {
	for {
		h, rest, err := p.next()
		if err != nil {
			return wire.Terminate{}, errors.New("no Terminate before the connection ended: " + err.Error())
		}
		if h.Opcode != wire.OpTerminate {
			continue
		}
		term, _, err := wire.ParseTerminate(rest)
		if err != nil {
			return term, err
		}
		if _, _, err := p.next(); err == nil {
			return term, errors.New("an FPDU after the Terminate")
		} else if ne := (net.Error)(nil); errors.As(err, &ne) && ne.Timeout() {
			return term, errors.New("the connection stayed open after the Terminate")
		}
		return term, nil
	}
}
