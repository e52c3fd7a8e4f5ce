package gowarp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// TestBadInputTerminates drives each bad input the RFCs name into a gowarp
// responder and checks the Terminate it answers with, that only that QP
// goes to error with its work flushed, and that a neighbour QP of the same
// device goes on working.
func TestBadInputTerminates(t *testing.T) {
	type env struct {
		p                 *rawPeer
		rw, ro, wo, other *gowarp.MR // remote-write+read, read-only, write-only, other PD
	}
	cases := []struct {
		name   string
		crc    bool
		ird    uint16
		recv   int // receive buffer posted on the QP first (0: none)
		send   func(e *env)
		want   *wire.TermError
		echo   bool // the Terminate echoes the DDP header
		readRq bool // ... and the Read Request
		status gowarp.Status
	}{
		{name: "write to unknown STag", send: func(e *env) { e.p.write(0x00ffff00, 0, make([]byte, 8)) }, want: wire.ErrDDPInvalidSTag, echo: true},
		{name: "write with wrong key", send: func(e *env) { e.p.write(uint32(e.rw.STag())^0x5a, e.rw.Addr(), make([]byte, 8)) }, want: wire.ErrDDPInvalidSTag, echo: true},
		{name: "write past the region", send: func(e *env) { e.p.write(uint32(e.rw.STag()), e.rw.Addr()+4090, make([]byte, 8)) }, want: wire.ErrDDPBaseBounds, echo: true},
		{name: "write before the region", send: func(e *env) { e.p.write(uint32(e.rw.STag()), e.rw.Addr()-1, make([]byte, 8)) }, want: wire.ErrDDPBaseBounds, echo: true},
		{name: "write without the right", send: func(e *env) { e.p.write(uint32(e.ro.STag()), e.ro.Addr(), make([]byte, 8)) }, want: wire.ErrDDPInvalidSTag, echo: true},
		{name: "write to another PD", send: func(e *env) { e.p.write(uint32(e.other.STag()), e.other.Addr(), make([]byte, 8)) }, want: wire.ErrDDPSTagNotAssoc, echo: true},
		{name: "write with TO wrap", send: func(e *env) { e.p.write(uint32(e.rw.STag()), ^uint64(0)-2, make([]byte, 8)) }, want: wire.ErrDDPTOWrap, echo: true},
		{name: "read from unknown STag", ird: 4, send: func(e *env) {
			e.p.readReq(wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: 0x00ffff00})
		}, want: wire.ErrRDMAPInvalidSTag, echo: true, readRq: true},
		{name: "read past the region", ird: 4, send: func(e *env) {
			e.p.readReq(wire.ReadRequest{SinkSTag: 7, Size: 4097, SourceSTag: uint32(e.rw.STag()), SourceTO: e.rw.Addr()})
		}, want: wire.ErrRDMAPBaseBounds, echo: true, readRq: true},
		{name: "read without the right", ird: 4, send: func(e *env) {
			e.p.readReq(wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: uint32(e.wo.STag()), SourceTO: e.wo.Addr()})
		}, want: wire.ErrRDMAPAccessRights, echo: true, readRq: true},
		{name: "read from another PD", ird: 4, send: func(e *env) {
			e.p.readReq(wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: uint32(e.other.STag()), SourceTO: e.other.Addr()})
		}, want: wire.ErrRDMAPSTagNotAssoc, echo: true, readRq: true},
		{name: "send without a receive", send: func(e *env) { e.p.sendMsg(make([]byte, 16)) }, want: wire.ErrDDPNoBuffer, echo: true},
		{name: "send longer than the receive", recv: 8, send: func(e *env) { e.p.sendMsg(make([]byte, 16)) },
			want: wire.ErrDDPNoBuffer, echo: true, status: gowarp.LocalLengthError},
		{name: "send with wrong MSN", recv: 64, send: func(e *env) {
			h := hdr(wire.OpSend)
			h.MSN = 5
			e.p.send(h, nil, make([]byte, 4))
		}, want: wire.ErrDDPInvalidMSN, echo: true},
		{name: "send starting at MO 4", recv: 64, send: func(e *env) {
			h := hdr(wire.OpSend)
			h.MSN, h.MO = 1, 4
			e.p.send(h, nil, make([]byte, 4))
		}, want: wire.ErrDDPInvalidMO, echo: true},
		{name: "send on the Read queue", recv: 64, send: func(e *env) {
			h := hdr(wire.OpSend)
			h.MSN, h.QN = 1, 1
			e.p.send(h, nil, make([]byte, 4))
		}, want: wire.ErrDDPInvalidQN, echo: true},
		{name: "unknown opcode", send: func(e *env) {
			h := hdr(wire.OpSend)
			h.Opcode = 0xc
			e.p.send(h, nil, nil)
		}, want: wire.ErrRDMAPOpcode},
		{name: "Atomic Request not negotiated", send: func(e *env) {
			h := hdr(wire.OpAtomicRequest)
			h.MSN = 1
			e.p.send(h, (&wire.AtomicRequest{Op: wire.AtomicFetchAdd, ReqID: 1, RemoteSTag: uint32(e.rw.STag()), RemoteTO: e.rw.Addr(), AddSwap: 1}).Append(nil), nil)
		}, want: wire.ErrRDMAPOpcode},
		{name: "Immediate Data not negotiated", recv: 64, send: func(e *env) {
			h := hdr(wire.OpImmediate)
			h.MSN = 1
			e.p.send(h, wire.AppendImmediate(nil, 7), nil)
		}, want: wire.ErrRDMAPOpcode},
		{name: "tagged Send", send: func(e *env) {
			h := hdr(wire.OpWrite)
			h.Opcode = wire.OpSend
			e.p.send(h, nil, nil)
		}, want: wire.ErrRDMAPOpcode},
		{name: "RDMAP version 2", send: func(e *env) {
			h := hdr(wire.OpWrite)
			h.RDMAPVersion = 2
			e.p.send(h, nil, nil)
		}, want: wire.ErrRDMAPVersion},
		{name: "DDP version 0 tagged", send: func(e *env) {
			h := hdr(wire.OpWrite)
			h.DDPVersion = 0
			e.p.send(h, nil, nil)
		}, want: wire.ErrDDPTaggedVersion},
		{name: "DDP version 3 untagged", send: func(e *env) {
			h := hdr(wire.OpSend)
			h.DDPVersion = 3
			e.p.send(h, nil, nil)
		}, want: wire.ErrDDPUntaggedVersion},
		{name: "ULPDU shorter than its header", send: func(e *env) {
			b, _ := wire.AppendFPDU(nil, []byte{0xc1, 0x40, 0, 0, 0, 1}, e.p.crc)
			e.p.c.Write(b)
		}, want: wire.ErrDDPCatastrophic},
		{name: "Read Request shorter than its body", ird: 4, send: func(e *env) {
			h := hdr(wire.OpReadRequest)
			h.MSN = 1
			e.p.send(h, make([]byte, 10), nil)
		}, want: wire.ErrDDPCatastrophic},
		{name: "Read Request with a payload", ird: 4, send: func(e *env) {
			h := hdr(wire.OpReadRequest)
			h.MSN = 1
			rr := wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: uint32(e.rw.STag()), SourceTO: e.rw.Addr()}
			e.p.send(h, rr.Append(nil), make([]byte, 3000))
		}, want: wire.ErrDDPTooLong, echo: true},
		{name: "bad CRC", crc: true, send: func(e *env) {
			u := hdr(wire.OpWrite)
			u.STag, u.TO = uint32(e.rw.STag()), e.rw.Addr()
			b, _ := wire.AppendFPDU(nil, append(u.Append(nil), 1, 2, 3, 4), true)
			b[len(b)-1] ^= 0xff
			e.p.c.Write(b)
		}, want: wire.ErrMPACRC},
		{name: "zero CRC when CRC was negotiated", crc: true, send: func(e *env) {
			u := hdr(wire.OpWrite)
			u.STag, u.TO = uint32(e.rw.STag()), e.rw.Addr()
			b, _ := wire.AppendFPDU(nil, append(u.Append(nil), 1, 2, 3, 4), false)
			e.p.c.Write(b)
		}, want: wire.ErrMPACRC},
		{name: "read beyond IRD", ird: 1, send: func(e *env) {
			// The first Read of 32 MiB cannot leave while we do not read
			// (more than both socket buffers hold), so the second finds the
			// IRQ (IRD 1) full.
			for range 2 {
				e.p.readReq(wire.ReadRequest{SinkSTag: 7, Size: 32 << 20, SourceSTag: uint32(e.rw.STag()), SourceTO: e.rw.Addr()})
			}
		}, want: wire.ErrRDMAPStream, echo: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, gowarp.ConnectOptions{IRD: 1})
			e := &env{}
			size := 4096
			if tc.name == "read beyond IRD" {
				size = 32 << 20
			}
			var err error
			if e.rw, err = s.pd.Register(make([]byte, size), gowarp.RemoteWrite|gowarp.RemoteRead|gowarp.LocalWrite); err != nil {
				t.Fatal(err)
			}
			e.ro, _ = s.pd.Register(make([]byte, 4096), gowarp.RemoteRead)
			e.wo, _ = s.pd.Register(make([]byte, 4096), gowarp.RemoteWrite)
			e.other, _ = s.dev.AllocPD().Register(make([]byte, 4096), gowarp.RemoteWrite|gowarp.RemoteRead)

			// A neighbour connection on the same device, to show it survives.
			good, _ := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
			goodQP := s.accepted(t)

			ird := tc.ird
			if ird == 0 {
				ird = 1
			}
			var rep wire.MPAFrame
			e.p, rep = dialRaw(t, s.ln.Addr().String(), tc.crc, 1, ird)
			qp := s.accepted(t)
			if tc.crc && !rep.CRC {
				t.Fatal("CRC asked for but not granted")
			}
			// Outstanding work that must come back flushed.
			rmr, _ := s.pd.Register(make([]byte, 64), gowarp.LocalWrite)
			recvLen := tc.recv
			if recvLen == 0 {
				recvLen = 64
			}
			if tc.recv > 0 {
				if err := qp.PostRecv(&gowarp.RecvWR{ID: 100, SGL: []gowarp.SGE{{MR: rmr, Length: recvLen}}}); err != nil {
					t.Fatal(err)
				}
			}
			tc.send(e)
			term := e.p.terminate()
			if !errors.Is(&term.Err, tc.want) {
				t.Fatalf("Terminate reports %v, want %v", &term.Err, tc.want)
			}
			if h, ok := term.DDPHeader(); ok != tc.echo {
				t.Errorf("echoed DDP header present %v, want %v (%+v)", ok, tc.echo, h)
			}
			if _, ok := term.ReadRequest(); ok != tc.readRq {
				t.Errorf("echoed Read Request present %v, want %v", ok, tc.readRq)
			}
			waitState(t, qp, gowarp.StateError)
			if err := qp.Err(); !errors.Is(err, gowarp.ErrTerminated) || !errors.Is(err, tc.want) {
				t.Errorf("QP error %v, want ErrTerminated and %v", err, tc.want)
			}
			if tc.recv > 0 {
				c := wait(t, s.cq)
				want := gowarp.WRFlushError
				if tc.status != gowarp.Success {
					want = tc.status
				}
				if c.ID != 100 || c.Status != want {
					t.Errorf("receive completed %+v, want status %v", c, want)
				}
			}
			if err := qp.PostSend(&gowarp.SendWR{Op: gowarp.OpSend}); !errors.Is(err, gowarp.ErrNotReady) {
				t.Errorf("post on a failed QP: %v, want ErrNotReady", err)
			}

			// The neighbour still works: a Write lands and a Read answers.
			if goodQP.State() != gowarp.StateReady {
				t.Fatalf("neighbour QP is %v", goodQP.State())
			}
			// (Its own region: two peers writing one region race, as in any RDMA.)
			mine, _ := s.pd.Register(make([]byte, 64), gowarp.RemoteWrite|gowarp.RemoteRead)
			good.write(uint32(mine.STag()), mine.Addr(), []byte("still alive"))
			good.readReq(wire.ReadRequest{SinkSTag: 42, SinkTO: 1000, Size: 11, SourceSTag: uint32(mine.STag()), SourceTO: mine.Addr()})
			h, payload, err := good.next()
			if err != nil || h.Opcode != wire.OpReadResponse || h.STag != 42 || h.TO != 1000 || string(payload[:11]) != "still alive" {
				t.Fatalf("neighbour's Read Response %+v %q %v", h, payload, err)
			}
		})
	}
}

