package gowarp_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

func fillPattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i)*31 + seed
	}
}

// TestScatterGather: Writes, Sends and Reads gather from and scatter to
// several SGEs, and receives scatter over several SGEs.
func TestScatterGather(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{CRC: true})
	src, sbuf := p.reg(t, 10000, gowarp.LocalWrite)
	fillPattern(sbuf, 1)
	sgl := []gowarp.SGE{{MR: src, Offset: 0, Length: 1000}, {MR: src, Offset: 5000, Length: 3}, {MR: src, Offset: 2000, Length: 4001}}
	want := append(append(append([]byte{}, sbuf[0:1000]...), sbuf[5000:5003]...), sbuf[2000:6001]...)

	dst, dbuf := p.reg(t, 6000, gowarp.RemoteWrite|gowarp.RemoteRead)
	p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: sgl, RemoteAddr: dst.Addr() + 10, RKey: dst.STag()})
	if c := wait(t, p.acq); c.Err() != nil || c.Bytes != len(want) {
		t.Fatalf("write %+v", c)
	}
	// Read it back into three pieces of another region (three Read Requests).
	back, bbuf := p.reg(t, 6000, gowarp.LocalWrite)
	rsgl := []gowarp.SGE{{MR: back, Offset: 100, Length: 7}, {MR: back, Offset: 0, Length: 1}, {MR: back, Offset: 200, Length: len(want) - 8}}
	p.a.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: rsgl, RemoteAddr: dst.Addr() + 10, RKey: dst.STag()})
	if c := wait(t, p.acq); c.Err() != nil || c.ID != 2 || c.Bytes != len(want) {
		t.Fatalf("read %+v", c)
	}
	if dst.Placed() != uint64(len(want)) {
		t.Fatalf("placed %d", dst.Placed())
	}
	if !bytes.Equal(dbuf[10:10+len(want)], want) {
		t.Fatal("written data differs")
	}
	got := append(append(append([]byte{}, bbuf[100:107]...), bbuf[0:1]...), bbuf[200:200+len(want)-8]...)
	if !bytes.Equal(got, want) {
		t.Fatal("read data differs")
	}
	// Send gathered, received scattered.
	r1, rb1 := p.reg(t, 100, gowarp.LocalWrite)
	r2, rb2 := p.reg(t, 10000, gowarp.LocalWrite)
	p.b.PostRecv(&gowarp.RecvWR{ID: 7, SGL: []gowarp.SGE{{MR: r1, Offset: 50, Length: 50}, {MR: r2, Length: 10000}}})
	p.a.PostSend(&gowarp.SendWR{ID: 3, Op: gowarp.OpSend, SGL: sgl})
	if c := wait(t, p.bcq); c.Err() != nil || c.ID != 7 || c.Bytes != len(want) || c.Op != gowarp.CompRecv {
		t.Fatalf("recv %+v", c)
	}
	if !bytes.Equal(append(append([]byte{}, rb1[50:]...), rb2[:len(want)-50]...), want) {
		t.Fatal("received data differs")
	}
}

// TestUnsignaledAndOrder: unsignaled work makes no completion, signaled
// work completes in posting order, and a Send posted after Writes reaches
// the peer only after the Writes are placed.
func TestUnsignaledAndOrder(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	src, sbuf := p.reg(t, 1<<20, gowarp.LocalWrite)
	fillPattern(sbuf, 9)
	dst, dbuf := p.reg(t, 1<<20, gowarp.RemoteWrite)
	rmr, _ := p.reg(t, 64, gowarp.LocalWrite)
	p.b.PostRecv(&gowarp.RecvWR{ID: 50, SGL: []gowarp.SGE{{MR: rmr, Length: 64}}})
	for i := range 16 {
		off := i << 16
		flags := gowarp.WRFlags(0)
		if i%4 == 3 {
			flags = gowarp.Signaled
		}
		if err := p.a.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpWrite, Flags: flags,
			SGL: []gowarp.SGE{{MR: src, Offset: off, Length: 1 << 16}}, RemoteAddr: dst.Addr() + uint64(off), RKey: dst.STag()}); err != nil {
			t.Fatal(err)
		}
	}
	p.a.PostSend(&gowarp.SendWR{ID: 99, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 8}}})
	for _, id := range []uint64{3, 7, 11, 15, 99} {
		if c := wait(t, p.acq); c.ID != id || c.Err() != nil {
			t.Fatalf("completion %+v, want ID %d", c, id)
		}
	}
	if n := p.acq.Len(); n != 0 {
		t.Fatalf("%d extra completions", n)
	}
	if c := wait(t, p.bcq); c.ID != 50 {
		t.Fatalf("recv %+v", c)
	}
	// The receive completed, so every earlier Write was placed.
	if dst.Placed() != 1<<20 || !bytes.Equal(dbuf, sbuf) {
		t.Fatalf("Writes not all placed before the Send completed: %d bytes", dst.Placed())
	}
}

