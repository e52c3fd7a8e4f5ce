//go:build unix

package gowarp_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// Tests of file regions, storage semantics in the STag key and flushes
// (issue 8, items 1-3).

// newFile makes a file of n bytes, all 0xee, open read-write, on the
// test's temporary directory.
func newFile(t testing.TB, n int) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "region"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(bytes.Repeat([]byte{0xee}, n)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed)
	}
	return b
}

// post posts wr and waits for its completion, which must succeed.
func post(t testing.TB, p *pair, wr *gowarp.SendWR) gowarp.Completion {
	t.Helper()
	wr.Flags |= gowarp.Signaled
	if err := p.a.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	c := wait(t, p.acq)
	if err := c.Err(); err != nil {
		t.Fatalf("%v %d: %v (QP: %v)", c.Op, c.ID, err, p.a.Err())
	}
	return c
}

func flush(t testing.TB, p *pair, wr *gowarp.FlushWR) gowarp.Completion {
	t.Helper()
	wr.Flags |= gowarp.Signaled
	if err := p.a.PostFlush(wr); err != nil {
		t.Fatal(err)
	}
	return wait(t, p.acq)
}

// TestFileRegion: remote Writes land in a file's pages, Reads serve them,
// a flush makes them visible to the file's readers, and Deregister unmaps.
// The range starts off a page boundary.
func TestFileRegion(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	f := newFile(t, 1<<20)
	const off, size = 1000, 600 << 10
	fmr, err := p.pd.RegisterFile(f, off, size, gowarp.RemoteRead|gowarp.RemoteWrite, gowarp.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !fmr.File() || fmr.Len() != size {
		t.Fatalf("File %v Len %d", fmr.File(), fmr.Len())
	}
	src, sbuf := p.reg(t, 512<<10, gowarp.LocalWrite)
	for _, n := range []int{100, 5000, 300 << 10} {
		copy(sbuf, pattern(n, n))
		to := uint64(n) // anywhere inside
		post(t, p, &gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: fmr.Addr() + to, RKey: fmr.STag()})
		c := flush(t, p, &gowarp.FlushWR{Type: gowarp.FlushVisibility, RKey: fmr.STag()})
		if c.Err() != nil || c.Op != gowarp.CompFlush {
			t.Fatalf("flush: %v %v", c.Op, c.Err())
		}
		got := make([]byte, n)
		if _, err := f.ReadAt(got, off+int64(to)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, sbuf[:n]) {
			t.Fatalf("Write of %d bytes: the file does not hold it", n)
		}
		// Read it back into the other half of the source buffer.
		clear(sbuf[256<<10:])
		m := min(n, 256<<10)
		post(t, p, &gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: src, Offset: 256 << 10, Length: m}}, RemoteAddr: fmr.Addr() + to, RKey: fmr.STag()})
		if !bytes.Equal(sbuf[256<<10:256<<10+m], got[:m]) {
			t.Fatalf("Read of %d bytes from the file region differs", m)
		}
	}
	if err := fmr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if fmr.Valid() {
		t.Fatal("valid after Deregister")
	}
}

