package gowarp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

var extOpts = gowarp.ConnectOptions{Extensions: true}

// TestWriteImm: a Write with immediate data lands, then completes one of
// the target's receives with the immediate, and the Write's bytes are in
// place when it does; the requester's completion is a Write's.
func TestWriteImm(t *testing.T) {
	p := newPair(t, extOpts)
	if !p.a.Params().Extensions || !p.b.Params().Extensions {
		t.Fatalf("extensions not negotiated: %+v %+v", p.a.Params(), p.b.Params())
	}
	src, sbuf := p.reg(t, 256<<10, gowarp.LocalWrite)
	rmr, rbuf := p.reg(t, 64, gowarp.LocalWrite)
	for i := range sbuf {
		sbuf[i] = byte(i * 7)
	}
	for i := range rbuf {
		rbuf[i] = 0xee
	}
	for _, n := range []int{0, 1, 100, 200 << 10} {
		// A target of its own each time: the test reads it after the
		// completion, and the next Write's bytes reach memory ordered
		// after that read only through the socket, which the race
		// detector does not see.
		dst, dbuf := p.reg(t, 256<<10, gowarp.LocalWrite|gowarp.RemoteWrite)
		if err := p.b.PostRecv(&gowarp.RecvWR{ID: 9, SGL: []gowarp.SGE{{MR: rmr, Length: 64}}}); err != nil {
			t.Fatal(err)
		}
		if err := p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWriteImm, Flags: gowarp.Signaled, Imm: 0xc0ffee00 + uint32(n),
			SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
			t.Fatal(err)
		}
		c := wait(t, p.bcq)
		if c.Err() != nil || c.ID != 9 || c.Op != gowarp.CompRecv || !c.WithImm || c.Imm != 0xc0ffee00+uint32(n) || c.Bytes != 0 || c.Solicited {
			t.Fatalf("%d bytes: target's completion %+v", n, c)
		}
		if !bytes.Equal(dbuf[:n], sbuf[:n]) {
			t.Fatalf("%d bytes: the Write had not landed when its immediate completed", n)
		}
		if c := wait(t, p.acq); c.Err() != nil || c.Op != gowarp.CompWrite || c.ID != 1 {
			t.Fatalf("requester's completion %+v", c)
		}
	}
	if !bytes.Equal(rbuf, bytes.Repeat([]byte{0xee}, 64)) {
		t.Fatal("a Write with immediate data wrote into the receive's memory")
	}
}

