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

// eventLog reads a device's events and hands them out per queue pair, in
// order, keeping those of other queue pairs for later.
type eventLog struct {
	dev     *gowarp.Device
	pending []gowarp.Event
}

// next returns the next event about qp (with qp nil: any event).
func (l *eventLog) next(t *testing.T, qp *gowarp.QP) gowarp.Event {
	t.Helper()
	for i, e := range l.pending {
		if qp == nil || e.QP == qp {
			l.pending = append(l.pending[:i], l.pending[i+1:]...)
			return e
		}
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e := <-l.dev.Events():
			if qp == nil || e.QP == qp {
				return e
			}
			l.pending = append(l.pending, e)
		case <-timeout:
			t.Fatalf("no event for %p", qp)
		}
	}
}

func (l *eventLog) expect(t *testing.T, qp *gowarp.QP, typ gowarp.EventType, errs ...error) {
	t.Helper()
	e := l.next(t, qp)
	if e.Type != typ {
		t.Fatalf("event %v (%v), want %v", e.Type, e.Err, typ)
	}
	for _, want := range errs {
		if !errors.Is(e.Err, want) {
			t.Fatalf("%v event's Err %v does not match %v", e.Type, e.Err, want)
		}
	}
}

// TestEventQPFatal: a QP that terminates its connection for bad peer
// input reports it, with the Terminate's reason, then its last WQE.
func TestEventQPFatal(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{})
	peer, _ := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
	qp := s.accepted(t)
	peer.write(0xdead00, 0, []byte("x"))
	ev := &eventLog{dev: s.dev}
	ev.expect(t, qp, gowarp.EventQPFatal, gowarp.ErrTerminated, wire.ErrDDPInvalidSTag)
	ev.expect(t, qp, gowarp.EventLastWQE, gowarp.ErrTerminated)
}

// TestEventPeerTerminated: the Terminate's receiver reports it with the
// peer's reason; its sender reports the fatal error.
func TestEventPeerTerminated(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	src, _ := p.reg(t, 8, 0)
	if err := p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 8}}, RKey: 0xbad00, RemoteAddr: 0}); err != nil {
		t.Fatal(err)
	}
	ev := &eventLog{dev: p.dev}
	ev.expect(t, p.a, gowarp.EventPeerTerminated, gowarp.ErrPeerTerminated, wire.ErrDDPInvalidSTag)
	ev.expect(t, p.a, gowarp.EventLastWQE)
	ev.expect(t, p.b, gowarp.EventQPFatal, gowarp.ErrTerminated, wire.ErrDDPInvalidSTag)
	ev.expect(t, p.b, gowarp.EventLastWQE)
}

// TestEventPeerClosed: closing one end reports a disconnect at the other,
// and only the last WQE (no failure) at the end that closed.
func TestEventPeerClosed(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	// b reads everything a sent (its ready-to-receive message too) before
	// it closes: a close with unread bytes sends a reset, not a FIN.
	rmr, _ := p.reg(t, 8, gowarp.LocalWrite)
	smr, _ := p.reg(t, 8, 0)
	p.b.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: rmr, Length: 8}}})
	p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: smr, Length: 8}}})
	if c := wait(t, p.bcq); c.Err() != nil {
		t.Fatal(c.Err())
	}
	p.b.Close()
	ev := &eventLog{dev: p.dev}
	ev.expect(t, p.b, gowarp.EventLastWQE, gowarp.ErrClosed)
	ev.expect(t, p.a, gowarp.EventPeerClosed, gowarp.ErrPeerClosed)
	ev.expect(t, p.a, gowarp.EventLastWQE, gowarp.ErrPeerClosed)
}

