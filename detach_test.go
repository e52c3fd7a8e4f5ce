package gowarp_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// TestDetach: a detached region answers every access of its peer — a
// Write, a Read, an atomic — without touching its memory and without
// ending the connection, which carries on; once it is deregistered, the
// peer's next access is refused as before.
func TestDetach(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{Extensions: true})
	const n = 3 * 4096 // larger than a sink: accesses wrap around it
	lent, mem := p.reg(t, n, gowarp.RemoteRead|gowarp.RemoteWrite|gowarp.RemoteAtomic)
	for i := range mem {
		mem[i] = byte(i*7 + 1)
	}
	want := bytes.Clone(mem)
	src, sbuf := p.reg(t, n, gowarp.LocalWrite)
	for i := range sbuf {
		sbuf[i] = 0xee
	}
	other, obuf := p.reg(t, 64, gowarp.RemoteWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lent.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	if !lent.Detached() || !lent.Valid() {
		t.Fatalf("detached %v, valid %v", lent.Detached(), lent.Valid())
	}
	rkey := lent.STag()
	for i, wr := range []gowarp.SendWR{
		{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: lent.Addr(), RKey: rkey},
		{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 100}}, RemoteAddr: lent.Addr() + 5000, RKey: rkey},
		{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: lent.Addr(), RKey: rkey},
		{Op: gowarp.OpFetchAdd, SGL: []gowarp.SGE{{MR: src, Length: 8}}, RemoteAddr: lent.Addr() + 8, RKey: rkey, CompareAdd: 1},
		{Op: gowarp.OpCmpSwap, SGL: []gowarp.SGE{{MR: src, Length: 8}}, RemoteAddr: lent.Addr() + 4096, RKey: rkey, Swap: 2},
	} {
		wr.ID, wr.Flags = uint64(i), gowarp.Signaled
		if err := p.a.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.acq); c.Status != gowarp.Success {
			t.Fatalf("%v to a detached region: %v", wr.Op, c.Status)
		}
	}
	if !bytes.Equal(mem, want) {
		t.Fatal("a peer's access reached a detached region's memory")
	}
	if bytes.Contains(sbuf, want[:64]) {
		t.Fatal("a Read of a detached region returned its memory")
	}
	// The connection carries on.
	wr := gowarp.SendWR{Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 64}}, RemoteAddr: other.Addr(), RKey: other.STag()}
	if err := p.a.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.acq); c.Status != gowarp.Success {
		t.Fatalf("a Write to another region after: %v", c.Status)
	}
	if err := other.WaitPlaced(ctx, 64); err != nil || !bytes.Equal(obuf, sbuf[:64]) {
		t.Fatalf("a Write to another region after: %v", err)
	}
	// Local access still reaches the memory.
	if v, err := lent.AtomicAdd(16, 0); err != nil || v != leUint64(want[16:]) {
		t.Fatalf("local atomic on a detached region: %#x %v", v, err)
	}
	if err := lent.Detach(ctx); err != nil {
		t.Fatalf("second Detach: %v", err)
	}
	if err := lent.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := lent.Detach(ctx); !errors.Is(err, gowarp.ErrRegionInvalid) {
		t.Fatalf("Detach of a deregistered region: %v", err)
	}
	wr = gowarp.SendWR{Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 64}}, RemoteAddr: lent.Addr(), RKey: rkey}
	if err := p.a.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, p.acq); c.Status != gowarp.RemoteAccessError {
		t.Fatalf("a Read of a deregistered region: %v", c.Status)
	}
}

func leUint64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// TestDetachUnderWrites detaches a region while its peer writes it and
// reads it without pause: every operation succeeds, and from Detach's
// return on the memory does not change.
func TestDetachUnderWrites(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	const n = 256 << 10
	lent, mem := p.reg(t, n, gowarp.RemoteRead|gowarp.RemoteWrite)
	// The peer writes two patterns in turn.
	srcs := [2]*gowarp.MR{}
	for i := range srcs {
		var b []byte
		srcs[i], b = p.reg(t, n, gowarp.LocalWrite)
		for j := range b {
			b[j] = byte(j*3 + i*101 + 1)
		}
	}
	sink, _ := p.reg(t, n, gowarp.LocalWrite)
	var stop atomic.Bool
	var done, failed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	wctx := boundedCtx(t)
	go func() {
		defer wg.Done()
		var wc [16]gowarp.Completion
		inflight := 0
		for k := 0; !stop.Load() || inflight > 0; {
			for !stop.Load() && inflight < 8 {
				src := srcs[k&1] // consecutive Writes differ: one in progress at Detach shows
				wr := gowarp.SendWR{Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: lent.Addr(), RKey: lent.STag()}
				if k%5 == 4 {
					wr.Op, wr.SGL = gowarp.OpRead, []gowarp.SGE{{MR: sink, Length: n}}
				}
				if err := p.a.PostSend(&wr); err != nil {
					failed.Add(1)
					return
				}
				k++
				inflight++
			}
			m := p.acq.Poll(wc[:])
			if m == 0 {
				if err := p.acq.Wait(wctx); err != nil {
					failed.Add(1)
					return
				}
				continue
			}
			for _, c := range wc[:m] {
				if c.Status != gowarp.Success {
					failed.Add(1)
				}
			}
			inflight -= m
			done.Add(int64(m))
		}
	}()
	for done.Load() < 40 && failed.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lent.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	frozen := bytes.Clone(mem)
	at := done.Load()
	for done.Load() < at+40 && failed.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if f := failed.Load(); f != 0 {
		t.Fatalf("%d operations failed (%d done)", f, done.Load())
	}
	if !bytes.Equal(mem, frozen) {
		t.Fatal("the memory changed after Detach returned")
	}
	if err := lent.Deregister(); err != nil {
		t.Fatal(err)
	}
}

