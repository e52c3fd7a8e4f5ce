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