// TestSendImm: a Send with immediate data fills one receive with its
// bytes and carries the immediate, at every size (several FPDUs too),
// solicited or not; a Send without stays without.
func TestSendImm(t *testing.T) {
	p := newPair(t, extOpts)
	src, sbuf := p.reg(t, 300<<10, gowarp.LocalWrite)
	dst, dbuf := p.reg(t, 300<<10, gowarp.LocalWrite)
	for i := range sbuf {
		sbuf[i] = byte(i*13 + 1)
	}
	for i, n := range []int{0, 5, 4096, 300 << 10} {
		clear(dbuf)
		if err := p.b.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: dst, Length: len(dbuf)}}}); err != nil {
			t.Fatal(err)
		}
		flags := gowarp.Signaled
		if i%2 == 1 {
			flags |= gowarp.Solicited
		}
		if err := p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpSendImm, Flags: flags, Imm: uint32(i) + 1000,
			SGL: []gowarp.SGE{{MR: src, Length: n}}}); err != nil {
			t.Fatal(err)
		}
		c := wait(t, p.bcq)
		if c.Err() != nil || c.ID != uint64(i) || !c.WithImm || c.Imm != uint32(i)+1000 || c.Bytes != n || c.Solicited != (i%2 == 1) {
			t.Fatalf("%d bytes: completion %+v", n, c)
		}
		if !bytes.Equal(dbuf[:n], sbuf[:n]) {
			t.Fatalf("%d bytes: payload differs", n)
		}
		if c := wait(t, p.acq); c.Err() != nil || c.Op != gowarp.CompSend {
			t.Fatalf("requester's completion %+v", c)
		}
	}
	if err := p.b.PostRecv(&gowarp.RecvWR{ID: 50, SGL: []gowarp.SGE{{MR: dst, Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	if err := p.a.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: src, Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.bcq); c.Err() != nil || c.WithImm || c.Imm != 0 {
		t.Fatalf("plain Send's completion %+v", c)
	}
}

// TestExtNotNegotiated: unless both sides offer the extensions, posting
// one fails at once with ErrNotSupported, and the queue pair goes on.
func TestExtNotNegotiated(t *testing.T) {
	for _, tt := range []struct {
		name           string
		client, server gowarp.ConnectOptions
	}{
		{"client only", extOpts, gowarp.ConnectOptions{}},
		{"server only", gowarp.ConnectOptions{}, extOpts},
		{"neither", gowarp.ConnectOptions{}, gowarp.ConnectOptions{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPairOpts(t, tt.client, tt.server)
			if p.a.Params().Extensions || p.b.Params().Extensions {
				t.Fatal("extensions on")
			}
			mr, _ := p.reg(t, 64, gowarp.LocalWrite|gowarp.RemoteWrite)
			for _, qp := range []*gowarp.QP{p.a, p.b} {
				for _, op := range []gowarp.WROp{gowarp.OpWriteImm, gowarp.OpSendImm, gowarp.OpFetchAdd, gowarp.OpCmpSwap, gowarp.OpAtomicWrite} {
					err := qp.PostSend(&gowarp.SendWR{Op: op, SGL: []gowarp.SGE{{MR: mr, Length: 8}}, RemoteAddr: mr.Addr(), RKey: mr.STag()})
					if !errors.Is(err, gowarp.ErrNotSupported) {
						t.Fatalf("%v: %v, want ErrNotSupported", op, err)
					}
					pr, err := qp.Prepare(&gowarp.SendWR{Op: op, SGL: []gowarp.SGE{{MR: mr, Length: 8}}, RemoteAddr: mr.Addr(), RKey: mr.STag()})
					if err != nil {
						t.Fatal(err)
					}
					if err := pr.Post(1, true); !errors.Is(err, gowarp.ErrNotSupported) {
						t.Fatalf("prepared %v: %v, want ErrNotSupported", op, err)
					}
					pr.Release()
				}
			}
			// The queue pairs still work.
			if err := p.b.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: mr, Length: 8}}}); err != nil {
				t.Fatal(err)
			}
			if err := p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Length: 8}}}); err != nil {
				t.Fatal(err)
			}
			if c := wait(t, p.bcq); c.Err() != nil || c.WithImm {
				t.Fatalf("completion %+v", c)
			}
		})
	}
}

// TestNoExtToRawPeer: a gowarp responder offering the extensions, to a
// peer whose request did not offer them (as siw's): the reply carries no
// offer, posting one fails with ErrNotSupported, and what does go out
// has no extension opcode. Its Immediate Data is refused with a
// Terminate (unexpected opcode).
func TestNoExtToRawPeer(t *testing.T) {
	s := newServer(t, extOpts)
	p, rep := dialRaw(t, s.ln.Addr().String(), false, 4, 4)
	if len(rep.PrivateData) != 0 {
		t.Fatalf("reply carries private data % x", rep.PrivateData)
	}
	qp := s.accepted(t)
	if qp.Params().Extensions {
		t.Fatal("extensions on toward a peer that did not offer them")
	}
	mr, err := s.pd.Register(make([]byte, 64), gowarp.LocalWrite|gowarp.RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	p.write(1, 0, nil) // the initiator's first FPDU: the responder may now send
	for _, op := range []gowarp.WROp{gowarp.OpWriteImm, gowarp.OpSendImm, gowarp.OpFetchAdd, gowarp.OpCmpSwap, gowarp.OpAtomicWrite} {
		if err := qp.PostSend(&gowarp.SendWR{Op: op, SGL: []gowarp.SGE{{MR: mr, Length: 8}}, RKey: 5, RemoteAddr: 0}); !errors.Is(err, gowarp.ErrNotSupported) {
			t.Fatalf("%v: %v", op, err)
		}
	}
	if err := qp.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: mr, Length: 8}}, RKey: 5, RemoteAddr: 0}); err != nil {
		t.Fatal(err)
	}
	h, _, err := p.next()
	if err != nil {
		t.Fatal(err)
	}
	if h.Opcode != wire.OpWrite {
		t.Fatalf("peer received %v, want the Write", h.Opcode)
	}
	qp.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: mr, Length: 64}}})
	ih := hdr(wire.OpImmediate)
	ih.MSN = 1
	p.send(ih, wire.AppendImmediate(nil, 1), nil)
	p.c.SetDeadline(time.Now().Add(10 * time.Second))
	if term := p.terminate(); term.Err != *wire.ErrRDMAPOpcode {
		t.Fatalf("Terminate %v, want %v", term.Err, wire.ErrRDMAPOpcode)
	}
}