// TestSendInvalidateAndSolicited: a Send with Invalidate kills an STag the
// receiver allowed to be invalidated and reports it; a solicited Send is
// flagged; invalidating a region that does not allow it terminates.
func TestSendInvalidateAndSolicited(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	src, _ := p.reg(t, 64, gowarp.LocalWrite)
	victim, _ := p.reg(t, 64, gowarp.RemoteWrite|gowarp.RemoteInvalidate)
	rmr, _ := p.reg(t, 64, gowarp.LocalWrite)
	for i := range 3 {
		p.b.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: rmr, Length: 64}}})
	}
	p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, Flags: gowarp.Solicited, SGL: []gowarp.SGE{{MR: src, Length: 4}}})
	if c := wait(t, p.bcq); !c.Solicited || c.Bytes != 4 {
		t.Fatalf("solicited recv %+v", c)
	}
	p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpSendInv, InvalidateSTag: victim.STag(), SGL: []gowarp.SGE{{MR: src, Length: 4}}})
	if c := wait(t, p.bcq); c.Invalidated != victim.STag() || c.Err() != nil {
		t.Fatalf("recv with invalidate %+v", c)
	}
	if victim.Valid() {
		t.Fatal("STag still valid after Send with Invalidate")
	}
	// Writing to the dead STag now fails at the peer.
	p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 4}}, RemoteAddr: victim.Addr(), RKey: victim.STag()})
	waitState(t, p.b, gowarp.StateError)
	if !errors.Is(p.b.Err(), wire.ErrDDPInvalidSTag) {
		t.Fatalf("responder error %v", p.b.Err())
	}

	q := newPair(t, gowarp.ConnectOptions{})
	src, _ = q.reg(t, 64, gowarp.LocalWrite)
	keep, _ := q.reg(t, 64, gowarp.RemoteWrite)
	rmr, _ = q.reg(t, 64, gowarp.LocalWrite)
	q.b.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: rmr, Length: 64}}})
	q.a.PostSend(&gowarp.SendWR{Op: gowarp.OpSendInv, InvalidateSTag: keep.STag(), SGL: []gowarp.SGE{{MR: src, Length: 4}}})
	waitState(t, q.b, gowarp.StateError)
	if !errors.Is(q.b.Err(), wire.ErrRDMAPCannotInvalidate) || !keep.Valid() {
		t.Fatalf("refused invalidate: %v, valid %v", q.b.Err(), keep.Valid())
	}
}

// TestZeroLength: zero-length Writes, Reads and Sends complete.
func TestZeroLength(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	rmr, _ := p.reg(t, 8, gowarp.LocalWrite)
	p.b.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: rmr, Length: 8}}})
	p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled})
	p.a.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled})
	p.a.PostSend(&gowarp.SendWR{ID: 3, Op: gowarp.OpSend, Flags: gowarp.Signaled})
	for id := uint64(1); id <= 3; id++ {
		if c := wait(t, p.acq); c.ID != id || c.Err() != nil || c.Bytes != 0 {
			t.Fatalf("completion %+v", c)
		}
	}
	if c := wait(t, p.bcq); c.Bytes != 0 || c.Err() != nil {
		t.Fatalf("recv %+v", c)
	}
}

