package gowarp_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// TestTerminateBeforeClose: a QP that meets bad input sends its Terminate
// even when the application closes the QP at once, on the flush
// completion or from another goroutine the moment the QP is in error.
// The peer must read the Terminate, with the right reason, before EOF,
// every time (before the fix it got a bare FIN in most sessions).
func TestTerminateBeforeClose(t *testing.T) {
	cases := []struct {
		name string
		send func(p *rawPeer, mr *gowarp.MR)
		want *wire.TermError
	}{
		{"write to unknown STag", func(p *rawPeer, _ *gowarp.MR) { p.write(0x00ffff00, 0, make([]byte, 8)) }, wire.ErrDDPInvalidSTag},
		// Most of its payload is still unread when the QP closes.
		{"long write to unknown STag", func(p *rawPeer, _ *gowarp.MR) { p.write(0x00ffff00, 0, make([]byte, 60000)) }, wire.ErrDDPInvalidSTag},
		{"write past the region", func(p *rawPeer, mr *gowarp.MR) { p.write(uint32(mr.STag()), mr.Addr()+60, make([]byte, 8)) }, wire.ErrDDPBaseBounds},
		{"read from unknown STag", func(p *rawPeer, _ *gowarp.MR) {
			p.readReq(wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: 0x00ffff00})
		}, wire.ErrRDMAPInvalidSTag},
		{"read past the region", func(p *rawPeer, mr *gowarp.MR) {
			p.readReq(wire.ReadRequest{SinkSTag: 7, Size: 65, SourceSTag: uint32(mr.STag()), SourceTO: mr.Addr()})
		}, wire.ErrRDMAPBaseBounds},
		{"send without a receive", func(p *rawPeer, _ *gowarp.MR) { p.sendMsg(make([]byte, 16)) }, wire.ErrDDPNoBuffer},
		{"send with wrong MSN", func(p *rawPeer, _ *gowarp.MR) {
			h := hdr(wire.OpSend)
			h.MSN = 5
			p.send(h, nil, make([]byte, 4))
		}, wire.ErrDDPInvalidMSN},
		{"send on the Read queue", func(p *rawPeer, _ *gowarp.MR) {
			h := hdr(wire.OpSend)
			h.MSN, h.QN = 1, 1
			p.send(h, nil, make([]byte, 4))
		}, wire.ErrDDPInvalidQN},
		{"unknown opcode", func(p *rawPeer, _ *gowarp.MR) {
			h := hdr(wire.OpSend)
			h.Opcode = 9
			p.send(h, nil, nil)
		}, wire.ErrRDMAPOpcode},
		{"RDMAP version 2", func(p *rawPeer, _ *gowarp.MR) {
			h := hdr(wire.OpWrite)
			h.RDMAPVersion = 2
			p.send(h, nil, nil)
		}, wire.ErrRDMAPVersion},
		{"DDP version 3 untagged", func(p *rawPeer, _ *gowarp.MR) {
			h := hdr(wire.OpSend)
			h.DDPVersion = 3
			p.send(h, nil, nil)
		}, wire.ErrDDPUntaggedVersion},
	}
	reps := 20
	if testing.Short() {
		reps = 3
	}
	for _, mode := range []string{"on the flush completion", "from another goroutine"} {
		t.Run(mode, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					dev := gowarp.Open()
					pd := dev.AllocPD()
					mr, err := pd.Register(make([]byte, 64), gowarp.RemoteRead|gowarp.RemoteWrite|gowarp.LocalWrite)
					if err != nil {
						t.Fatal(err)
					}
					ln, err := dev.Listen("127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					defer ln.Close()
					for i := range reps {
						closeAtOnce(t, dev, pd, ln, mr, mode == "from another goroutine", func(p *rawPeer) { tc.send(p, mr) }, tc.want, i)
						if t.Failed() {
							return
						}
					}
				})
			}
		})
	}
}

// closeAtOnce runs one session: the server QP has a Read outstanding (held,
// since the raw initiator has not spoken), the raw peer sends bad input,
// and the server application closes the QP as soon as it sees the Read
// flushed, or (byState) as soon as the QP is in error. The peer must read
// the Terminate before the connection ends.
func closeAtOnce(t *testing.T, dev *gowarp.Device, pd *gowarp.PD, ln *gowarp.Listener, mr *gowarp.MR, byState bool,
	send func(*rawPeer), want *wire.TermError, rep int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cq := dev.NewCQ(8)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, SendDepth: 4, RecvDepth: 4})
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan error, 1)
	closed := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err == nil {
			err = req.Accept(ctx, qp, gowarp.ConnectOptions{IRD: 1})
		}
		if err == nil {
			sink, _ := pd.Register(make([]byte, 8), gowarp.LocalWrite)
			err = qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpRead, Flags: gowarp.Signaled,
				SGL: []gowarp.SGE{{MR: sink, Length: 8}}, RemoteAddr: 0, RKey: 0x1234})
		}
		ready <- err
		if err != nil {
			qp.Close()
			closed <- err
			return
		}
		if byState {
			for qp.State() != gowarp.StateError && ctx.Err() == nil {
			}
			qp.Close()
			closed <- ctx.Err()
			return
		}
		var wc [1]gowarp.Completion
		for cq.Poll(wc[:]) == 0 {
			if err := cq.Wait(ctx); err != nil {
				qp.Close()
				closed <- err
				return
			}
		}
		qp.Close() // at once, as an application tearing down on a failure would
		if wc[0].ID != 1 || wc[0].Status != gowarp.WRFlushError {
			closed <- errors.New("read completed " + wc[0].Status.String() + ", want flushed")
			return
		}
		closed <- nil
	}()
	p, _ := dialRaw(t, ln.Addr().String(), false, 1, 1)
	defer p.c.Close()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	send(p)
	term, err := readTerminate(p)
	if err != nil {
		t.Errorf("session %d: %v", rep, err)
	} else if !errors.Is(&term.Err, want) {
		t.Errorf("session %d: Terminate reports %v, want %v", rep, &term.Err, want)
	}
	if err := <-closed; err != nil {
		t.Errorf("session %d: server: %v", rep, err)
	}
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

// TestCloseBoundedForSilentPeer: a peer that stops reading cannot hold up
// Close while a Terminate waits behind Read Responses the socket cannot
// take: Close gives the Terminate up after its deadline and returns.
func TestCloseBoundedForSilentPeer(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{IRD: 1})
	src, err := s.pd.Register(make([]byte, 32<<20), gowarp.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
	qp := s.accepted(t)
	// The first Read's 32 MiB fill both socket buffers once the response
	// has begun (its first FPDU read here); the second Read finds the IRQ
	// full, and its Terminate must wait behind the response.
	rr := wire.ReadRequest{SinkSTag: 7, Size: 32 << 20, SourceSTag: uint32(src.STag()), SourceTO: src.Addr()}
	p.readReq(rr)
	if h, _, err := p.next(); err != nil || h.Opcode != wire.OpReadResponse {
		t.Fatalf("first FPDU %+v, %v: want a Read Response", h, err)
	}
	p.readReq(rr)
	waitState(t, qp, gowarp.StateError)
	closed := make(chan struct{})
	go func() {
		qp.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close hangs on a peer that does not read")
	}
	if err := qp.Err(); !errors.Is(err, wire.ErrRDMAPStream) {
		t.Errorf("QP error %v, want the IRD overrun", err)
	}
}
