package gowarp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// TestPrepared: a prepared Send, Write and Read post many times with only
// an ID, deliver the right data, pin their regions until released, and
// refuse posts after Release.
func TestPrepared(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{CRC: true})
	src, sbuf := p.reg(t, 4096, gowarp.LocalWrite)
	fillPattern(sbuf, 3)
	dst, dbuf := p.reg(t, 4096, gowarp.RemoteWrite|gowarp.RemoteRead)
	rmr, rbuf := p.reg(t, 4096, gowarp.LocalWrite)

	send, err := p.a.Prepare(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: src, Offset: 10, Length: 64}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		p.b.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: rmr, Length: 4096}}})
		if err := send.Post(uint64(1000+i), i%10 == 9); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		if c := wait(t, p.bcq); c.ID != uint64(i) || c.Bytes != 64 || c.Err() != nil {
			t.Fatalf("recv %+v", c)
		}
	}
	for i := 9; i < 50; i += 10 {
		if c := wait(t, p.acq); c.ID != uint64(1000+i) || c.Op != gowarp.CompSend {
			t.Fatalf("send completion %+v, want ID %d", c, 1000+i)
		}
	}
	if !bytes.Equal(rbuf[:64], sbuf[10:74]) {
		t.Fatal("received data differs")
	}

	write, err := p.a.Prepare(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 3000}}, RemoteAddr: dst.Addr() + 7, RKey: dst.STag()})
	if err != nil {
		t.Fatal(err)
	}
	read, err := p.a.Prepare(&gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: rmr, Offset: 100, Length: 3000}}, RemoteAddr: dst.Addr() + 7, RKey: dst.STag()})
	if err != nil {
		t.Fatal(err)
	}
	write.Post(1, false)
	read.Post(2, true)
	if c := wait(t, p.acq); c.ID != 2 || c.Err() != nil {
		t.Fatalf("read %+v", c)
	}
	if dst.Placed() != 3000 || !bytes.Equal(dbuf[7:3007], sbuf[:3000]) || !bytes.Equal(rbuf[100:3100], sbuf[:3000]) {
		t.Fatal("prepared write/read data differs")
	}

	if err := src.Deregister(); !errors.Is(err, gowarp.ErrRegionBusy) {
		t.Fatalf("deregister a region a Prepared pins: %v", err)
	}
	send.Release()
	write.Release()
	if err := send.Post(1, true); !errors.Is(err, gowarp.ErrReleased) {
		t.Fatalf("post after release: %v", err)
	}
	if err := src.Deregister(); err != nil {
		t.Fatalf("deregister after release: %v", err)
	}
	read.Release()
}

// TestShapeCacheFollowsChanges: posts whose shapes differ in one field at a
// time (remote address, key, length, flags, region) put exactly their own
// fields on the wire, and a deregistered region is not reused from the cache.
func TestShapeCacheFollowsChanges(t *testing.T) {
	addr, conns := rawResponder(t, net.ListenConfig{}, 4, 4)
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(64)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer qp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := qp.Connect(ctx, addr, gowarp.ConnectOptions{NoP2P: true}); err != nil {
		t.Fatal(err)
	}
	c := <-conns
	defer c.Close()
	a, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
	b, _ := pd.Register(make([]byte, 64), gowarp.LocalWrite)
	c2, _ := pd.Register(make([]byte, 64), 0)
	posts := []gowarp.SendWR{
		{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: a, Length: 8}}, RemoteAddr: 100, RKey: 0x1100},
		{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: a, Length: 8}}, RemoteAddr: 100, RKey: 0x1100},
		{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: a, Length: 8}}, RemoteAddr: 200, RKey: 0x1100},
		{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: a, Length: 8}}, RemoteAddr: 200, RKey: 0x2200},
		{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: a, Length: 12}}, RemoteAddr: 200, RKey: 0x2200},
		{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: b, Length: 4}}},
		{Op: gowarp.OpSend, Flags: gowarp.Solicited, SGL: []gowarp.SGE{{MR: b, Length: 4}}},
		{Op: gowarp.OpSendInv, InvalidateSTag: 0x3300, SGL: []gowarp.SGE{{MR: b, Length: 4}}},
		{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: b, Length: 4}}},
		{ID: 77, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: c2, Length: 4}}},
		{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: b, Offset: 8, Length: 16}}, RemoteAddr: 300, RKey: 0x4400},
		{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: a, Offset: 8, Length: 16}}, RemoteAddr: 300, RKey: 0x4400},
	}
	for i := range posts {
		if err := qp.PostSend(&posts[i]); err != nil {
			t.Fatal(err)
		}
	}
	// The signaled Send completes (the Reads behind it never will: this
	// peer does not answer). Its region, once deregistered, is not taken
	// from the shape cache.
	if w := wait(t, cq); w.ID != 77 {
		t.Fatalf("completion %+v", w)
	}
	if err := c2.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostSend(&posts[9]); !errors.Is(err, gowarp.ErrLocalAccess) {
		t.Fatalf("post with a deregistered region: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	msn := map[uint32]uint32{0: 0, 1: 0}
	for i, w := range posts {
		var lb [2]byte
		if _, err := io.ReadFull(c, lb[:]); err != nil {
			t.Fatal(err)
		}
		f := make([]byte, wire.FPDULen(int(binary.BigEndian.Uint16(lb[:]))))
		copy(f, lb[:])
		io.ReadFull(c, f[2:])
		fp, _, _ := wire.ParseFPDU(f, false)
		h, n, _ := wire.ParseHeader(fp.ULPDU)
		if !h.Last {
			t.Errorf("post %d: L clear", i)
		}
		switch w.Op {
		case gowarp.OpWrite:
			if h.Opcode != wire.OpWrite || h.STag != uint32(w.RKey) || h.TO != w.RemoteAddr || len(fp.ULPDU)-n != w.SGL[0].Length {
				t.Errorf("post %d: %+v with %d bytes, want %+v", i, h, len(fp.ULPDU)-n, w)
			}
		case gowarp.OpRead:
			msn[1]++
			rr, _, _ := wire.ParseReadRequest(fp.ULPDU[n:])
			s := w.SGL[0]
			if h.Opcode != wire.OpReadRequest || h.MSN != msn[1] || rr.SourceSTag != uint32(w.RKey) || rr.SourceTO != w.RemoteAddr ||
				rr.SinkSTag != uint32(s.MR.STag()) || rr.SinkTO != s.MR.Addr()+uint64(s.Offset) || int(rr.Size) != s.Length {
				t.Errorf("post %d: %+v %+v", i, h, rr)
			}
		default:
			msn[0]++
			want := wire.OpSend
			if w.Flags&gowarp.Solicited != 0 {
				want = wire.OpSendSE
			}
			if w.Op == gowarp.OpSendInv {
				want = wire.OpSendInv
			}
			if h.Opcode != want || h.MSN != msn[0] || h.MO != 0 || h.RsvdULP != uint32(w.InvalidateSTag) {
				t.Errorf("post %d: %+v, want %v MSN %d", i, h, want, msn[0])
			}
		}
	}
}