// TestConnectVariants: revision 1, revision 2 without peer-to-peer mode,
// CRC asked by either side, and private data both ways.
func TestConnectVariants(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cli, srv gowarp.ConnectOptions
		crc      bool
	}{
		{"rev1", gowarp.ConnectOptions{MPARevision: 1}, gowarp.ConnectOptions{}, false},
		{"rev1 crc", gowarp.ConnectOptions{MPARevision: 1, CRC: true}, gowarp.ConnectOptions{}, true},
		{"rev2 no p2p", gowarp.ConnectOptions{NoP2P: true}, gowarp.ConnectOptions{}, false},
		{"server asks crc", gowarp.ConnectOptions{}, gowarp.ConnectOptions{CRC: true}, true},
		{"small fpdus", gowarp.ConnectOptions{MaxFPDU: 100, CRC: true}, gowarp.ConnectOptions{MaxFPDU: 64}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cli.PrivateData = []byte("hello from the client")
			tc.srv.PrivateData = []byte("hello from the server")
			dev := gowarp.Open()
			pd := dev.AllocPD()
			cq := dev.NewCQ(64)
			a, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
			b, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
			defer a.Close()
			defer b.Close()
			ln, _ := dev.Listen("127.0.0.1:0")
			defer ln.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				req, err := ln.Accept(ctx)
				if err == nil {
					err = req.Accept(ctx, b, tc.srv)
				}
				errc <- err
			}()
			if err := a.Connect(ctx, ln.Addr().String(), tc.cli); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if string(a.PeerPrivateData()) != "hello from the server" || string(b.PeerPrivateData()) != "hello from the client" {
				t.Fatalf("private data %q / %q", a.PeerPrivateData(), b.PeerPrivateData())
			}
			if a.Params().CRC != tc.crc || b.Params().CRC != tc.crc {
				t.Fatalf("CRC %v/%v, want %v", a.Params().CRC, b.Params().CRC, tc.crc)
			}
			// Both ends are requester and responder at once.
			buf, _ := pd.Register(make([]byte, 5000), gowarp.LocalWrite|gowarp.RemoteRead|gowarp.RemoteWrite)
			a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: buf, Length: 1000}}, RemoteAddr: buf.Addr() + 2000, RKey: buf.STag()})
			b.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: buf, Offset: 4000, Length: 1000}}, RemoteAddr: buf.Addr(), RKey: buf.STag()})
			for range 2 {
				if c := wait(t, cq); c.Err() != nil {
					t.Fatalf("completion %+v (%v %v)", c, a.Err(), b.Err())
				}
			}
		})
	}
}

// TestDeregisterInUse: a region with work outstanding cannot be
// deregistered; once the work completes it can.
func TestDeregisterInUse(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	rmr, _ := p.reg(t, 64, gowarp.LocalWrite)
	p.b.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: rmr, Length: 64}}})
	if err := rmr.Deregister(); !errors.Is(err, gowarp.ErrRegionBusy) {
		t.Fatalf("deregister with a receive posted: %v, want ErrRegionBusy", err)
	}
	src, _ := p.reg(t, 64, 0)
	p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: src, Length: 64}}})
	wait(t, p.bcq)
	if err := rmr.Deregister(); err != nil {
		t.Fatalf("deregister after completion: %v", err)
	}
	if err := rmr.Deregister(); err == nil {
		t.Fatal("second deregister succeeded")
	}
}

// TestPostErrors: bad work requests are refused at post time with errors
// that errors.Is matches.
func TestPostErrors(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	mr, _ := p.reg(t, 64, 0)
	many := make([]gowarp.SGE, gowarp.MaxSGE+1)
	for i := range many {
		many[i] = gowarp.SGE{MR: mr, Length: 1}
	}
	for _, tc := range []struct {
		wr   gowarp.SendWR
		want error
	}{
		{gowarp.SendWR{Op: 0}, gowarp.ErrBadOp},
		{gowarp.SendWR{Op: gowarp.OpSend, SGL: many}, gowarp.ErrTooManySGE},
		{gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Offset: 60, Length: 5}}}, gowarp.ErrLocalAccess},
		{gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Offset: -1, Length: 5}}}, gowarp.ErrLocalAccess},
		{gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{Length: 5}}}, gowarp.ErrLocalAccess},
		{gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: mr, Length: 5}}}, gowarp.ErrLocalAccess}, // sink lacks LocalWrite
	} {
		if err := p.a.PostSend(&tc.wr); !errors.Is(err, tc.want) {
			t.Errorf("PostSend(%+v) = %v, want %v", tc.wr, err, tc.want)
		}
	}
	if err := p.a.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: mr, Length: 5}}}); !errors.Is(err, gowarp.ErrLocalAccess) {
		t.Errorf("PostRecv into a read-only region: %v", err)
	}
	// Fill the receive queue.
	w, _ := p.reg(t, 64, gowarp.LocalWrite)
	var err error
	for range 1000 {
		if err = p.a.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: w, Length: 1}}}); err != nil {
			break
		}
	}
	if !errors.Is(err, gowarp.ErrQueueFull) {
		t.Errorf("overfilled receive queue: %v", err)
	}
	idle, _ := p.pd.NewQP(gowarp.QPConfig{SendCQ: p.acq, RecvCQ: p.acq})
	defer idle.Close()
	if err := idle.PostSend(&gowarp.SendWR{Op: gowarp.OpSend}); !errors.Is(err, gowarp.ErrNotReady) {
		t.Errorf("post on an idle QP: %v", err)
	}
}