// TestPeerTerminateReason: a Terminate from the peer puts the QP in error
// with the peer's reason, and outstanding work is flushed.
func TestPeerTerminateReason(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{})
	p, _ := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
	qp := s.accepted(t)
	rmr, _ := s.pd.Register(make([]byte, 64), gowarp.LocalWrite)
	qp.PostRecv(&gowarp.RecvWR{ID: 5, SGL: []gowarp.SGE{{MR: rmr, Length: 64}}})
	term := wire.NewTerminate(wire.ErrRDMAPAccessRights, nil, 0, nil)
	h := hdr(wire.OpTerminate)
	h.MSN = 1
	p.send(h, term.Append(nil), nil)
	waitState(t, qp, gowarp.StateError)
	err := qp.Err()
	if !errors.Is(err, gowarp.ErrPeerTerminated) || !errors.Is(err, wire.ErrRDMAPAccessRights) {
		t.Fatalf("QP error %v, want ErrPeerTerminated and the peer's reason", err)
	}
	if c := wait(t, s.cq); c.ID != 5 || c.Status != gowarp.WRFlushError {
		t.Fatalf("receive completed %+v, want flushed", c)
	}
	// We do not answer a Terminate with a Terminate: the connection just closes.
	if _, _, err := p.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the peer's Terminate: %v, want EOF", err)
	}
}