// TestDetachWaitsForPlacement: Detach returns only once a placement in
// progress when it was called has ended (it fails with ErrRegionBusy if
// its context ends first); what the peer writes after lands in the sink.
func TestDetachWaitsForPlacement(t *testing.T) {
	s := newServer(t, gowarp.ConnectOptions{})
	p, _ := dialRaw(t, s.ln.Addr().String(), false, 1, 1)
	qp := s.accepted(t)
	const n = 32 << 10
	mem := make([]byte, n)
	lent, err := s.pd.Register(mem, gowarp.RemoteWrite|gowarp.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	fpdu := func(b byte) []byte {
		h := hdr(wire.OpWrite)
		h.STag, h.TO = uint32(lent.STag()), lent.Addr()
		u := append(h.Append(nil), bytes.Repeat([]byte{b}, n)...)
		f, err := wire.AppendFPDU(nil, u, false)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := fpdu(0xab)
	half := len(f) / 2
	if _, err := p.c.Write(f[:half]); err != nil {
		t.Fatal(err)
	}
	// The first half is placed straight into the region: the placement is
	// under way, and stays so until the rest comes.
	for deadline := time.Now().Add(5 * time.Second); !bytes.Contains(mem, []byte{0xab}); {
		if time.Now().After(deadline) {
			t.Fatal("the first half of the Write was not placed")
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err = lent.Detach(ctx)
	cancel()
	if !errors.Is(err, gowarp.ErrRegionBusy) {
		t.Fatalf("Detach during a placement, its context ending: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- lent.Detach(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Detach returned (%v) while a placement was under way", err)
	case <-time.After(20 * time.Millisecond):
	}
	if _, err := p.c.Write(f[half:]); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem, bytes.Repeat([]byte{0xab}, n)) {
		t.Fatal("the Write under way at Detach was not placed whole")
	}
	if _, err := p.c.Write(fpdu(0xcd)); err != nil {
		t.Fatal(err)
	}
	p.readReq(wire.ReadRequest{SinkSTag: 42, Size: 8, SourceSTag: uint32(lent.STag()), SourceTO: lent.Addr()})
	h, _, err := p.next()
	if err != nil || h.Opcode != wire.OpReadResponse {
		t.Fatalf("a Read of the detached region: %+v %v", h, err)
	}
	if qp.State() != gowarp.StateReady {
		t.Fatalf("the connection is %v", qp.State())
	}
	if bytes.Contains(mem, []byte{0xcd}) {
		t.Fatal("a Write after Detach reached the memory")
	}
}

// TestRetire: accesses through a retired key complete without touching
// the memory, which the region's other keys still reach; the connection
// carries on; once the key is revoked, an access through it is refused.
func TestRetire(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{Extensions: true})
	const n = 8192
	mr, mem := p.reg(t, n, gowarp.RemoteRead|gowarp.RemoteWrite|gowarp.RemoteAtomic)
	for i := range mem {
		mem[i] = byte(i*5 + 3)
	}
	old, err := mr.Expose(gowarp.Plain)
	if err != nil {
		t.Fatal(err)
	}
	src, sbuf := p.reg(t, n, gowarp.LocalWrite)
	post := func(wr gowarp.SendWR) gowarp.Status {
		t.Helper()
		wr.Flags = gowarp.Signaled
		if err := p.a.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		return wait(t, p.acq).Status
	}
	if err := mr.Retire(old); err != nil {
		t.Fatal(err)
	}
	if sem, ok := mr.Semantics(old); !ok || sem != gowarp.Detached {
		t.Fatalf("a retired key's semantics: %v %v", sem, ok)
	}
	want := bytes.Clone(mem)
	for i := range sbuf {
		sbuf[i] = 0xee
	}
	for _, wr := range []gowarp.SendWR{
		{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: mr.Addr(), RKey: gowarp.STag(uint32(old))},
		{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: mr.Addr(), RKey: gowarp.STag(uint32(old))},
		{Op: gowarp.OpFetchAdd, SGL: []gowarp.SGE{{MR: src, Length: 8}}, RemoteAddr: mr.Addr() + 64, RKey: gowarp.STag(uint32(old)), CompareAdd: 9},
	} {
		if st := post(wr); st != gowarp.Success {
			t.Fatalf("%v through a retired key: %v", wr.Op, st)
		}
	}
	if !bytes.Equal(mem, want) {
		t.Fatal("an access through a retired key reached the memory")
	}
	if bytes.Contains(sbuf, want[:64]) {
		t.Fatal("a Read through a retired key returned the memory")
	}
	// The region's own key still reaches the memory.
	copy(sbuf, "through the own key")
	if st := post(gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 19}}, RemoteAddr: mr.Addr(), RKey: mr.STag()}); st != gowarp.Success {
		t.Fatal(st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mr.WaitPlaced(ctx, 19); err != nil || string(mem[:19]) != "through the own key" {
		t.Fatalf("a Write through the own key: %q %v", mem[:19], err)
	}
	if err := mr.Revoke(old); err != nil {
		t.Fatal(err)
	}
	if st := post(gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: src, Length: 8}}, RemoteAddr: mr.Addr(), RKey: gowarp.STag(uint32(old))}); st != gowarp.RemoteAccessError {
		t.Fatalf("a Read through a revoked key: %v", st)
	}
	if _, err := mr.ExposeKey(gowarp.Detached, 7); !errors.Is(err, gowarp.ErrBadSemantics) {
		t.Fatalf("Expose with Detached: %v", err)
	}
}
