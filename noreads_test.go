package gowarp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// TestNoReadsNegotiated: IRD or ORD 0 asked for with NoReads, by either
// side, is what both sides settle on, and Reads are refused at post time
// on the side whose ORD is 0, while Writes and Sends go on working.
func TestNoReadsNegotiated(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		client, server       gowarp.ConnectOptions
		clientORD, serverORD int // settled
		clientIRD, serverIRD int
	}{
		{"client ORD 0", gowarp.ConnectOptions{ORD: gowarp.NoReads}, gowarp.ConnectOptions{}, 0, 16, 16, 16},
		{"client IRD 0", gowarp.ConnectOptions{IRD: gowarp.NoReads}, gowarp.ConnectOptions{}, 16, 0, 0, 16},
		{"server IRD 0", gowarp.ConnectOptions{}, gowarp.ConnectOptions{IRD: gowarp.NoReads}, 0, 16, 16, 0},
		{"server ORD 0", gowarp.ConnectOptions{}, gowarp.ConnectOptions{ORD: gowarp.NoReads}, 16, 0, 16, 16},
		{"all 0, perftest's write_bw", gowarp.ConnectOptions{IRD: gowarp.NoReads, ORD: gowarp.NoReads, NoP2P: true},
			gowarp.ConnectOptions{IRD: gowarp.NoReads, ORD: gowarp.NoReads}, 0, 0, 0, 0},
		{"all 0, peer-to-peer", gowarp.ConnectOptions{IRD: gowarp.NoReads, ORD: gowarp.NoReads},
			gowarp.ConnectOptions{IRD: gowarp.NoReads, ORD: gowarp.NoReads}, 0, 0, 0, 0},
		{"rev 1, client ORD 0", gowarp.ConnectOptions{MPARevision: 1, ORD: gowarp.NoReads}, gowarp.ConnectOptions{}, 0, 16, 16, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPairOpts(t, tc.client, tc.server)
			ca, sb := p.a.Params(), p.b.Params()
			if ca.ORD != tc.clientORD || ca.IRD != tc.clientIRD || sb.ORD != tc.serverORD || sb.IRD != tc.serverIRD {
				t.Fatalf("settled client IRD/ORD %d/%d, server %d/%d; want %d/%d, %d/%d",
					ca.IRD, ca.ORD, sb.IRD, sb.ORD, tc.clientIRD, tc.clientORD, tc.serverIRD, tc.serverORD)
			}
			for _, side := range []struct {
				qp  *gowarp.QP
				cq  *gowarp.CQ
				ord int
			}{{p.a, p.acq, ca.ORD}, {p.b, p.bcq, sb.ORD}} {
				src, _ := p.reg(t, 64, gowarp.RemoteRead|gowarp.RemoteWrite)
				sink, _ := p.reg(t, 64, gowarp.LocalWrite)
				read := gowarp.SendWR{ID: 7, Op: gowarp.OpRead, Flags: gowarp.Signaled,
					SGL: []gowarp.SGE{{MR: sink, Length: 64}}, RemoteAddr: src.Addr(), RKey: src.STag()}
				err := side.qp.PostSend(&read)
				pre, perr := side.qp.Prepare(&read)
				if perr != nil {
					t.Fatal(perr)
				}
				if side.ord == 0 {
					if !errors.Is(err, gowarp.ErrZeroORD) {
						t.Fatalf("Read posted at ORD 0: %v, want ErrZeroORD", err)
					}
					if err := pre.Post(8, true); !errors.Is(err, gowarp.ErrZeroORD) {
						t.Fatalf("prepared Read posted at ORD 0: %v, want ErrZeroORD", err)
					}
				} else {
					if err != nil {
						t.Fatal(err)
					}
					if c := wait(t, side.cq); c.Err() != nil {
						t.Fatalf("Read at ORD %d: %v", side.ord, c.Err())
					}
				}
				pre.Release()
				// Writes still work.
				if err := side.qp.PostSend(&gowarp.SendWR{ID: 9, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
					SGL: []gowarp.SGE{{MR: sink, Length: 64}}, RemoteAddr: src.Addr(), RKey: src.STag()}); err != nil {
					t.Fatal(err)
				}
				if c := wait(t, side.cq); c.Err() != nil || c.ID != 9 {
					t.Fatalf("Write: %+v", c)
				}
			}
		})
	}
}