// TestImmWire decodes, with gowarp's own codec (Wireshark and wirecheck
// know opcodes 0-7 only), what a requester writes for a Write and a Send
// with immediate data and a CmpSwap (an Atomic Request on queue 1 with
// both masks set): the Write's FPDUs then Immediate Data on queue 0
// with the next MSN, the value in the low half of its 8 bytes; the Send
// as Immediate Data with Solicited Event whose segments each carry the
// body before their part of the payload.
func TestImmWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := newIdlePair(t, 64)
	ln, err := p.dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err == nil {
			err = req.Accept(ctx, p.b, extOpts)
		}
		errc <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tap := &tapConn{Conn: c}
	if err := p.a.ConnectConn(ctx, tap, gowarp.ConnectOptions{Extensions: true, NoP2P: true, NoNudge: true}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.a.Close(); p.b.Close() })
	src, sbuf := p.reg(t, 100<<10, gowarp.LocalWrite)
	dst, _ := p.reg(t, 100<<10, gowarp.LocalWrite|gowarp.RemoteWrite)
	for i := range sbuf {
		sbuf[i] = byte(i)
	}
	p.b.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: dst, Length: 100 << 10}}})
	p.b.PostRecv(&gowarp.RecvWR{ID: 2, SGL: []gowarp.SGE{{MR: dst, Length: 100 << 10}}})
	p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpWriteImm, Imm: 0x11223344, SGL: []gowarp.SGE{{MR: src, Length: 5000}},
		RemoteAddr: dst.Addr(), RKey: dst.STag()})
	p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpSendImm, Flags: gowarp.Solicited, Imm: 0x55, SGL: []gowarp.SGE{{MR: src, Length: 100 << 10}}})
	wait(t, p.bcq)
	wait(t, p.bcq)
	at, _ := p.reg(t, 8, gowarp.RemoteAtomic)
	res, _ := p.reg(t, 8, gowarp.LocalWrite)
	if err := p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpCmpSwap, Flags: gowarp.Signaled, CompareAdd: 3, Swap: 4,
		SGL: []gowarp.SGE{{MR: res, Length: 8}}, RemoteAddr: at.Addr(), RKey: at.STag()}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.acq); c.Err() != nil || c.Op != gowarp.CompAtomic {
		t.Fatalf("atomic's completion %+v", c)
	}

	b := tap.bytes()
	req, n, err := wire.ParseMPAFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(req.PrivateData, []byte("gwX1\x00\x00\x00\x00")) {
		t.Fatalf("request's private data % x: no offer block", req.PrivateData)
	}
	b = b[n:]
	var writeBytes, sendBytes int
	var imms, atomics int
	for len(b) > 0 {
		f, n, err := wire.ParseFPDU(b, false)
		if err != nil {
			t.Fatalf("FPDU: %v", err)
		}
		b = b[n:]
		h, k, err := wire.ParseHeader(f.ULPDU)
		if err != nil {
			t.Fatal(err)
		}
		rest := f.ULPDU[k:]
		switch h.Opcode {
		case wire.OpWrite:
			if imms != 0 {
				t.Fatal("Write after the Immediate Data")
			}
			writeBytes += len(rest)
		case wire.OpImmediate:
			v, k, err := wire.ParseImmediate(rest)
			if err != nil || len(rest) != k || v != 0x11223344 || h.QN != 0 || h.MSN != 1 || !h.Last || writeBytes != 5000 {
				t.Fatalf("Immediate Data %+v, body %#x (%v), %d payload bytes, after %d bytes written", h, v, err, len(rest)-k, writeBytes)
			}
			imms++
		case wire.OpImmediateSE:
			v, k, err := wire.ParseImmediate(rest)
			if err != nil || v != 0x55 || h.QN != 0 || h.MSN != 2 || int(h.MO) != sendBytes {
				t.Fatalf("Immediate Data with SE %+v, body %#x (%v)", h, v, err)
			}
			if !bytes.Equal(rest[k:], sbuf[sendBytes:sendBytes+len(rest)-k]) {
				t.Fatalf("segment at MO %d: payload differs", h.MO)
			}
			sendBytes += len(rest) - k
			if h.Last {
				imms++
			}
		case wire.OpAtomicRequest:
			ar, k, err := wire.ParseAtomicRequest(rest)
			want := wire.AtomicRequest{Op: wire.AtomicCmpSwap, ReqID: 1, RemoteSTag: uint32(at.STag()), RemoteTO: at.Addr(),
				AddSwap: 4, AddSwapMask: ^uint64(0), Compare: 3, CompareMask: ^uint64(0)}
			if err != nil || k != len(rest) || ar != want || h.QN != wire.QNRead || h.MSN != 1 || !h.Last {
				t.Fatalf("Atomic Request %+v %+v (%v), want %+v", h, ar, err, want)
			}
			atomics++
		default:
			t.Fatalf("unexpected %v", h.Opcode)
		}
	}
	if atomics != 1 {
		t.Fatalf("%d Atomic Requests", atomics)
	}
	if imms != 2 || sendBytes != 100<<10 {
		t.Fatalf("%d Immediate Data messages, %d bytes of Send", imms, sendBytes)
	}
}