// TestSharedCQ: one CQ serves many QPs, and completions name their QP.
func TestSharedCQ(t *testing.T) {
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(256)
	peerCQ := dev.NewCQ(256)
	ln, _ := dev.Listen("127.0.0.1:0")
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const k = 8
	qps := map[*gowarp.QP]bool{}
	go func() {
		for range k {
			req, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			b, _ := pd.NewQP(gowarp.QPConfig{SendCQ: peerCQ, RecvCQ: peerCQ})
			req.Accept(ctx, b, gowarp.ConnectOptions{})
			t.Cleanup(func() { b.Close() })
		}
	}()
	dst, _ := pd.Register(make([]byte, 64*k), gowarp.RemoteWrite)
	src, _ := pd.Register(make([]byte, 64), 0)
	for i := range k {
		a, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
		defer a.Close()
		if err := a.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{}); err != nil {
			t.Fatal(err)
		}
		qps[a] = false
		a.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 64}}, RemoteAddr: dst.Addr() + uint64(64*i), RKey: dst.STag()})
	}
	for range k {
		c := wait(t, cq)
		if seen, ok := qps[c.QP]; !ok || seen {
			t.Fatalf("completion for unknown or repeated QP")
		}
		qps[c.QP] = true
	}
}

// TestAbruptCloseReleasesRegions: a peer that vanishes in the middle of
// large Reads and Writes leaves no reference on the responder's region:
// once the QP is closed the region deregisters.
func TestAbruptCloseReleasesRegions(t *testing.T) {
	for range 5 {
		p := newPair(t, gowarp.ConnectOptions{CRC: true})
		big, _ := p.reg(t, 1<<20, gowarp.RemoteRead|gowarp.RemoteWrite)
		local, _ := p.reg(t, 1<<20, gowarp.LocalWrite)
		for i := range 20 {
			op := gowarp.OpRead
			if i%2 == 1 {
				op = gowarp.OpWrite
			}
			p.a.PostSend(&gowarp.SendWR{Op: op, SGL: []gowarp.SGE{{MR: local, Length: 1 << 20}}, RemoteAddr: big.Addr(), RKey: big.STag()})
		}
		time.Sleep(2 * time.Millisecond)
		p.a.Close()
		waitState(t, p.b, gowarp.StateError)
		p.b.Close()
		if err := big.Deregister(); err != nil {
			t.Fatalf("responder region after the peer vanished: %v", err)
		}
		if err := local.Deregister(); err != nil {
			t.Fatalf("requester region after Close: %v", err)
		}
	}
}

// TestOneSTagManyBuffers (C7): separate buffers registered as one region
// are one contiguous range of tagged offsets: a Write across it and a Read
// landing in it fill the buffers in order.
func TestOneSTagManyBuffers(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{CRC: true})
	pieces := [][]byte{make([]byte, 1000), make([]byte, 1), make([]byte, 70000), make([]byte, 333)}
	total := 0
	for _, b := range pieces {
		total += len(b)
	}
	many, err := p.pd.RegisterBuffers(pieces, gowarp.RemoteWrite|gowarp.LocalWrite, gowarp.RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if many.Len() != total || len(many.Buffers()) != 4 {
		t.Fatalf("region of %d bytes in %d buffers", many.Len(), len(many.Buffers()))
	}
	src, sbuf := p.reg(t, total, gowarp.RemoteRead)
	fillPattern(sbuf, 11)
	// A peer Writes across every buffer boundary, starting inside the first.
	p.b.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: src, Offset: 10, Length: total - 10}}, RemoteAddr: many.Addr() + 10, RKey: many.STag()})
	if c := wait(t, p.bcq); c.Err() != nil {
		t.Fatalf("write %+v", c)
	}
	for many.Placed() < uint64(total-10) {
		time.Sleep(time.Millisecond)
	}
	joined := bytes.Join(pieces, nil)
	if !bytes.Equal(joined[10:], sbuf[10:]) {
		t.Fatal("Write across the buffers differs")
	}
	// A Read whose sink is the many-buffer region lands in order too.
	for _, b := range pieces {
		clear(b)
	}
	p.a.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: many, Length: total}}, RemoteAddr: src.Addr(), RKey: src.STag()})
	if c := wait(t, p.acq); c.Err() != nil {
		t.Fatalf("read %+v", c)
	}
	if !bytes.Equal(bytes.Join(pieces, nil), sbuf) {
		t.Fatal("Read into the buffers differs")
	}
	// And bounds are those of the whole range.
	p.b.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 2}}, RemoteAddr: many.Addr() + uint64(total) - 1, RKey: many.STag()})
	waitState(t, p.a, gowarp.StateError)
	if !errors.Is(p.a.Err(), wire.ErrDDPBaseBounds) {
		t.Fatalf("write past the joined range: %v", p.a.Err())
	}
}