// TestPeerClose: the peer closing TCP flushes the QP's work.
func TestPeerClose(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{})
	p, _ := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
	qp := s.accepted(t)
	rmr, _ := s.pd.Register(make([]byte, 64), gowarp.LocalWrite)
	qp.PostRecv(&gowarp.RecvWR{ID: 6, SGL: []gowarp.SGE{{MR: rmr, Length: 64}}})
	p.c.Close()
	waitState(t, qp, gowarp.StateError)
	if err := qp.Err(); !errors.Is(err, gowarp.ErrPeerClosed) {
		t.Fatalf("QP error %v, want ErrPeerClosed", err)
	}
	if c := wait(t, s.cq); c.ID != 6 || c.Status != gowarp.WRFlushError {
		t.Fatalf("receive completed %+v, want flushed", c)
	}
}

// TestListenerSurvivesBadRequests: garbage, markers, a bad revision and a
// silent peer are dropped (markers with a reject reply), and the listener
// goes on accepting.
func TestListenerSurvivesBadRequests(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{})
	addr := s.ln.Addr().String()
	send := func(b []byte) []byte {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(b)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, _ := io.ReadAll(c)
		return got
	}
	if got := send([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); len(got) != 0 {
		t.Errorf("garbage got %q back", got)
	}
	markers, _ := (&wire.MPAFrame{Markers: true, Revision: 1}).Append(nil)
	got := send(markers)
	rep, _, err := wire.ParseMPAFrame(got)
	if err != nil || !rep.Reply || !rep.Reject {
		t.Errorf("markers request answered %q (%v), want a reject reply", got, err)
	}
	rev3, _ := (&wire.MPAFrame{Revision: 3}).Append(nil)
	if got := send(rev3); len(got) != 0 {
		t.Errorf("revision 3 got %q back", got)
	}
	big := []byte(wire.MPAKeyRequest + "\x00\x02\xff\xff")
	if got := send(big); len(got) != 0 {
		t.Errorf("oversized private data got %q back", got)
	}
	// A good client is still served.
	dialRaw(t, addr, false, 1, 1)
	s.accepted(t)
}