// TestAtomics: Fetch-and-Add, Compare-and-Swap (matching and not) and
// Atomic Write on a peer's word, each returning the original value into
// the requester's 8 bytes; then remote Fetch-and-Adds from two queue
// pairs racing local AtomicAdds on the same word lose no increment.
func TestAtomics(t *testing.T) {
	p := newPair(t, extOpts)
	target, _ := p.reg(t, 64, gowarp.LocalWrite|gowarp.RemoteAtomic)
	res, rbuf := p.reg(t, 64, gowarp.LocalWrite)
	// Set atomically: the peer's atomics reach the word ordered after
	// this only through the socket, which the race detector cannot see.
	if _, err := target.AtomicAdd(8, 100); err != nil {
		t.Fatal(err)
	}
	base := target.Addr() + 8
	post := func(id uint64, op gowarp.WROp, cmpAdd, swap uint64) uint64 {
		t.Helper()
		if err := p.a.PostSend(&gowarp.SendWR{ID: id, Op: op, Flags: gowarp.Signaled, CompareAdd: cmpAdd, Swap: swap,
			SGL: []gowarp.SGE{{MR: res, Offset: 16, Length: 8}}, RemoteAddr: base, RKey: target.STag()}); err != nil {
			t.Fatal(err)
		}
		c := wait(t, p.acq)
		if c.Err() != nil || c.ID != id || c.Op != gowarp.CompAtomic {
			t.Fatalf("%v: completion %+v", op, c)
		}
		return binary.NativeEndian.Uint64(rbuf[16:])
	}
	word := func() uint64 { v, _ := target.AtomicLoad(8); return v }
	if got := post(1, gowarp.OpFetchAdd, 5, 0); got != 100 || word() != 105 {
		t.Fatalf("FetchAdd returned %d, word %d; want 100, 105", got, word())
	}
	if got := post(2, gowarp.OpCmpSwap, 7, 1); got != 105 || word() != 105 {
		t.Fatalf("CmpSwap that does not match returned %d, word %d", got, word())
	}
	if got := post(3, gowarp.OpCmpSwap, 105, 42); got != 105 || word() != 42 {
		t.Fatalf("CmpSwap that matches returned %d, word %d", got, word())
	}
	if got := post(4, gowarp.OpAtomicWrite, 0, 1<<40); got != 42 || word() != 1<<40 {
		t.Fatalf("Atomic Write returned %d, word %d", got, word())
	}
	if old, err := target.CompareAndSwap(8, 1<<40, 0); err != nil || old != 1<<40 || word() != 0 {
		t.Fatalf("local CompareAndSwap: %d, %v", old, err)
	}

	// Racing on the word: a's atomics (carried out by b's engine), b's
	// (carried out by a's: both queue pairs share the device and the
	// region) and a local adder.
	const n = 300
	res2, _ := p.reg(t, 8, gowarp.LocalWrite)
	var wg sync.WaitGroup
	remote := func(qp *gowarp.QP, cq *gowarp.CQ, r *gowarp.MR) {
		defer wg.Done()
		for i := range n {
			if err := qp.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpFetchAdd, Flags: gowarp.Signaled, CompareAdd: 1,
				SGL: []gowarp.SGE{{MR: r, Length: 8}}, RemoteAddr: base, RKey: target.STag()}); err != nil {
				t.Error(err)
				return
			}
			if c := wait(t, cq); c.Err() != nil {
				t.Error(c.Err())
				return
			}
		}
	}
	wg.Add(3)
	go remote(p.a, p.acq, res)
	go remote(p.b, p.bcq, res2)
	go func() {
		defer wg.Done()
		for range n {
			if _, err := target.AtomicAdd(8, 1); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	if word() != 3*n {
		t.Fatalf("word %d after %d increments", word(), 3*n)
	}
}

// TestAtomicErrors: a misshapen atomic fails at the post; one the peer
// refuses (unknown STag, no remote-atomic right) completes with a remote
// access error at the requester, whose queue pair then says which
// Terminate the responder sent.
func TestAtomicErrors(t *testing.T) {
	p := newPair(t, extOpts)
	target, _ := p.reg(t, 64, gowarp.LocalWrite|gowarp.RemoteAtomic)
	res, _ := p.reg(t, 64, gowarp.LocalWrite)
	for _, wr := range []gowarp.SendWR{
		{Op: gowarp.OpFetchAdd, SGL: []gowarp.SGE{{MR: res, Length: 8}}, RemoteAddr: target.Addr() + 4, RKey: target.STag()},
		{Op: gowarp.OpCmpSwap, SGL: []gowarp.SGE{{MR: res, Length: 4}}, RemoteAddr: target.Addr(), RKey: target.STag()},
		{Op: gowarp.OpAtomicWrite, RemoteAddr: target.Addr(), RKey: target.STag()},
	} {
		if err := p.a.PostSend(&wr); !errors.Is(err, gowarp.ErrBadAtomic) {
			t.Errorf("%+v: %v, want ErrBadAtomic", wr, err)
		}
	}
	if _, err := target.AtomicAdd(3, 1); !errors.Is(err, gowarp.ErrBadAtomic) {
		t.Errorf("local AtomicAdd at offset 3: %v", err)
	}
	if _, err := target.AtomicAdd(60, 1); !errors.Is(err, gowarp.ErrBadAtomic) {
		t.Errorf("local AtomicAdd past the end: %v", err)
	}

	for _, tt := range []struct {
		name string
		acc  gowarp.Access
		rkey func(mr *gowarp.MR) uint32
		want *wire.TermError
	}{
		{"unknown STag", gowarp.RemoteAtomic, func(*gowarp.MR) uint32 { return 0x00ffff00 }, wire.ErrRDMAPInvalidSTag},
		{"no remote-atomic right", gowarp.RemoteWrite | gowarp.RemoteRead, func(mr *gowarp.MR) uint32 { return uint32(mr.STag()) }, wire.ErrRDMAPAccessRights},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPair(t, extOpts)
			target, _ := p.reg(t, 64, tt.acc)
			res, _ := p.reg(t, 8, gowarp.LocalWrite)
			if err := p.a.PostSend(&gowarp.SendWR{ID: 7, Op: gowarp.OpFetchAdd, Flags: gowarp.Signaled, CompareAdd: 1,
				SGL: []gowarp.SGE{{MR: res, Length: 8}}, RemoteAddr: target.Addr(), RKey: gowarp.STag(tt.rkey(target))}); err != nil {
				t.Fatal(err)
			}
			c := wait(t, p.acq)
			if c.ID != 7 || !errors.Is(c.Err(), gowarp.RemoteAccessError) {
				t.Fatalf("completion %+v, want a remote access error", c)
			}
			waitState(t, p.a, gowarp.StateError)
			if err := p.a.Err(); !errors.Is(err, gowarp.ErrPeerTerminated) || !errors.Is(err, tt.want) {
				t.Fatalf("requester's Err %v, want the peer's %v", err, tt.want)
			}
			if err := p.b.Err(); !errors.Is(err, gowarp.ErrTerminated) || !errors.Is(err, tt.want) {
				t.Fatalf("responder's Err %v, want %v", err, tt.want)
			}
		})
	}
}