// TestRegisterFileBad: ranges outside the file, files not read-write and
// semantics a memory region cannot have are clear errors.
func TestRegisterFileBad(t *testing.T) {
	p := newIdlePair(t, 4)
	f := newFile(t, 8192)
	for _, c := range []struct{ off, n int64 }{{0, 8193}, {8192, 1}, {-1, 10}, {9000, 0}, {4096, 4097}} {
		if _, err := p.pd.RegisterFile(f, c.off, c.n, gowarp.RemoteWrite, gowarp.FileOptions{}); !errors.Is(err, gowarp.ErrFileRange) {
			t.Errorf("range %d+%d: err %v, want ErrFileRange", c.off, c.n, err)
		}
	}
	if _, err := p.pd.RegisterFile(f, 8192, 0, gowarp.RemoteWrite, gowarp.FileOptions{}); !errors.Is(err, gowarp.ErrEmptyBuffer) {
		t.Errorf("empty rest of file: err %v", err)
	}
	ro, err := os.Open(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := p.pd.RegisterFile(ro, 0, 0, gowarp.RemoteWrite, gowarp.FileOptions{}); err == nil {
		t.Error("a read-only file registered")
	}
	if _, err := p.pd.RegisterFile(f, 0, 0, gowarp.RemoteWrite, gowarp.FileOptions{Semantics: 9}); !errors.Is(err, gowarp.ErrBadSemantics) {
		t.Errorf("semantics 9: err %v", err)
	}
	mr, _ := p.reg(t, 4096, gowarp.RemoteWrite)
	for _, s := range []gowarp.Semantics{gowarp.Durable, gowarp.ReadThrough} {
		if _, err := mr.Expose(s); !errors.Is(err, gowarp.ErrNotFile) {
			t.Errorf("%v key on memory: err %v", s, err)
		}
	}
	whole, err := p.pd.RegisterFile(f, 0, 0, gowarp.RemoteWrite, gowarp.FileOptions{})
	if err != nil || whole.Len() != 8192 {
		t.Fatalf("whole file: %v", err)
	}
	// The caller's descriptor may close: the region keeps its own.
	f.Close()
	whole.Bytes()[0] = 1
	if err := whole.Deregister(); err != nil {
		t.Fatal(err)
	}
}

// TestFileTruncatedUnderRegion: a file truncated under a live region
// makes a Write or Read into the part cut off fail the queue pair with
// its Terminate; the process (SIGBUS) and other queue pairs live on.
func TestFileTruncatedUnderRegion(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   gowarp.WROp
		n    int
		want error
	}{
		{"write-small", gowarp.OpWrite, 1000, wire.ErrDDPBaseBounds},
		{"write-large", gowarp.OpWrite, 200 << 10, wire.ErrDDPBaseBounds},
		{"read", gowarp.OpRead, 64 << 10, wire.ErrRDMAPBaseBounds},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, gowarp.ConnectOptions{})
			other := newPair(t, gowarp.ConnectOptions{})
			f := newFile(t, 1<<20)
			fmr, err := p.pd.RegisterFile(f, 0, 0, gowarp.RemoteRead|gowarp.RemoteWrite, gowarp.FileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			src, _ := p.reg(t, tc.n, gowarp.LocalWrite)
			// Good first, then cut the file to 64 KiB and go past it.
			post(t, p, &gowarp.SendWR{Op: tc.op, SGL: []gowarp.SGE{{MR: src, Length: tc.n}}, RemoteAddr: fmr.Addr(), RKey: fmr.STag()})
			if tc.op == gowarp.OpWrite { // placed before the cut
				if c := flush(t, p, &gowarp.FlushWR{RKey: fmr.STag()}); c.Err() != nil {
					t.Fatal(c.Err())
				}
			}
			if err := f.Truncate(64 << 10); err != nil {
				t.Fatal(err)
			}
			wr := &gowarp.SendWR{ID: 2, Op: tc.op, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: tc.n}}, RemoteAddr: fmr.Addr() + 512<<10, RKey: fmr.STag()}
			if err := p.a.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			waitState(t, p.b, gowarp.StateError)
			if err := p.b.Err(); !errors.Is(err, gowarp.ErrTerminated) || !errors.Is(err, tc.want) {
				t.Fatalf("responder: %v, want ErrTerminated and %v", err, tc.want)
			}
			waitState(t, p.a, gowarp.StateError)
			if err := p.a.Err(); !errors.Is(err, gowarp.ErrPeerTerminated) || !errors.Is(err, tc.want) {
				t.Fatalf("requester: %v, want ErrPeerTerminated and %v", err, tc.want)
			}
			// The other pair still works, and the region deregisters.
			omr, _ := other.reg(t, 4096, gowarp.RemoteWrite)
			osrc, _ := other.reg(t, 4096, gowarp.LocalWrite)
			post(t, other, &gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: osrc, Length: 4096}}, RemoteAddr: omr.Addr(), RKey: omr.STag()})
			if err := fmr.Deregister(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSemanticKeys: one region under several keys at once, each with its
// semantics; Writes and Reads through every key reach the same memory; a
// key the region does not have (never exposed, or revoked) is an invalid
// STag with its Terminate.
func TestSemanticKeys(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	f := newFile(t, 256<<10)
	fmr, err := p.pd.RegisterFile(f, 0, 0, gowarp.RemoteRead|gowarp.RemoteWrite, gowarp.FileOptions{Semantics: gowarp.Durable})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := fmr.Expose(gowarp.Plain)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fmr.ExposeKey(gowarp.ReadThrough, 0x42)
	if err != nil && !errors.Is(err, gowarp.ErrKeyInUse) {
		t.Fatal(err)
	}
	if err != nil { // the random keys took 0x42
		rt, err = fmr.Expose(gowarp.ReadThrough)
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fmr.ExposeKey(gowarp.Plain, plain.Key()); !errors.Is(err, gowarp.ErrKeyInUse) {
		t.Fatalf("ExposeKey of a key in use: %v", err)
	}
	for s, want := range map[gowarp.STag]gowarp.Semantics{fmr.STag(): gowarp.Durable, plain: gowarp.Plain, rt: gowarp.ReadThrough} {
		if s.Index() != fmr.STag().Index() {
			t.Fatalf("%v: index differs from %v", s, fmr.STag())
		}
		if got, ok := fmr.Semantics(s); !ok || got != want {
			t.Fatalf("Semantics(%v) = %v, %v; want %v", s, got, ok, want)
		}
	}
	src, sbuf := p.reg(t, 128<<10, gowarp.LocalWrite)
	for i, s := range []gowarp.STag{fmr.STag(), plain, rt} {
		n := 40<<10 + i
		copy(sbuf, pattern(n, i))
		to := uint64(i) * 50 << 10
		post(t, p, &gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: fmr.Addr() + to, RKey: gowarp.STag(uint32(s))})
		// Read it back through the next key.
		next := []gowarp.STag{plain, rt, fmr.STag()}[i]
		post(t, p, &gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: src, Offset: 64 << 10, Length: n}}, RemoteAddr: fmr.Addr() + to, RKey: gowarp.STag(uint32(next))})
		if !bytes.Equal(sbuf[64<<10:64<<10+n], pattern(n, i)) {
			t.Fatalf("through %v then %v: data differs", s, next)
		}
	}
	if err := fmr.Revoke(plain); err != nil {
		t.Fatal(err)
	}
	if err := fmr.Revoke(fmr.STag()); err == nil {
		t.Fatal("revoked the region's own key")
	}
	if _, ok := fmr.Semantics(plain); ok {
		t.Fatal("revoked key still has semantics")
	}
	// A revoked key, then a key never exposed: invalid STag.
	for _, bad := range []gowarp.STag{plain, gowarp.STag(fmr.STag().Index()<<8 | uint32(unusedKey(fmr)))} {
		q := newPair(t, gowarp.ConnectOptions{})
		qmr, err := q.pd.RegisterFile(f, 0, 0, gowarp.RemoteWrite, gowarp.FileOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The same index in q's table is qmr; use bad's key on it.
		stag := uint32(qmr.STag().Index()<<8) | uint32(bad.Key())
		if bad.Key() == qmr.STag().Key() {
			continue
		}
		qsrc, _ := q.reg(t, 100, gowarp.LocalWrite)
		if err := q.a.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: qsrc, Length: 100}}, RemoteAddr: qmr.Addr(), RKey: gowarp.STag(stag)}); err != nil {
			t.Fatal(err)
		}
		waitState(t, q.b, gowarp.StateError)
		if err := q.b.Err(); !errors.Is(err, wire.ErrDDPInvalidSTag) {
			t.Fatalf("Write through key %#x: %v, want invalid STag", bad.Key(), err)
		}
		if err := qmr.Deregister(); err != nil {
			t.Fatal(err)
		}
	}
}