// TestRejectWithPrivateData: the listener sees the request's private data
// and rejects with its own, which Connect returns.
func TestRejectWithPrivateData(t *testing.T) {
	dev := gowarp.Open()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		if string(req.PrivateData()) != "let me in" {
			t.Errorf("request private data %q", req.PrivateData())
		}
		req.Reject([]byte("go away"))
	}()
	pd := dev.AllocPD()
	cq := dev.NewCQ(8)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	err = qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{PrivateData: []byte("let me in")})
	var rej *gowarp.RejectedError
	if !errors.Is(err, gowarp.ErrRejected) || !errors.As(err, &rej) || string(rej.PrivateData) != "go away" {
		t.Fatalf("Connect: %v, want a rejection carrying %q", err, "go away")
	}
}

// TestRemoteErrorCompletes: a gowarp requester whose Read or Write the
// gowarp responder refuses gets the failing request completed with a
// remote access error, and its later work flushed.
func TestRemoteErrorCompletes(t *testing.T) {
	for _, op := range []gowarp.WROp{gowarp.OpRead, gowarp.OpWrite} {
		t.Run(op.String(), func(t *testing.T) {
			p := newPair(t, gowarp.ConnectOptions{})
			local, _ := p.reg(t, 64, gowarp.LocalWrite)
			remote, _ := p.reg(t, 64, gowarp.RemoteRead|gowarp.RemoteWrite)
			// The Write is unsignaled and completes when handed to TCP;
			// the Send behind it is still outstanding when the Terminate comes.
			p.a.PostSend(&gowarp.SendWR{ID: 1, Op: op, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: local, Length: 64}},
				RemoteAddr: remote.Addr() + 32, RKey: remote.STag()})
			first := wait(t, p.acq)
			if op == gowarp.OpRead {
				if first.ID != 1 || first.Status != gowarp.RemoteAccessError {
					t.Fatalf("read completed %+v, want remote access error", first)
				}
			}
			waitState(t, p.a, gowarp.StateError)
			waitState(t, p.b, gowarp.StateError)
			if err := p.a.Err(); !errors.Is(err, gowarp.ErrPeerTerminated) {
				t.Errorf("requester error %v", err)
			}
			if err := p.b.Err(); !errors.Is(err, gowarp.ErrTerminated) {
				t.Errorf("responder error %v", err)
			}
		})
	}
}

