package rpc

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// rawServer is a hand-made server: it accepts one session, receives one
// call and hands it to the test, which may then try RDMA on its own.
type rawServer struct {
	qp   *gowarp.QP
	cq   *gowarp.CQ
	pd   *gowarp.PD
	mr   *gowarp.MR
	buf  []byte
	call callMsg
}

func serveRaw(t *testing.T) (string, chan *rawServer) {
	t.Helper()
	dev := gowarp.Open(gowarp.WithLogger(quiet))
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	out := make(chan *rawServer, 1)
	go func() {
		req, err := ln.Accept(context.Background())
		if err != nil {
			close(out)
			return
		}
		s := &rawServer{pd: dev.AllocPD(), cq: dev.NewCQ(64), buf: make([]byte, 1<<20)}
		s.qp, _ = s.pd.NewQP(gowarp.QPConfig{SendCQ: s.cq, RecvCQ: s.cq})
		s.mr, _ = s.pd.Register(s.buf, gowarp.LocalWrite)
		// Room for the call and for cancels, each in its own place: a
		// cancel landing while the call is read must not write over it.
		for i := range 8 {
			s.qp.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: s.mr, Offset: 64<<10 + i*defaultMsg, Length: defaultMsg}}})
		}
		hi := hello{Slots: 4, MaxMessage: defaultMsg, Session: 42}.append(nil)
		if err := req.Accept(context.Background(), s.qp, gowarp.ConnectOptions{PrivateData: hi}); err != nil {
			close(out)
			return
		}
		var wc [4]gowarp.Completion
		for {
			if err := s.cq.Wait(context.Background()); err != nil {
				close(out)
				return
			}
			n := s.cq.Poll(wc[:])
			for _, c := range wc[:n] {
				if c.Op == gowarp.CompRecv && c.Err() == nil {
					at := 64<<10 + int(c.ID)*defaultMsg
					s.call, _ = parseCall(bytes.Clone(s.buf[at : at+c.Bytes]))
					out <- s
					return
				}
			}
		}
	}()
	return ln.Addr().String(), out
}

// read issues an RDMA Read of n bytes at addr of the client and waits.
func (s *rawServer) read(t *testing.T, h Handle, addr uint64, n int) error {
	t.Helper()
	if err := s.qp.PostSend(&gowarp.SendWR{ID: 9, Op: gowarp.OpRead, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: s.mr, Length: n}}, RemoteAddr: addr, RKey: gowarp.STag(h.STag)}); err != nil {
		return err
	}
	var wc [4]gowarp.Completion
	for {
		if err := s.cq.Wait(context.Background()); err != nil {
			return err
		}
		for _, c := range wc[:s.cq.Poll(wc[:])] {
			if c.ID == 9 {
				return c.Err()
			}
		}
	}
}

// TestMaliciousServerBeyondSpan: a server that bypasses this package and
// Reads past the span a call lent finds nothing there: the client's
// engine refuses it and ends the session, the call fails with
// ErrSessionClosed, and the bytes next to the span never leave.
func TestMaliciousServerBeyondSpan(t *testing.T) {
	addr, srvc := serveRaw(t)
	cl, err := Dial(context.Background(), gowarp.Open(gowarp.WithLogger(quiet)), addr, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	b, _ := cl.Alloc(8192)
	copy(b.Bytes(), "lent")
	copy(b.Bytes()[4096:], "not lent")
	errc := make(chan error, 1)
	go func() { errc <- cl.Do(context.Background(), &Call{Method: "m", Refs: []Span{b.Span(0, 4096)}}) }()
	s := <-srvc
	if s == nil {
		t.Fatal("no call reached the raw server")
	}
	h := s.call.Ref(0)
	if h.Len != 4096 || h.Session != 42 {
		t.Fatalf("handle %+v", h)
	}
	if err := s.read(t, h, h.Addr, 4); err != nil || string(s.buf[:4]) != "lent" {
		t.Fatalf("read inside the span: %q %v", s.buf[:4], err)
	}
	clear(s.buf)
	err = s.read(t, h, h.Addr+4096, 8)
	if !errors.Is(err, gowarp.RemoteAccessError) {
		t.Fatalf("a Read past the span: %v", err)
	}
	if bytes.Contains(s.buf, []byte("not lent")) {
		t.Fatal("bytes past the span reached the server")
	}
	if err := <-errc; !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("the call: %v", err)
	}
}

// TestMaliciousServerAfterCall: once a call is given up on, its span is
// out of the server's reach: a server that kept the handle and Reads it
// again gets none of its bytes (the window is detached, so the session
// survives the Read the server may have had in flight), and once the
// server has replied to the call the window is gone: a Read is refused by
// the client's engine.
func TestMaliciousServerAfterCall(t *testing.T) {
	addr, srvc := serveRaw(t)
	cl, err := Dial(context.Background(), gowarp.Open(gowarp.WithLogger(quiet)), addr, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	b, _ := cl.Alloc(4096)
	copy(b.Bytes(), "secret")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- cl.Do(ctx, &Call{Method: "m", Refs: []Span{b.All()}}) }()
	s := <-srvc
	if s == nil {
		t.Fatal("no call reached the raw server")
	}
	cancel() // the caller gives up: Do detaches the span before it returns
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the call: %v", err)
	}
	h := s.call.Ref(0)
	if err := s.read(t, h, h.Addr, 6); err != nil || bytes.HasPrefix(s.buf, []byte("secret")) {
		t.Fatalf("a Read after the call was given up on: %q %v", s.buf[:6], err)
	}
	// The server replies to the call: the client deregisters the window.
	r := appendReplyHeader(s.buf[:0], s.call.ID, statusCanceled, 0, 0)
	if err := s.qp.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: s.mr, Length: len(r)}}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		err := s.read(t, h, h.Addr, 6)
		if bytes.HasPrefix(s.buf, []byte("secret")) {
			t.Fatal("a Read after the reply returned the span's bytes")
		}
		if err != nil {
			if !errors.Is(err, gowarp.RemoteAccessError) {
				t.Fatalf("a Read after the reply: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the window outlived the call's reply")
		}
		time.Sleep(time.Millisecond)
	}
}