// unusedKey returns a key mr has not.
func unusedKey(mr *gowarp.MR) uint8 {
	for k := range 256 {
		if _, ok := mr.Semantics(gowarp.STag(mr.STag().Index()<<8 | uint32(k))); !ok {
			return uint8(k)
		}
	}
	panic("all keys used")
}

// TestFlushBad: a flush the responder cannot carry out fails at the
// requester with an error and at the responder with the right Terminate;
// one on a queue pair in error is refused at once.
func TestFlushBad(t *testing.T) {
	f := newFile(t, 64<<10)
	for _, tc := range []struct {
		name string
		wr   func(mem, file *gowarp.MR) gowarp.FlushWR
		want error
	}{
		{"wrong-key", func(m, _ *gowarp.MR) gowarp.FlushWR {
			return gowarp.FlushWR{RKey: m.STag() ^ 0x01, RemoteAddr: m.Addr(), Length: 1}
		}, wire.ErrRDMAPInvalidSTag},
		{"past-region", func(m, _ *gowarp.MR) gowarp.FlushWR {
			return gowarp.FlushWR{RKey: m.STag(), RemoteAddr: m.Addr() + 4000, Length: 97}
		}, wire.ErrRDMAPBaseBounds},
		{"persist-memory", func(m, _ *gowarp.MR) gowarp.FlushWR {
			return gowarp.FlushWR{Type: gowarp.FlushPersistence, RKey: m.STag()}
		}, wire.ErrRDMAPAccessRights},
		{"read-only-region", func(_, fm *gowarp.MR) gowarp.FlushWR {
			return gowarp.FlushWR{Type: gowarp.FlushPersistence, RKey: fm.STag()}
		}, wire.ErrRDMAPAccessRights},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, gowarp.ConnectOptions{})
			m, _ := p.reg(t, 4096, gowarp.RemoteWrite)
			fm, err := p.pd.RegisterFile(f, 0, 0, gowarp.RemoteRead, gowarp.FileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer fm.Deregister()
			wr := tc.wr(m, fm)
			c := flush(t, p, &wr)
			if c.Err() == nil || c.Op != gowarp.CompFlush {
				t.Fatalf("flush completed %v %v", c.Op, c.Err())
			}
			waitState(t, p.b, gowarp.StateError)
			if err := p.b.Err(); !errors.Is(err, gowarp.ErrTerminated) || !errors.Is(err, tc.want) {
				t.Fatalf("responder: %v, want %v", err, tc.want)
			}
			if err := p.a.Err(); !errors.Is(err, tc.want) {
				t.Fatalf("requester: %v, want %v", err, tc.want)
			}
			if err := p.a.PostFlush(&gowarp.FlushWR{RKey: m.STag()}); !errors.Is(err, gowarp.ErrNotReady) {
				t.Fatalf("flush on a QP in error: %v, want ErrNotReady", err)
			}
		})
	}
	p := newIdlePair(t, 4)
	if err := p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpFlush}); err == nil {
		t.Error("OpFlush through PostSend accepted")
	}
}

