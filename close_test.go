package gowarp_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	reps := 10
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

// TestCloseBoundedForSilentPeer: a peer that stops reading cannot hold up
// Close while a Terminate waits behind Read Responses the socket cannot
// take: Close gives the Terminate up after its deadline and returns.
// It is a hang guard for Close's wait on a pending Terminate, not a
// regression test: before that wait existed Close never waited, so this
// test passed then too.
func TestCloseBoundedForSilentPeer(t *testing.T) {
	t.Parallel() // most of it is the Terminate's deadline
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

// TestDeliveredSendCompletes: a request/reply where the server replies 8 ms
// after the request and the client closes the moment it has the reply.
// The server's signaled Send reached the client, so it must complete
// successfully in both modes: in Handed mode its bytes were taken by the
// socket, in Acked mode the client's TCP acknowledged them (its FIN did,
// if nothing before). Before the fix the failure's flush overtook the
// completion in a few sessions of a hundred.
func TestDeliveredSendCompletes(t *testing.T) {
	sessions := 300
	if testing.Short() {
		sessions = 30
	}
	for _, mode := range []gowarp.CompletionMode{gowarp.Handed, gowarp.Acked} {
		t.Run(mode.String(), func(t *testing.T) {
			dev := gowarp.Open()
			pd := dev.AllocPD()
			// Sessions run a few at a time (the server's think time is
			// sleep), each runner with its own listener.
			var flushed atomic.Int32
			var wg sync.WaitGroup
			next := make(chan int)
			for range 6 {
				ln, err := dev.Listen("127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				wg.Go(func() {
					for i := range next {
						if err := requestReply(dev, pd, ln, mode); err != nil {
							if !errors.Is(err, gowarp.WRFlushError) {
								t.Errorf("session %d: %v", i, err)
							}
							flushed.Add(1)
						}
					}
				})
			}
			for i := range sessions {
				next <- i
			}
			close(next)
			wg.Wait()
			if flushed := flushed.Load(); flushed > 0 {
				t.Errorf("%d of %d delivered replies completed flushed", flushed, sessions)
			}
		})
	}
}

// requestReply runs one session of TestDeliveredSendCompletes and returns
// the error of the server's reply completion.
func requestReply(dev *gowarp.Device, pd *gowarp.PD, ln *gowarp.Listener, mode gowarp.CompletionMode) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const size = 16
	newQP := func() (*gowarp.QP, *gowarp.CQ, *gowarp.MR, *gowarp.MR, error) {
		cq := dev.NewCQ(8)
		qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, SendDepth: 4, RecvDepth: 4, Completion: mode})
		if err != nil {
			return nil, nil, nil, nil, err
		}
		in, _ := pd.Register(make([]byte, size), gowarp.LocalWrite)
		out, _ := pd.Register(make([]byte, size), 0)
		return qp, cq, in, out, qp.PostRecv(&gowarp.RecvWR{ID: 10, SGL: []gowarp.SGE{{MR: in, Length: size}}})
	}
	next := func(cq *gowarp.CQ, op gowarp.CompletionOp) (gowarp.Completion, error) {
		var wc [1]gowarp.Completion
		for {
			for cq.Poll(wc[:]) == 1 {
				if wc[0].Op == op || wc[0].Err() != nil {
					return wc[0], nil
				}
			}
			if err := cq.Wait(ctx); err != nil {
				return wc[0], err
			}
		}
	}
	type result struct {
		c   gowarp.Completion
		err error
	}
	server := make(chan result, 1)
	go func() {
		qp, cq, _, out, err := newQP()
		if err != nil {
			server <- result{err: err}
			return
		}
		defer qp.Close()
		req, err := ln.Accept(ctx)
		if err == nil {
			err = req.Accept(ctx, qp, gowarp.ConnectOptions{})
		}
		var c gowarp.Completion
		if err == nil {
			c, err = next(cq, gowarp.CompRecv)
		}
		if err == nil && c.Err() != nil {
			err = fmt.Errorf("request: %w", c.Err())
		}
		if err != nil {
			server <- result{err: err}
			return
		}
		time.Sleep(8 * time.Millisecond) // the server thinks
		if err := qp.PostSend(&gowarp.SendWR{ID: 20, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: out, Length: size}}}); err != nil {
			server <- result{err: err}
			return
		}
		c, err = next(cq, gowarp.CompSend)
		server <- result{c, err}
	}()
	qp, cq, _, out, err := newQP()
	if err != nil {
		return err
	}
	if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{}); err != nil {
		qp.Close()
		return err
	}
	err = qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: out, Length: size}}})
	var c gowarp.Completion
	if err == nil {
		c, err = next(cq, gowarp.CompRecv)
	}
	qp.Close() // as soon as the reply is in
	if err == nil && (c.Err() != nil || c.Bytes != size) {
		err = fmt.Errorf("client's reply completion %+v", c)
	}
	r := <-server
	if err != nil {
		return fmt.Errorf("client: %v", err) // not the error the test counts
	}
	if r.err != nil {
		return fmt.Errorf("server: %v", r.err)
	}
	if r.c.ID != 20 || r.c.Op != gowarp.CompSend {
		return fmt.Errorf("server completion %+v, want the reply's", r.c)
	}
	return r.c.Err()
}