// TestSilentPeerDoesNotStallListener: connections that send nothing do
// not hold up a good client: it is accepted while they are all still
// waiting for their handshake, not after the listener gave up on them.
func TestSilentPeerDoesNotStallListener(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{})
	var silent []net.Conn
	for range 20 {
		c, err := net.Dial("tcp", s.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		silent = append(silent, c)
	}
	dialRaw(t, s.ln.Addr().String(), false, 1, 1)
	s.accepted(t)
	for i, c := range silent {
		c.SetReadDeadline(time.Now())
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("silent connection %d was dropped before the good client was accepted: %v", i, err)
		}
	}
}

// dialNoP2PPostHello dials a raw initiator without peer-to-peer mode to a
// server accepting with o, and posts a Send of "hello" on the responder's
// queue pair.
func dialNoP2PPostHello(t *testing.T, o gowarp.ConnectOptions) *rawPeer {
	t.Helper()
	s := newServer(t, o)
	p, rep := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
	if rep.P2P {
		t.Fatal("reply offers peer-to-peer mode to a request that did not ask")
	}
	qp := s.accepted(t)
	src, _ := s.pd.Register([]byte("hello"), 0)
	if err := qp.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: src, Length: 5}}}); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestResponderSilentUntilFirstFPDU: without peer-to-peer mode a responder
