package gowarp_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// pair is two connected queue pairs over loopback, each with its own CQ.
type pair struct {
	dev      *gowarp.Device
	pd       *gowarp.PD
	a, b     *gowarp.QP
	acq, bcq *gowarp.CQ
}

func newPair(t testing.TB, o gowarp.ConnectOptions) *pair {
	t.Helper()
	return newPairOn(t, o, "127.0.0.1:0", nil, nil)
}

// newPairOn connects two QPs; the listener is made on listenAddr inside
// inA and the connection dialled inside inB (nil: the current namespace).
func newPairOn(t testing.TB, o gowarp.ConnectOptions, listenAddr string, inA, inB func(func() error) error) *pair {
	t.Helper()
	if inA == nil {
		inA = func(f func() error) error { return f() }
	}
	if inB == nil {
		inB = inA
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := &pair{dev: gowarp.Open()}
	p.pd = p.dev.AllocPD()
	p.acq, p.bcq = p.dev.NewCQ(1024), p.dev.NewCQ(1024)
	var err error
	if p.a, err = p.pd.NewQP(gowarp.QPConfig{SendCQ: p.acq, RecvCQ: p.acq}); err != nil {
		t.Fatal(err)
	}
	if p.b, err = p.pd.NewQP(gowarp.QPConfig{SendCQ: p.bcq, RecvCQ: p.bcq}); err != nil {
		t.Fatal(err)
	}
	var ln *gowarp.Listener
	err = inA(func() (err error) {
		ln, err = p.dev.Listen(listenAddr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			errc <- err
			return
		}
		errc <- req.Accept(ctx, p.b, o)
	}()
	if err := inB(func() error { return p.a.Connect(ctx, ln.Addr().String(), o) }); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.a.Close(); p.b.Close() })
	return p
}

func (p *pair) reg(t testing.TB, n int, acc gowarp.Access) (*gowarp.MR, []byte) {
	t.Helper()
	buf := make([]byte, n)
	mr, err := p.pd.Register(buf, acc)
	if err != nil {
		t.Fatal(err)
	}
	return mr, buf
}

func wait(t testing.TB, cq *gowarp.CQ) gowarp.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]gowarp.Completion
	for {
		if cq.Poll(wc[:]) == 1 {
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
	}
}

func TestWriteReadSendLoopback(t *testing.T) {
	for _, crc := range []bool{false, true} {
		p := newPair(t, gowarp.ConnectOptions{CRC: crc})
		const n = 300000
		src, sbuf := p.reg(t, n, gowarp.LocalWrite)
		dst, dbuf := p.reg(t, n, gowarp.RemoteWrite|gowarp.RemoteRead|gowarp.LocalWrite)
		for i := range sbuf {
			sbuf[i] = byte(i * 7)
		}
		if err := p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.acq); c.Status != gowarp.Success || c.ID != 1 || c.Op != gowarp.CompWrite {
			t.Fatalf("write completion %+v", c)
		}
		// A Read after the Write sees it.
		back, bbuf := p.reg(t, n, gowarp.LocalWrite)
		if err := p.a.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: back, Length: n}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.acq); c.Status != gowarp.Success || c.ID != 2 {
			t.Fatalf("read completion %+v", c)
		}
		// The responder placed the Write before it answered the Read; its
		// Placed counter is the synchronisation point for reading dbuf.
		if got := dst.Placed(); got != n {
			t.Fatalf("responder region placed %d bytes, want %d", got, n)
		}
		if !bytes.Equal(bbuf, sbuf) || !bytes.Equal(dbuf, sbuf) {
			t.Fatal("data differs")
		}
		// Send/Recv.
		rmr, rbuf := p.reg(t, n, gowarp.LocalWrite)
		if err := p.b.PostRecv(&gowarp.RecvWR{ID: 9, SGL: []gowarp.SGE{{MR: rmr, Length: n}}}); err != nil {
			t.Fatal(err)
		}
		if err := p.a.PostSend(&gowarp.SendWR{ID: 3, Op: gowarp.OpSend, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Length: 100000}}}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.bcq); c.Status != gowarp.Success || c.ID != 9 || c.Bytes != 100000 {
			t.Fatalf("recv completion %+v", c)
		}
		if c := wait(t, p.acq); c.Status != gowarp.Success || c.ID != 3 {
			t.Fatalf("send completion %+v", c)
		}
		if !bytes.Equal(rbuf[:100000], sbuf[:100000]) {
			t.Fatal("send data differs")
		}
	}
}