// BenchmarkAtomicLat is one 8-byte RDMA Read, Fetch-and-Add or
// Compare-and-Swap at a time, waited for on the requester's CQ: ns/op is
// the round trip of each (read_lat's measure, for atomics).
func BenchmarkAtomicLat(b *testing.B) {
	for _, op := range []gowarp.WROp{gowarp.OpRead, gowarp.OpFetchAdd, gowarp.OpCmpSwap} {
		b.Run(op.String(), func(b *testing.B) {
			p := newPair(b, extOpts)
			target, _ := p.reg(b, 8, gowarp.RemoteRead|gowarp.RemoteAtomic)
			res, _ := p.reg(b, 8, gowarp.LocalWrite)
			wr := gowarp.SendWR{Op: op, Flags: gowarp.Signaled, CompareAdd: 1, SGL: []gowarp.SGE{{MR: res, Length: 8}},
				RemoteAddr: target.Addr(), RKey: target.STag()}
			ctx := context.Background()
			var wc [1]gowarp.Completion
			b.ResetTimer()
			for range b.N {
				if err := p.a.PostSend(&wr); err != nil {
					b.Fatal(err)
				}
				for p.acq.Poll(wc[:]) == 0 {
					p.acq.Wait(ctx)
				}
				if wc[0].Status != gowarp.Success {
					b.Fatal(wc[0].Err())
				}
			}
		})
	}
}

