package gowarp_test

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// connectToRaw connects a queue pair to a raw responder (which replies to
// the MPA request and then reads only when the test does) and sends
// "hello"; it returns the queue pair and the responder's side.
func connectToRaw(t *testing.T, o gowarp.ConnectOptions) (*gowarp.QP, *gowarp.PD, *gowarp.CQ, *rawPeer) {
	t.Helper()
	addr, conns := rawResponder(t, net.ListenConfig{}, 1, 1)
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(16)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qp.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := qp.Connect(ctx, addr, o); err != nil {
		t.Fatal(err)
	}
	c := <-conns
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	p := &rawPeer{t: t, c: c, msn: [3]uint32{1, 1, 1}}
	src, _ := pd.Register([]byte("hello"), 0)
	if err := qp.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: src, Length: 5}}}); err != nil {
		t.Fatal(err)
	}
	if h, payload, err := p.next(); err != nil || h.Opcode != wire.OpSend || string(payload[:5]) != "hello" {
		t.Fatalf("first FPDU: %+v %q %v", h, payload, err)
	}
	return qp, pd, cq, p
}

// isNudge reports whether an FPDU is a zero-length Write to STag 1.
func isNudge(h wire.Header, rest []byte) bool {
	return h.Opcode == wire.OpWrite && h.STag == 1 && len(rest) == 0
}

// TestNudgeWakesSilentResponder: a responder that has not answered the
// first message (siw that missed it while accepting, docs/interop.md §1)
// gets zero-length Writes until it sends something, then no more.
func TestNudgeWakesSilentResponder(t *testing.T) {
	qp, pd, cq, p := connectToRaw(t, gowarp.ConnectOptions{NoP2P: true, NudgeEvery: 20 * time.Millisecond})
	for i := range 2 {
		h, rest, err := p.next()
		if err != nil || !isNudge(h, rest) {
			t.Fatalf("FPDU %d after the Send: %+v %x %v, want a zero-length Write to STag 1", i, h, rest, err)
		}
	}
	if n := qp.Nudges(); n < 2 {
		t.Errorf("Nudges() = %d, want at least 2", n)
	}
	// The responder answers. Once the answer has completed, at most the
	// one nudge the queue pair may have been framing meanwhile follows.
	mr, _ := pd.Register(make([]byte, 16), gowarp.LocalWrite)
	if err := qp.PostRecv(&gowarp.RecvWR{ID: 9, SGL: []gowarp.SGE{{MR: mr, Length: 16}}}); err != nil {
		t.Fatal(err)
	}
	p.sendMsg([]byte("answer"))
	if c := wait(t, cq); c.ID != 9 || c.Status != gowarp.Success {
		t.Fatalf("answer completed %+v", c)
	}
	sent := qp.Nudges()
	time.Sleep(300 * time.Millisecond) // 15 intervals
	if n := qp.Nudges(); n > sent+1 {
		t.Errorf("%d nudges after the answer, want at most one", n-sent)
	}
	for range qp.Nudges() - 2 {
		if h, rest, err := p.next(); err != nil || !isNudge(h, rest) {
			t.Fatalf("%+v %x %v, want a nudge", h, rest, err)
		}
	}
	p.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := p.c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("%d bytes more than the nudges counted (%v)", n, err)
	}
}

// TestNoNudge: with NoNudge the queue pair sends nothing it was not asked
// to, however long the responder stays silent.
func TestNoNudge(t *testing.T) {
	qp, _, _, p := connectToRaw(t, gowarp.ConnectOptions{NoP2P: true, NoNudge: true, NudgeEvery: 20 * time.Millisecond})
	p.c.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) // 25 intervals, past the last nudge there would be
	if n, err := p.c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("%d bytes after the Send with NoNudge (%v)", n, err)
	}
	if n := qp.Nudges(); n != 0 {
		t.Errorf("Nudges() = %d with NoNudge", n)
	}
}
