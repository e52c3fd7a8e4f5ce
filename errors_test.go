package gowarp_test

import (
	"context"
	"errors"
	"math"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// TestErrorsMatchFromRoot provokes, through the public API, each error
// that used to reach users only as an internal package's value, and
// matches it with errors.Is against the root package's variable.
func TestErrorsMatchFromRoot(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		want error
		call func() error
	}{
		{"message of 4 GiB", gowarp.ErrTooLong, func() error {
			// One MiB registered 512 times over is a 512 MiB region that
			// costs 1 MiB; eight SGEs of it make 4 GiB.
			small := make([]byte, 1<<20)
			bufs := make([][]byte, 512)
			for i := range bufs {
				bufs[i] = small
			}
			mr, err := p.pd.RegisterBuffers(bufs, 0, gowarp.RegisterOptions{})
			if err != nil {
				return err
			}
			sgl := make([]gowarp.SGE, gowarp.MaxSGE)
			for i := range sgl {
				sgl[i] = gowarp.SGE{MR: mr, Length: mr.Len()}
			}
			return p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: sgl})
		}},
		{"responder ORD beyond 128", gowarp.ErrInsufficientIRD, func() error {
			addr, _ := rawResponder(t, net.ListenConfig{}, 16, 129)
			qp, err := p.pd.NewQP(gowarp.QPConfig{SendCQ: p.acq, RecvCQ: p.acq})
			if err != nil {
				return err
			}
			defer qp.Close()
			return qp.Connect(ctx, addr, gowarp.ConnectOptions{})
		}},
		{"Connect on a connected QP", gowarp.ErrBadState, func() error {
			return p.a.Connect(ctx, "127.0.0.1:1", gowarp.ConnectOptions{})
		}},
		{"QP without CQs", gowarp.ErrBadConfig, func() error {
			_, err := p.pd.NewQP(gowarp.QPConfig{})
			return err
		}},
		{"ConnectConn without a connection", gowarp.ErrBadConfig, func() error {
			qp, err := p.pd.NewQP(gowarp.QPConfig{SendCQ: p.acq, RecvCQ: p.acq})
			if err != nil {
				return err
			}
			defer qp.Close()
			return qp.ConnectConn(ctx, nil, gowarp.ConnectOptions{})
		}},
		{"ListenOn without a listener", gowarp.ErrBadConfig, func() error {
			_, err := p.dev.ListenOn(nil)
			return err
		}},
		{"ReadConnRequest without a connection", gowarp.ErrBadConfig, func() error {
			_, err := gowarp.ReadConnRequest(ctx, nil)
			return err
		}},
		{"Deregister twice", gowarp.ErrNotRegistered, func() error {
			mr, _ := p.reg(t, 8, 0)
			if err := mr.Deregister(); err != nil {
				return err
			}
			return mr.Deregister()
		}},
		{"Register nothing", gowarp.ErrEmptyBuffer, func() error {
			_, err := p.pd.Register(nil, gowarp.LocalWrite)
			return err
		}},
		{"Register with bad rights", gowarp.ErrBadAccess, func() error {
			_, err := p.pd.Register(make([]byte, 8), 0x80)
			return err
		}},
		{"Register past 2^64", gowarp.ErrAddrWrap, func() error {
			_, err := p.pd.RegisterBuffers([][]byte{make([]byte, 64)}, 0, gowarp.RegisterOptions{Addr: math.MaxUint64 - 8})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestTerminateReasonFromRoot: the reason of a Terminate this side sent is
// a *gowarp.TermError inside the QP's Err.
func TestTerminateReasonFromRoot(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{})
	peer, _ := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
	qp := s.accepted(t)
	peer.write(0xdead00, 0, []byte("x"))
	peer.terminate()
	waitState(t, qp, gowarp.StateError)
	var te *gowarp.TermError
	if err := qp.Err(); !errors.Is(err, gowarp.ErrTerminated) || !errors.As(err, &te) || !errors.Is(err, wire.ErrDDPInvalidSTag) {
		t.Fatalf("Err %v (TermError %v), want ErrTerminated with an invalid-STag TermError", err, te)
	}
}

// TestNilWorkRequest: posting or preparing a nil work request returns
// ErrNilWR, and the queue pair or session goes on working. It panicked
// holding the queue pair's lock: a program that recovered found every
// later call on the queue pair hung.
func TestNilWorkRequest(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	if err := p.a.PostSend(nil); !errors.Is(err, gowarp.ErrNilWR) {
		t.Errorf("PostSend(nil): %v, want ErrNilWR", err)
	}
	if err := p.b.PostRecv(nil); !errors.Is(err, gowarp.ErrNilWR) {
		t.Errorf("PostRecv(nil): %v, want ErrNilWR", err)
	}
	if _, err := p.a.Prepare(nil); !errors.Is(err, gowarp.ErrNilWR) {
		t.Errorf("Prepare(nil): %v, want ErrNilWR", err)
	}
	src, _ := p.reg(t, 64, 0)
	dst, _ := p.reg(t, 64, gowarp.LocalWrite)
	if err := p.b.PostRecv(&gowarp.RecvWR{ID: 2, SGL: []gowarp.SGE{{MR: dst, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	if err := p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.acq); c.ID != 1 || c.Status != gowarp.Success {
		t.Fatalf("Send after the nil posts: %+v", c)
	}
	if c := wait(t, p.bcq); c.ID != 2 || c.Status != gowarp.Success || c.Bytes != 8 {
		t.Fatalf("receive after the nil posts: %+v", c)
	}

	cli, _, _ := loopSession(t, gowarp.SessionConfig{})
	if err := cli.PostSend(nil); !errors.Is(err, gowarp.ErrNilWR) {
		t.Errorf("Session.PostSend(nil): %v, want ErrNilWR", err)
	}
	if err := cli.PostRecv(nil); !errors.Is(err, gowarp.ErrNilWR) {
		t.Errorf("Session.PostRecv(nil): %v, want ErrNilWR", err)
	}
}