// TestEventLastWQE: when it arrives, every work request of the QP has
// completed: the posted receives' flush completions are all in the CQ.
func TestEventLastWQE(t *testing.T) {
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(64)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	mr, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
	const n = 10
	for i := range n {
		if err := qp.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: mr, Length: 64}}}); err != nil {
			t.Fatal(err)
		}
	}
	go qp.Close()
	ev := &eventLog{dev: dev}
	ev.expect(t, qp, gowarp.EventLastWQE, gowarp.ErrClosed)
	if cq.Len() != n {
		t.Fatalf("%d completions in the CQ at the last-WQE event, want %d", cq.Len(), n)
	}
	if err := mr.Deregister(); err != nil {
		t.Fatalf("region still pinned after the last WQE: %v", err)
	}
}

// TestEventCQOverrun: a completion that finds its CQ full is reported,
// once, naming the CQ.
func TestEventCQOverrun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	small, big := dev.NewCQ(1), dev.NewCQ(64)
	a, _ := pd.NewQP(gowarp.QPConfig{SendCQ: big, RecvCQ: big})
	b, _ := pd.NewQP(gowarp.QPConfig{SendCQ: big, RecvCQ: small})
	defer a.Close()
	defer b.Close()
	rmr, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
	for i := range 3 {
		b.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: rmr, Length: 64}}})
	}
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if req, err := ln.Accept(ctx); err == nil {
			req.Accept(ctx, b, gowarp.ConnectOptions{})
		}
	}()
	if err := a.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	smr, _ := pd.Register(make([]byte, 8), 0)
	for i := range 3 {
		if err := a.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: smr, Length: 8}}}); err != nil {
			t.Fatal(err)
		}
	}
	e := (&eventLog{dev: dev}).next(t, nil)
	if e.Type != gowarp.EventCQOverrun || e.CQ != small || e.QP != b || !errors.Is(e.Err, gowarp.ErrCQOverrun) {
		t.Fatalf("event %+v, want the overrun of the small CQ by b", e)
	}
	if err := small.Wait(ctx); !errors.Is(err, gowarp.ErrCQOverrun) {
		t.Fatalf("Wait on the overrun CQ: %v", err)
	}
	select {
	case e := <-dev.Events():
		if e.Type == gowarp.EventCQOverrun {
			t.Fatalf("second overrun event %+v", e)
		}
	case <-time.After(20 * time.Millisecond):
	}
	// b stays ready after the overrun; when it fails later, Err says why
	// it failed, not that it once lost a completion.
	a.Close()
	for b.State() != gowarp.StateError {
		if ctx.Err() != nil {
			t.Fatal("b did not fail after its peer closed")
		}
		time.Sleep(time.Millisecond)
	}
	if err := b.Err(); !errors.Is(err, gowarp.ErrPeerClosed) && !errors.Is(err, gowarp.ErrPeerTerminated) && !errors.Is(err, gowarp.ErrLinkLost) {
		t.Fatalf("b's Err after its peer closed: %v, want the peer's leaving", err)
	}
}

// TestEventsUnread: a device whose events nobody reads keeps working; the
// events past its buffer are dropped and counted.
func TestEventsUnread(t *testing.T) {
	dev := gowarp.Open(gowarp.WithEventBuffer(2))
	pd := dev.AllocPD()
	cq := dev.NewCQ(64)
	for range 5 {
		qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		qp.Close() // one last-WQE event each
	}
	if got := dev.DroppedEvents(); got != 3 {
		t.Fatalf("%d events dropped, want 3 (5 events, room for 2)", got)
	}
	for range 2 {
		if e := <-dev.Events(); e.Type != gowarp.EventLastWQE {
			t.Fatalf("event %v", e.Type)
		}
	}
}

// TestEventLinkLost: a connection reset by the peer is a fatal error whose
// reason matches ErrLinkLost.
func TestEventLinkLost(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{})
	peer, _ := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
	qp := s.accepted(t)
	peer.c.(*net.TCPConn).SetLinger(0) // close with a reset
	peer.c.Close()
	ev := &eventLog{dev: s.dev}
	ev.expect(t, qp, gowarp.EventQPFatal, gowarp.ErrLinkLost)
	ev.expect(t, qp, gowarp.EventLastWQE, gowarp.ErrLinkLost)
}