// TestFlushOrders: a flush after Writes completes only once they are
// placed: the responder's region holds them when the requester sees the
// flush complete. Durable keys and persistence flushes too, and a flush
// of the whole region.
func TestFlushOrders(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	f := newFile(t, 4<<20)
	fmr, err := p.pd.RegisterFile(f, 0, 0, gowarp.RemoteWrite, gowarp.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	durable, err := fmr.Expose(gowarp.Durable)
	if err != nil {
		t.Fatal(err)
	}
	src, sbuf := p.reg(t, 1<<20, gowarp.LocalWrite)
	copy(sbuf, pattern(1<<20, 3))
	for round, key := range []gowarp.STag{fmr.STag(), durable, fmr.STag(), durable} {
		before := fmr.Placed()
		for i := range 4 {
			if err := p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 1 << 20}}, RemoteAddr: fmr.Addr() + uint64(i)<<20, RKey: gowarp.STag(uint32(key))}); err != nil {
				t.Fatal(err)
			}
		}
		wr := gowarp.FlushWR{Type: gowarp.FlushType(round % 2), RKey: fmr.STag(), RemoteAddr: fmr.Addr() + 1<<20, Length: uint64(round) << 20}
		if c := flush(t, p, &wr); c.Err() != nil {
			t.Fatalf("flush: %v (%v)", c.Err(), p.a.Err())
		}
		if got := fmr.Placed() - before; got != 4<<20 {
			t.Fatalf("round %d: %d bytes placed when the flush completed, want %d", round, got, 4<<20)
		}
	}
}

// TestMemsemTraffic makes a little of each new kind of traffic — Writes
// and Reads through durable and read-through keys, flushes of both
// placement types — on GOWARP_MEMSEM_ADDR if set (a fixed port that
// ../shared/tools/wirecheck captures), else on any port.
func TestMemsemTraffic(t *testing.T) {
	addr := os.Getenv("GOWARP_MEMSEM_ADDR")
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	p := newPairOn(t, gowarp.ConnectOptions{}, addr, nil, nil)
	f := newFile(t, 64<<10)
	fmr, err := p.pd.RegisterFile(f, 0, 0, gowarp.RemoteRead|gowarp.RemoteWrite, gowarp.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	durable, _ := fmr.Expose(gowarp.Durable)
	rt, _ := fmr.Expose(gowarp.ReadThrough)
	src, sbuf := p.reg(t, 16<<10, gowarp.LocalWrite)
	copy(sbuf, pattern(8<<10, 9))
	post(t, p, &gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 8 << 10}}, RemoteAddr: fmr.Addr() + 100, RKey: gowarp.STag(uint32(durable))})
	for _, fl := range []gowarp.FlushWR{
		{Type: gowarp.FlushVisibility, RKey: fmr.STag(), RemoteAddr: fmr.Addr() + 100, Length: 8 << 10},
		{Type: gowarp.FlushPersistence, RKey: gowarp.STag(uint32(rt))},
	} {
		if c := flush(t, p, &fl); c.Err() != nil {
			t.Fatal(c.Err())
		}
	}
	post(t, p, &gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: src, Offset: 8 << 10, Length: 8 << 10}}, RemoteAddr: fmr.Addr() + 100, RKey: gowarp.STag(uint32(rt))})
	if !bytes.Equal(sbuf[8<<10:], sbuf[:8<<10]) {
		t.Fatal("read back differs")
	}
}
