package gowarp_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// TestQPDone: QP.Done stays open while the queue pair is ready and idle,
// and closes, with Err saying why, however the queue pair leaves: the
// peer closes, resets or sends bad input, or the application closes or
// disconnects. The queue pairs here hold no work, so nothing completes on
// their CQs: Done is all a passive side, which only exposes memory, has.
func TestQPDone(t *testing.T) {
	ended := func(t *testing.T, qp *gowarp.QP, want error) {
		t.Helper()
		select {
		case <-qp.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("Done still open 10 s on (state %v, err %v)", qp.State(), qp.Err())
		}
		if s := qp.State(); s != gowarp.StateError {
			t.Errorf("Done closed in state %v", s)
		}
		if err := qp.Err(); !errors.Is(err, want) {
			t.Errorf("Err %v, want %v", err, want)
		}
	}
	open := func(t *testing.T, qp *gowarp.QP) {
		t.Helper()
		select {
		case <-qp.Done():
			t.Fatalf("Done closed on a ready queue pair (err %v)", qp.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}

	t.Run("peer closes", func(t *testing.T) {
		p := newPair(t, gowarp.ConnectOptions{})
		open(t, p.a)
		p.b.Close()
		ended(t, p.a, gowarp.ErrPeerClosed)
		ended(t, p.b, gowarp.ErrClosed)
	})
	t.Run("close", func(t *testing.T) {
		p := newPair(t, gowarp.ConnectOptions{})
		p.a.Close()
		select {
		case <-p.a.Done():
		default:
			t.Fatal("Done open after Close returned")
		}
		ended(t, p.a, gowarp.ErrClosed)
	})
	t.Run("disconnect", func(t *testing.T) {
		p := newPair(t, gowarp.ConnectOptions{})
		if err := p.a.Disconnect(boundedCtx(t)); err != nil {
			t.Fatal(err)
		}
		ended(t, p.a, gowarp.ErrClosed)
		ended(t, p.b, gowarp.ErrPeerClosed)
	})
	t.Run("never connected", func(t *testing.T) {
		p := newIdlePair(t, 4)
		open(t, p.a)
		p.a.Close()
		ended(t, p.a, gowarp.ErrClosed)
	})
	t.Run("peer resets", func(t *testing.T) {
		s := newServer(t, gowarp.ConnectOptions{})
		peer, _ := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
		qp := s.accepted(t)
		open(t, qp)
		peer.c.(*net.TCPConn).SetLinger(0) // an RST, as from a process killed
		peer.c.Close()
		ended(t, qp, gowarp.ErrLinkLost)
	})
	t.Run("bad input", func(t *testing.T) {
		s := newServer(t, gowarp.ConnectOptions{})
		peer, _ := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
		qp := s.accepted(t)
		open(t, qp)
		peer.write(0x12345600, 0, []byte("no such STag")) // not registered
		ended(t, qp, gowarp.ErrTerminated)
		if term := peer.terminate(); !errors.Is(&term.Err, wire.ErrDDPInvalidSTag) {
			t.Errorf("Terminate %v, want invalid STag", &term.Err)
		}
	})
}