// TestAtomicsUnderSnapshot: atomics change memory as Writes do, so a
// snapshot taken before them must not see them: a peer's FetchAdd on the
// target, the original value it lands in the requester's buffer, and a
// local AtomicAdd and CompareAndSwap (all went through read holds and
// wrote the shared page itself).
func TestAtomicsUnderSnapshot(t *testing.T) {
	p := newPair(t, extOpts)
	target, _ := p.reg(t, 64, gowarp.LocalWrite|gowarp.RemoteAtomic)
	res, rbuf := p.reg(t, 64, gowarp.LocalWrite)
	if _, err := target.AtomicAdd(8, 100); err != nil { // atomically: see TestAtomics
		t.Fatal(err)
	}
	binary.NativeEndian.PutUint64(rbuf[16:], 7)
	ctx := context.Background()
	ts, err := target.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	rs, err := res.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if err := p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpFetchAdd, Flags: gowarp.Signaled, CompareAdd: 5,
		SGL: []gowarp.SGE{{MR: res, Offset: 16, Length: 8}}, RemoteAddr: target.Addr() + 8, RKey: target.STag()}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.acq); c.Err() != nil {
		t.Fatalf("FetchAdd: %+v", c)
	}
	if _, err := target.AtomicAdd(8, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := target.CompareAndSwap(16, 0, 9); err != nil {
		t.Fatal(err)
	}
	word := func(s *gowarp.Snapshot, off int64) uint64 {
		var b [8]byte
		if _, err := s.ReadAt(b[:], off); err != nil {
			t.Fatal(err)
		}
		return binary.NativeEndian.Uint64(b[:])
	}
	if v, _ := target.AtomicLoad(8); v != 106 {
		t.Errorf("target word %d, want 106", v)
	}
	if got := binary.NativeEndian.Uint64(rbuf[16:]); got != 100 {
		t.Errorf("FetchAdd's result %d, want 100", got)
	}
	if v := word(ts, 8); v != 100 {
		t.Errorf("snapshot of the target: word %d, want 100 (the atomics came after it)", v)
	}
	if v := word(ts, 16); v != 0 {
		t.Errorf("snapshot of the target: CompareAndSwap's word %d, want 0", v)
	}
	if v := word(rs, 16); v != 7 {
		t.Errorf("snapshot of the result buffer: %d, want 7 (the result landed after it)", v)
	}
}