// TestNoReadsOnTheWire: the zeros travel in the MPA frames' IRD/ORD words
// (RFC 6581), both ways: a gowarp client's request, and a gowarp server's
// reply to a peer asking 0/0 as perftest's write_bw client does.
func TestNoReadsOnTheWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Client → a raw responder that records the request.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	reqc := make(chan wire.MPAFrame, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		f, err := readMPAFrame(c)
		if err != nil {
			t.Error(err)
			return
		}
		reqc <- f
		rep, _ := (&wire.MPAFrame{Reply: true, Revision: 2, Enhanced: true, IRD: 0, ORD: 0}).Append(nil)
		c.Write(rep)
		io.Copy(io.Discard, c)
	}()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(8)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer qp.Close()
	if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{IRD: gowarp.NoReads, ORD: gowarp.NoReads, NoP2P: true}); err != nil {
		t.Fatal(err)
	}
	if f := <-reqc; !f.Enhanced || f.IRD != 0 || f.ORD != 0 {
		t.Fatalf("request IRD/ORD %d/%d (enhanced %v), want 0/0", f.IRD, f.ORD, f.Enhanced)
	}

	// A perftest-like initiator asking 0/0 → a gowarp server with the
	// defaults: the reply's ORD is 0 (capped by the initiator's IRD).
	s := newServer(t, gowarp.ConnectOptions{})
	_, rep := dialRaw(t, s.ln.Addr().String(), false, 0, 0)
	sqp := s.accepted(t)
	if rep.ORD != 0 || sqp.Params().ORD != 0 {
		t.Fatalf("reply ORD %d, server ORD %d; want 0", rep.ORD, sqp.Params().ORD)
	}
	mr, _ := s.pd.Register(make([]byte, 8), gowarp.LocalWrite)
	if err := sqp.PostSend(&gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: mr, Length: 8}}, RKey: 1}); !errors.Is(err, gowarp.ErrZeroORD) {
		t.Fatalf("server Read toward an IRD 0 peer: %v, want ErrZeroORD", err)
	}
}

// TestReadAtIRDZeroTerminates: a gowarp server that said IRD 0 replies
// IRD 0 even to a peer asking to read (no lifting), and answers a Read
// Request sent anyway with RFC 5040's Terminate (RDMAP remote operation
// error, localized to the stream).
func TestReadAtIRDZeroTerminates(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{IRD: gowarp.NoReads})
	src, _ := s.pd.Register(make([]byte, 64), gowarp.RemoteRead)
	peer, rep := dialRaw(t, s.ln.Addr().String(), false, 1, 4)
	qp := s.accepted(t)
	if rep.IRD != 0 || qp.Params().IRD != 0 {
		t.Fatalf("reply IRD %d, server IRD %d; want 0", rep.IRD, qp.Params().IRD)
	}
	peer.readReq(wire.ReadRequest{SinkSTag: 7, Size: 64, SourceSTag: uint32(src.STag()), SourceTO: src.Addr()})
	term := peer.terminate()
	if !errors.Is(&term.Err, wire.ErrRDMAPStream) {
		t.Fatalf("Terminate %v, want %v", &term.Err, wire.ErrRDMAPStream)
	}
	if h, ok := term.DDPHeader(); !ok || h.Opcode != wire.OpReadRequest {
		t.Errorf("Terminate echoes %+v (%v), want the Read Request's header", h, ok)
	}
	waitState(t, qp, gowarp.StateError)
	if err := qp.Err(); !errors.Is(err, gowarp.ErrTerminated) || !errors.Is(err, wire.ErrRDMAPStream) {
		t.Fatalf("QP error %v", err)
	}
}

// TestNoReadsInitiatorRefusesReader: a client that asked for IRD 0 does
// not let a responder that insists on reading (reply ORD 1) in, and tells
// it why with RFC 6581's Terminate (MPA, insufficient IRD).
func TestNoReadsInitiatorRefusesReader(t *testing.T) {
	addr, conns := rawResponder(t, net.ListenConfig{}, 16, 1)
	connectTerminated(t, addr, conns, gowarp.ConnectOptions{IRD: gowarp.NoReads, NoP2P: true}, gowarp.ErrInsufficientIRD, wire.ErrMPAInsufficientIRD)
}

// connectTerminated connects a new queue pair to addr with o and checks
// that Connect fails with wantErr and that the raw peer, whose connection
// arrives on conns, is sent a Terminate carrying wantTerm.
func connectTerminated(t *testing.T, addr string, conns <-chan net.Conn, o gowarp.ConnectOptions, wantErr, wantTerm error) {
	t.Helper()
	dev := gowarp.Open()
	cq := dev.NewCQ(8)
	qp, _ := dev.AllocPD().NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer qp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := qp.Connect(ctx, addr, o); !errors.Is(err, wantErr) {
		t.Fatalf("Connect: %v, want %v", err, wantErr)
	}
	c := <-conns
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	term := (&rawPeer{t: t, c: c}).terminate()
	if !errors.Is(&term.Err, wantTerm) {
		t.Fatalf("Terminate %v, want %v", &term.Err, wantTerm)
	}
}

// TestNoMatchingRTRTerminates: a peer-to-peer reply that picks a
// ready-to-receive message the initiator did not offer (a Send; or a Read
// where the initiator has ORD 0) fails Connect and is answered with RFC
// 6581's Terminate (MPA, no matching RTR).
func TestNoMatchingRTRTerminates(t *testing.T) {
	for _, tc := range []struct {
		name string
		ord  int
		rtr  wire.RTR
	}{{"Send RTR", 0, wire.RTRSend}, {"Read RTR at ORD 0", gowarp.NoReads, wire.RTRRead}} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			conns := make(chan net.Conn, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if _, err := readMPAFrame(c); err != nil {
					c.Close()
					return
				}
				rep, _ := (&wire.MPAFrame{Reply: true, Revision: 2, Enhanced: true, IRD: 1, ORD: 0, P2P: true, RTR: tc.rtr}).Append(nil)
				c.Write(rep)
				conns <- c
			}()
			connectTerminated(t, ln.Addr().String(), conns, gowarp.ConnectOptions{ORD: tc.ord}, gowarp.ErrMPAProtocol, wire.ErrMPANoMatchingRTR)
		})
	}
}