// TestDisconnect: Disconnect lets queued sends leave and complete, closes
// the connection, and the peer sees a clean close with its receives flushed.
func TestDisconnect(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	src, _ := p.reg(t, 1<<20, 0)
	rmr, _ := p.reg(t, 1<<20, gowarp.LocalWrite)
	p.b.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: rmr, Length: 1 << 20}}})
	p.b.PostRecv(&gowarp.RecvWR{ID: 2, SGL: []gowarp.SGE{{MR: rmr, Length: 1 << 20}}})
	p.a.PostSend(&gowarp.SendWR{ID: 10, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 1 << 20}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.a.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.acq); c.ID != 10 || c.Err() != nil {
		t.Fatalf("send queued before Disconnect: %+v", c)
	}
	if s := p.a.State(); s != gowarp.StateError {
		t.Fatalf("state after Disconnect %v", s)
	}
	if err := p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpSend}); !errors.Is(err, gowarp.ErrNotReady) {
		t.Fatalf("post after Disconnect: %v", err)
	}
	if c := wait(t, p.bcq); c.ID != 1 || c.Err() != nil || c.Bytes != 1<<20 {
		t.Fatalf("peer's receive %+v", c)
	}
	if c := wait(t, p.bcq); c.ID != 2 || c.Status != gowarp.WRFlushError {
		t.Fatalf("peer's spare receive %+v, want flushed", c)
	}
	if err := p.b.Err(); !errors.Is(err, gowarp.ErrPeerClosed) {
		t.Fatalf("peer error %v, want ErrPeerClosed", err)
	}
	// Posts on the failed peer say why, as Err does (a receive reposted
	// after the last completion failed with a bare ErrNotReady).
	if err := p.b.PostRecv(&gowarp.RecvWR{}); !errors.Is(err, gowarp.ErrNotReady) || !errors.Is(err, gowarp.ErrPeerClosed) {
		t.Errorf("receive posted on the closed peer: %v, want ErrNotReady wrapping ErrPeerClosed", err)
	}
	if err := p.b.PostSend(&gowarp.SendWR{Op: gowarp.OpSend}); !errors.Is(err, gowarp.ErrNotReady) || !errors.Is(err, gowarp.ErrPeerClosed) {
		t.Errorf("send posted on the closed peer: %v, want ErrNotReady wrapping ErrPeerClosed", err)
	}
}

// TestORDLimitsReads: with ORD 1 negotiated, a burst of Reads goes out one
// at a time (the send queue waits for each response) and all complete, in
// order, together with the Writes queued between them.
func TestORDLimitsReads(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{IRD: 1, ORD: 1})
	if p.a.Params().ORD != 1 || p.b.Params().IRD != 1 {
		t.Fatalf("negotiated ORD %d / peer IRD %d", p.a.Params().ORD, p.b.Params().IRD)
	}
	remote, rbuf := p.reg(t, 64<<10, gowarp.RemoteRead|gowarp.RemoteWrite)
	fillPattern(rbuf, 2)
	local, lbuf := p.reg(t, 64<<10, gowarp.LocalWrite)
	for i := range 16 {
		op := gowarp.OpRead
		if i%4 == 3 {
			op = gowarp.OpWrite
		}
		off := i * 4096
		if err := p.a.PostSend(&gowarp.SendWR{ID: uint64(i), Op: op, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: local, Offset: off, Length: 4096}}, RemoteAddr: remote.Addr() + uint64(off), RKey: remote.STag()}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 16 {
		if c := wait(t, p.acq); c.ID != uint64(i) || c.Err() != nil {
			t.Fatalf("completion %+v, want ID %d", c, i)
		}
	}
	for i := range 16 {
		if i%4 != 3 && !bytes.Equal(lbuf[i*4096:(i+1)*4096], rbuf[i*4096:(i+1)*4096]) {
			t.Fatalf("read %d differs", i)
		}
	}
}