// sends nothing before the initiator's first FPDU (RFC 5044 §7.1.2; a siw
// initiator treats early bytes as a protocol error), even with a Send
// posted at once; the Send leaves as soon as the initiator has spoken.
func TestResponderSilentUntilFirstFPDU(t *testing.T) {
	p := dialNoP2PPostHello(t, gowarp.ConnectOptions{})
	p.c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := p.c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the responder sent %d bytes before the initiator's first FPDU (%v)", n, err)
	}
	p.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	p.write(1, 0, nil) // a zero-length Write: the initiator's first FPDU
	h, payload, err := p.next()
	if err != nil || h.Opcode != wire.OpSend || string(payload[:5]) != "hello" {
		t.Fatalf("after the first FPDU: %+v %q %v", h, payload, err)
	}
}

// TestResponderSendFirst: with SendFirst a responder without peer-to-peer
// mode sends before the initiator's first FPDU, as siw does (for
// perftest's write_lat, whose server Writes first), once SendFirstDelay
// has passed: not with the MPA reply, which siw's initiator refuses.
func TestResponderSendFirst(t *testing.T) {
	for _, d := range []time.Duration{0, -1} { // the default 20 ms, and none
		p := dialNoP2PPostHello(t, gowarp.ConnectOptions{SendFirst: true, SendFirstDelay: d})
		p.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		h, payload, err := p.next()
		if err != nil || h.Opcode != wire.OpSend || string(payload[:5]) != "hello" {
			t.Fatalf("SendFirstDelay %v: the responder's first FPDU: %+v %q %v", d, h, payload, err)
		}
	}
	// Bytes within the first 500 ms are too early for a 2 s delay, however
	// slow the dial was.
	p := dialNoP2PPostHello(t, gowarp.ConnectOptions{SendFirst: true, SendFirstDelay: 2 * time.Second})
	p.c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := p.c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the responder sent %d bytes within its SendFirstDelay (%v)", n, err)
	}
	p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	h, payload, err := p.next()
	if err != nil || h.Opcode != wire.OpSend || string(payload[:5]) != "hello" {
		t.Fatalf("after SendFirstDelay, the initiator silent: %+v %q %v", h, payload, err)
	}

	// A Disconnect right after the post, within the delay, still lets
	// the Send leave once the delay is over, then closes.
	srv := newServer(t, gowarp.ConnectOptions{SendFirst: true, SendFirstDelay: 300 * time.Millisecond})
	p, _ = dialRaw(t, srv.ln.Addr().String(), false, 1, 1)
	qp := srv.accepted(t)
	src, _ := srv.pd.Register([]byte("hello"), 0)
	if err := qp.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: src, Length: 5}}}); err != nil {
		t.Fatal(err)
	}
	disc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		disc <- qp.Disconnect(ctx)
	}()
	p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if h, payload, err := p.next(); err != nil || h.Opcode != wire.OpSend || string(payload[:5]) != "hello" {
		t.Fatalf("disconnecting within SendFirstDelay: %+v %q %v, want the Send", h, payload, err)
	}
	if err := <-disc; err != nil {
		t.Errorf("Disconnect: %v", err)
	}

	// An initiator that speaks first ends the wait.
	p = dialNoP2PPostHello(t, gowarp.ConnectOptions{SendFirst: true, SendFirstDelay: time.Hour})
	p.write(1, 0, nil) // a zero-length Write
	p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if h, payload, err := p.next(); err != nil || h.Opcode != wire.OpSend || string(payload[:5]) != "hello" {
		t.Fatalf("after the initiator's first FPDU: %+v %q %v", h, payload, err)
	}
}
