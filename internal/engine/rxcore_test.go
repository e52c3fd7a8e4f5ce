package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// The receive core's tests: bytes in, effects out, with no socket and no
// goroutine. Each case builds a queue pair over sinkLink (whose Readv is
// never called: the test feeds the core itself), feeds it a byte stream
// and collects what the stream did: the memory placed, the completions,
// the bytes the queue pair wrote back (Read Responses, the Terminate),
// the core's error. Each stream is fed whole, then cut at every byte
// boundary, one byte at a time and in random pieces, and must do the same
// every time.

// sinkLink keeps what the queue pair writes. Reads are the test's: the
// core must never ask the link for them.
type sinkLink struct {
	streamLink
	mu  sync.Mutex
	out []byte
}

func newSinkLink() *sinkLink {
	c, _ := net.Pipe()
	return &sinkLink{streamLink: streamLink{c: c}}
}

func (l *sinkLink) Readv([][]byte) (int, error) {
	panic("engine: the receive core read from the link")
}

func (l *sinkLink) Writev(bufs [][]byte, _ []int, _ bool) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, b := range bufs {
		l.out = append(l.out, b...)
		n += len(b)
	}
	return n, nil
}

func (l *sinkLink) written() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.out)
}

// runHandedTx does the transmit goroutine's part, which these tests do
// not start: it runs the transmit path if it was handed over.
func runHandedTx(q *QP) {
	q.mu.Lock()
	handed := q.txHanded
	q.txHanded = false
	q.mu.Unlock()
	if handed {
		q.transmit(true, false)
	}
}

// coreEnv is what a case's stream refers to: regions registered once per
// case (so that every feeding of it sees the same STags) and the queue
// pair of the current feeding.
type coreEnv struct {
	table *mem.Table
	// rw: remote write+read and local write; ro: remote read only; wo:
	// remote write only; other: another protection domain; big: 128 KiB
	// remote read (a Read Response the receive path hands to the
	// transmit goroutine); local: local write only (receives, Read sinks).
	rw, ro, wo, other, big, local *mem.Region
	// at: remote atomic, read and write.
	at  *mem.Region
	all []*mem.Region
	// inv is registered afresh for every feeding, as a Send with
	// Invalidate kills it.
	inv *mem.Region
	// miniIdle: run feeds with the small staging buffer after every wait.
	miniIdle bool
	ext      bool // the next queue pair negotiated RFC 7306's extensions
	q        *QP
	cq       *CQ
	crc      bool
	fill     []byte // every region's starting contents
}

const coreBase = 0x10000 // every region's tagged offset

func newCoreEnv(t testing.TB) *coreEnv {
	e := &coreEnv{table: mem.NewTable()}
	reg := func(pd uint32, n int, acc mem.Access) *mem.Region {
		m, err := e.table.Register(pd, [][]byte{make([]byte, n)}, acc, mem.Options{Addr: coreBase})
		if err != nil {
			t.Fatal(err)
		}
		e.all = append(e.all, m)
		return m
	}
	e.rw = reg(1, 4096, mem.RemoteWrite|mem.RemoteRead|mem.LocalWrite)
	e.ro = reg(1, 4096, mem.RemoteRead)
	e.wo = reg(1, 4096, mem.RemoteWrite)
	e.other = reg(2, 4096, mem.RemoteWrite|mem.RemoteRead)
	e.big = reg(1, 128<<10, mem.RemoteRead)
	e.local = reg(1, 4096, mem.LocalWrite)
	e.at = reg(1, 4096, mem.RemoteAtomic|mem.RemoteRead|mem.RemoteWrite|mem.LocalWrite)
	return e
}

// reset gives every region its starting contents and makes a new queue
// pair, ready, with no goroutine.
func (e *coreEnv) reset(t testing.TB, crc bool, ird int) *sinkLink {
	if e.fill == nil {
		e.fill = pattern(128<<10, 3)
	}
	for _, m := range e.all {
		copy(m.Bytes(), e.fill)
	}
	if e.inv != nil {
		e.inv.Deregister() // the last queue pair's (a fuzz run makes thousands)
	}
	inv, err := e.table.Register(1, [][]byte{make([]byte, 64)}, mem.RemoteWrite|mem.LocalWrite|mem.RemoteInvalidate, mem.Options{Addr: coreBase})
	if err != nil {
		t.Fatal(err)
	}
	e.inv = inv
	e.cq = NewCQ(256)
	e.q, err = NewQP(Config{SendDepth: 16, RecvDepth: 16, SendCQ: e.cq, RecvCQ: e.cq, PD: 1, Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	e.crc = crc
	l := newSinkLink()
	e.q.mu.Lock()
	e.q.readyLocked(l, Params{CRC: crc, IRD: ird, ORD: 4, MaxFPDU: 512, Ext: e.ext})
	e.q.mu.Unlock()
	return l
}

// fileRegion registers the mapping of a 4 KiB file, zeros, in e's table
// for local writes; both end with the test.
func (e *coreEnv) fileRegion(t testing.TB) (*os.File, *mem.Region) {
	f, err := os.Create(filepath.Join(t.TempDir(), "region"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	file, err := e.table.RegisterFile(1, f, 0, 4096, mem.LocalWrite, mem.Plain, mem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { file.Deregister() })
	return f, file
}

// recv posts a receive of the given SGE lengths in e.local, end to end.
func (e *coreEnv) recv(t testing.TB, id uint64, lens ...int) {
	var sgl []SGE
	off := 0
	for _, n := range lens {
		sgl = append(sgl, SGE{MR: e.local, Offset: off, Length: n})
		off += n
	}
	if err := e.q.PostRecv(&RecvWR{ID: id, SGL: sgl}); err != nil {
		t.Fatal(err)
	}
}

// read posts a signaled RDMA Read of n bytes from the peer's STag 0x77 at
// TO 0x5000 into e.local at off: its Read Request goes to the sink and
// it waits in the ORQ for the stream's Read Responses.
func (e *coreEnv) read(t testing.TB, id uint64, off, n int) {
	wr := SendWR{ID: id, Op: OpRead, Flags: Signaled, RKey: 0x77, RemoteAddr: 0x5000,
		SGL: []SGE{{MR: e.local, Offset: off, Length: n}}}
	if err := e.q.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
}

// fpdu is one FPDU of a stream: header, RDMAP body, payload.
func (e *coreEnv) fpdu(h wire.Header, body, payload []byte) []byte {
	u := h.Append(nil)
	u = append(u, body...)
	u = append(u, payload...)
	b, err := wire.AppendFPDU(nil, u, e.crc)
	if err != nil {
		panic(err)
	}
	return b
}

func chdr(op wire.Opcode) wire.Header {
	return wire.Header{Opcode: op, Tagged: op.Info().Tagged, Last: true, DDPVersion: 1, RDMAPVersion: 1, QN: op.Info().QN}
}

func (e *coreEnv) write(stag mem.STag, to uint64, payload []byte) []byte {
	h := chdr(wire.OpWrite)
	h.STag, h.TO = uint32(stag), to
	return e.fpdu(h, nil, payload)
}

// writeSeg is one segment of a Write, the last or not.
func (e *coreEnv) writeSeg(stag mem.STag, to uint64, last bool, payload []byte) []byte {
	h := chdr(wire.OpWrite)
	h.STag, h.TO, h.Last = uint32(stag), to, last
	return e.fpdu(h, nil, payload)
}

// send is one segment of a Send of the given opcode.
func (e *coreEnv) send(op wire.Opcode, msn, mo uint32, last bool, payload []byte) []byte {
	h := chdr(op)
	h.MSN, h.MO, h.Last = msn, mo, last
	return e.fpdu(h, nil, payload)
}

// imm is one segment of an Immediate Data message.
func (e *coreEnv) imm(op wire.Opcode, msn, mo uint32, last bool, v uint64, payload []byte) []byte {
	h := chdr(op)
	h.MSN, h.MO, h.Last = msn, mo, last
	return e.fpdu(h, wire.AppendImmediate(nil, v), payload)
}

// atomic is an Atomic Request.
func (e *coreEnv) atomic(msn uint32, ar wire.AtomicRequest) []byte {
	h := chdr(wire.OpAtomicRequest)
	h.MSN = msn
	return e.fpdu(h, ar.Append(nil), nil)
}

func (e *coreEnv) readReq(msn uint32, rr wire.ReadRequest) []byte {
	h := chdr(wire.OpReadRequest)
	h.MSN = msn
	return e.fpdu(h, rr.Append(nil), nil)
}

// response is a Read Response segment for the Read at e.local's off.
func (e *coreEnv) response(off int, last bool, payload []byte) []byte {
	h := chdr(wire.OpReadResponse)
	h.STag, h.TO, h.Last = uint32(e.local.STag()), coreBase+uint64(off), last
	return e.fpdu(h, nil, payload)
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)*31 + seed
	}
	return b
}

// coreEffects is everything a stream did.
type coreEffects struct {
	err    string       // the core's error, "" for none
	out    []byte       // what the queue pair wrote
	comps  []Completion // every completion, QP cleared, the flush's included
	mem    []uint32     // a checksum of every region's contents
	placed []uint64     // every region's placed count
	fpdus  uint64
}

func (a *coreEffects) diff(b *coreEffects) string {
	switch {
	case a.err != b.err:
		return fmt.Sprintf("error %q, then %q", a.err, b.err)
	case !bytes.Equal(a.out, b.out):
		return fmt.Sprintf("wrote %x, then %x", a.out, b.out)
	case !slices.Equal(a.comps, b.comps):
		return fmt.Sprintf("completions %+v, then %+v", a.comps, b.comps)
	case !slices.Equal(a.mem, b.mem):
		return "placed different bytes"
	case !slices.Equal(a.placed, b.placed):
		return fmt.Sprintf("placed counts %v, then %v", a.placed, b.placed)
	case a.fpdus != b.fpdus:
		return fmt.Sprintf("%d FPDUs, then %d", a.fpdus, b.fpdus)
	}
	return ""
}

// terminate returns the Terminate the queue pair wrote, if any.
func (x *coreEffects) terminate(crc bool) (wire.Terminate, bool) {
	for b := x.out; len(b) > 0; {
		f, n, err := wire.ParseFPDU(b, crc)
		if err != nil {
			return wire.Terminate{}, false
		}
		b = b[n:]
		h, k, err := wire.ParseHeader(f.ULPDU)
		if err == nil && h.Opcode == wire.OpTerminate {
			t, _, err := wire.ParseTerminate(f.ULPDU[k:])
			return t, err == nil
		}
	}
	return wire.Terminate{}, false
}

// outFPDUs returns the headers and payloads of what the queue pair wrote.
func (x *coreEffects) outFPDUs(t testing.TB, crc bool) ([]wire.Header, [][]byte) {
	var hs []wire.Header
	var ps [][]byte
	for b := x.out; len(b) > 0; {
		f, n, err := wire.ParseFPDU(b, crc)
		if err != nil {
			t.Fatalf("the queue pair wrote a bad FPDU: %v", err)
		}
		b = b[n:]
		h, k, err := wire.ParseHeader(f.ULPDU)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
		ps = append(ps, f.ULPDU[k:])
	}
	return hs, ps
}

// feedCore hands in to the core in the given pieces, as a driver would:
// each piece is what one read brought, into the vectors next gave; it
// returns the core's error.
func feedCore(t testing.TB, r *rxState, in []byte, cuts []int) error {
	prev := 0
	defer r.answerNow()
	for _, c := range append(cuts, len(in)) {
		piece := in[prev:c]
		prev = c
		for len(piece) > 0 {
			r.answerNow() // before each read, as receive does
			if r.lastIdle > 0 && r.buf != nil && r.r == r.w {
				// As the driver's wait with nothing staged gives the
				// buffer back, and takes the small one after it (see
				// rxMini): a test that set lastIdle.
				r.putStaging(r.buf)
			}
			k := 0
			for _, v := range r.next() {
				k += copy(v, piece[k:])
				if k == len(piece) {
					break
				}
			}
			if k == 0 {
				t.Fatal("the core gave no room to read into")
			}
			piece = piece[k:]
			if err := r.advance(k); err != nil {
				return err
			}
			for r.staged() {
				if err := r.advance(0); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// run feeds one case's stream to a fresh queue pair and collects its effects.
func (e *coreEnv) run(t testing.TB, c *coreCase, crc bool, cuts func(n int) []int) (*coreEffects, []byte) {
	e.ext = c.ext
	l := e.reset(t, crc, c.ird)
	if e.miniIdle {
		e.q.rx.lastIdle = 1 // every wait takes the small buffer (see feedCore)
	}
	if c.setup != nil {
		c.setup(t, e)
	}
	in := c.stream(e)
	before := make([]uint64, len(e.all))
	for i, m := range e.all {
		before[i] = m.Placed()
	}
	q := e.q
	x := &coreEffects{}
	err := feedCore(t, &q.rx, in, cuts(len(in)))
	x.fpdus = q.rx.fpdus
	if err != nil {
		x.err = err.Error()
		if !c.peerTerm {
			var f *fault
			if !errors.As(err, &f) {
				t.Fatalf("the core failed with %v, not a fault", err)
			}
		}
		q.rxFailed(err)
		runHandedTx(q) // writes the Terminate
	}
	q.fail(ErrClosed) // flushes what is left, with its statuses
	runHandedTx(q)
	q.rx.release() // as the receive goroutine does when it ends (rxEnd) // flushes what is left, with its statuses
	x.out = l.written()
	var wc [64]Completion
	for n := e.cq.Poll(wc[:]); n > 0; n = e.cq.Poll(wc[:]) {
		for i := range wc[:n] {
			wc[i].QP = nil
			x.comps = append(x.comps, wc[i])
		}
	}
	for i, m := range e.all {
		x.mem = append(x.mem, crc32.ChecksumIEEE(m.Bytes()))
		x.placed = append(x.placed, m.Placed()-before[i])
		if m.InUse() {
			t.Errorf("region %d still pinned or held after the queue pair failed", i)
		}
	}
	if e.inv.InUse() {
		t.Error("the invalidated region is still held")
	}
	// A Send with Invalidate names e.inv, new for every feeding.
	for i := range x.comps {
		if x.comps[i].Invalidated == uint32(e.inv.STag()) {
			x.comps[i].Invalidated = 1
		}
	}
	return x, in
}

// coreCase is a stream and what it must do.
type coreCase struct {
	name     string
	ird      int
	ext      bool   // RFC 7306's extensions negotiated
	crc      []bool // CRC settings to run it under; both if nil
	setup    func(t testing.TB, e *coreEnv)
	stream   func(e *coreEnv) []byte
	peerTerm bool // the stream ends with the peer's Terminate
	// check judges the effects of the whole stream.
	check func(t testing.TB, e *coreEnv, x *coreEffects)
	// hostile: the Terminate's error, whether it echoes the DDP header
	// (and the Read Request), and the status of receive 100, if posted.
	want   *wire.TermError
	echo   bool
	readRq bool
	status Status
}

func wantComps(t testing.TB, x *coreEffects, want ...Completion) {
	t.Helper()
	if !slices.Equal(x.comps, want) {
		t.Errorf("completions\n%+v\nwant\n%+v", x.comps, want)
	}
}

func wantMem(t testing.TB, m *mem.Region, off int, want []byte) {
	t.Helper()
	if got := m.Bytes()[off : off+len(want)]; !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Errorf("placed %d bytes at %d, differing from byte %d on", len(want), off, i)
	}
}

func validCoreCases() []coreCase {
	w1 := pattern(8, 1)
	w2 := pattern(2600, 2) // placed straight into the region
	s1 := pattern(300, 3)
	s2 := pattern(2100, 4)
	r1 := pattern(1000, 5)
	r2 := pattern(2100, 6)
	return []coreCase{
		{name: "writes", stream: func(e *coreEnv) []byte {
			var b []byte
			b = append(b, e.write(e.rw.STag(), coreBase+5, w1)...)
			b = append(b, e.write(e.wo.STag(), coreBase, nil)...) // zero-length: a nudge
			b = append(b, e.write(e.rw.STag(), coreBase+1000, w2[:2100])...)
			b = append(b, e.write(e.rw.STag(), coreBase+3100, w2[2100:])...)
			return b
		}, check: func(t testing.TB, e *coreEnv, x *coreEffects) {
			wantMem(t, e.rw, 5, w1)
			wantMem(t, e.rw, 1000, w2)
			if x.placed[0] != 8+2600 || x.fpdus != 4 {
				t.Errorf("placed %d in %d FPDUs, want 2608 in 4", x.placed[0], x.fpdus)
			}
			wantComps(t, x)
		}},
		{name: "writes in segments", stream: func(e *coreEnv) []byte {
			// A Write in three FPDUs, another to a second region begun
			// before its last, a zero-length segment, then its end: each
			// FPDU is judged, and Placed counts every one.
			var b []byte
			b = append(b, e.writeSeg(e.rw.STag(), coreBase+100, false, w2[:1000])...)
			b = append(b, e.writeSeg(e.rw.STag(), coreBase+1100, false, w2[1000:2500])...)
			b = append(b, e.writeSeg(e.wo.STag(), coreBase+50, false, w1)...)
			b = append(b, e.writeSeg(e.rw.STag(), coreBase+2600, true, w2[2500:])...)
			b = append(b, e.writeSeg(e.wo.STag(), coreBase+58, false, nil)...)
			b = append(b, e.writeSeg(e.wo.STag(), coreBase+58, true, w1)...)
			return b
		}, check: func(t testing.TB, e *coreEnv, x *coreEffects) {
			wantMem(t, e.rw, 100, w2)
			wantMem(t, e.wo, 50, w1)
			wantMem(t, e.wo, 58, w1)
			if x.placed[0] != 2600 || x.placed[2] != 16 || x.fpdus != 6 {
				t.Errorf("placed %d and %d in %d FPDUs, want 2600 and 16 in 6", x.placed[0], x.placed[2], x.fpdus)
			}
			if e.rw.InUse() || e.wo.InUse() {
				t.Error("a region is still held")
			}
			wantComps(t, x)
		}},
		{name: "sends of every kind", setup: func(t testing.TB, e *coreEnv) {
			e.recv(t, 1, 16)
			e.recv(t, 2, 100, 1000, 1500) // three SGEs
			e.recv(t, 3, 8)
			e.recv(t, 4, 8)
			e.recv(t, 5, 64) // flushed at the end
		}, stream: func(e *coreEnv) []byte {
			var b []byte
			b = append(b, e.send(wire.OpSend, 1, 0, true, s1[:16])...)
			// A Send in three segments, the middle one large.
			b = append(b, e.send(wire.OpSendSE, 2, 0, false, s1)...)
			b = append(b, e.send(wire.OpSendSE, 2, 300, false, s2)...)
			b = append(b, e.send(wire.OpSendSE, 2, 2400, true, s1[:10])...)
			b = append(b, e.send(wire.OpSend, 3, 0, true, nil)...)
			h := chdr(wire.OpSendInv)
			h.MSN, h.RsvdULP = 4, uint32(e.inv.STag())
			b = append(b, e.fpdu(h, nil, s1[:8])...)
			return b
		}, check: func(t testing.TB, e *coreEnv, x *coreEffects) {
			wantComps(t, x,
				Completion{ID: 1, Op: CompRecv, Bytes: 16},
				Completion{ID: 2, Op: CompRecv, Bytes: 2410, Solicited: true},
				Completion{ID: 3, Op: CompRecv},
				Completion{ID: 4, Op: CompRecv, Bytes: 8, Invalidated: 1},
				Completion{ID: 5, Op: CompRecv, Status: WRFlushError})
			wantMem(t, e.local, 0, s1[:8]) // receive 4 wrote it last
			wantMem(t, e.local, 8, s1[8:16])
			wantMem(t, e.local, 16, s1[16:100])
			wantMem(t, e.local, 100, s1[100:])
			wantMem(t, e.local, 300, s2)
			wantMem(t, e.local, 2400, s1[:10])
			if e.inv.Valid() {
				t.Error("Send with Invalidate left its STag valid")
			}
		}},
		{name: "sends of one FPDU", setup: func(t testing.TB, e *coreEnv) {
			// Single-FPDU Sends into one region's two SGEs, into one
			// large SGE, with no SGE at all, and after them all.
			if err := e.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{{MR: e.local, Length: 8}, {MR: e.local, Offset: 100, Length: 8}}}); err != nil {
				t.Fatal(err) // one region in two SGEs
			}
			if err := e.q.PostRecv(&RecvWR{ID: 2, SGL: []SGE{{MR: e.local, Offset: 2000, Length: 1500}}}); err != nil {
				t.Fatal(err)
			}
			e.recv(t, 3) // no SGE
			e.recv(t, 4, 8)
		}, stream: func(e *coreEnv) []byte {
			var b []byte
			b = append(b, e.send(wire.OpSendSE, 1, 0, true, s1[:12])...)
			b = append(b, e.send(wire.OpSend, 2, 0, true, s2[:1100])...)
			b = append(b, e.send(wire.OpSend, 3, 0, true, nil)...)
			b = append(b, e.send(wire.OpSend, 4, 0, true, s1[:8])...)
			return b
		}, check: func(t testing.TB, e *coreEnv, x *coreEffects) {
			wantComps(t, x,
				Completion{ID: 1, Op: CompRecv, Bytes: 12, Solicited: true},
				Completion{ID: 2, Op: CompRecv, Bytes: 1100},
				Completion{ID: 3, Op: CompRecv},
				Completion{ID: 4, Op: CompRecv, Bytes: 8})
			wantMem(t, e.local, 0, s1[:8]) // receives 1 and 4
			wantMem(t, e.local, 100, s1[8:12])
			wantMem(t, e.local, 2000, s2[:1100])
			if e.local.InUse() {
				t.Error("the receives' region is still held")
			}
		}},
		{name: "immediate data", ext: true, setup: func(t testing.TB, e *coreEnv) {
			e.recv(t, 1, 16)
			e.recv(t, 2, 100, 3000)
			e.recv(t, 3, 8)
		}, stream: func(e *coreEnv) []byte {
			var b []byte
			// A Write with immediate data: the Write, then the Immediate
			// Data message, which completes receive 1 with nothing in it.
			b = append(b, e.write(e.rw.STag(), coreBase+5, w1)...)
			b = append(b, e.imm(wire.OpImmediate, 1, 0, true, 0xabc, nil)...)
			// A Send with immediate data in segments, each with the body.
			b = append(b, e.imm(wire.OpImmediateSE, 2, 0, false, 7, s1)...)
			b = append(b, e.imm(wire.OpImmediateSE, 2, 300, true, 7, s2)...)
			// The RFC's 8 bytes: verbs' 4 are the low half.
			b = append(b, e.imm(wire.OpImmediate, 3, 0, true, 1<<32|5, nil)...)
			return b
		}, check: func(t testing.TB, e *coreEnv, x *coreEffects) {
			wantComps(t, x,
				Completion{ID: 1, Op: CompRecv, Imm: 0xabc, WithImm: true},
				Completion{ID: 2, Op: CompRecv, Bytes: 2400, Solicited: true, Imm: 7, WithImm: true},
				Completion{ID: 3, Op: CompRecv, Imm: 5, WithImm: true})
			wantMem(t, e.rw, 5, w1)
			wantMem(t, e.local, 0, s1) // every receive's SGEs start at 0
			wantMem(t, e.local, 300, s2)
		}},
		{name: "read requests", ird: 4, stream: func(e *coreEnv) []byte {
			var b []byte
			b = append(b, e.readReq(1, wire.ReadRequest{SinkSTag: 0x99, SinkTO: 0x100, Size: 600,
				SourceSTag: uint32(e.rw.STag()), SourceTO: coreBase + 10})...)
			b = append(b, e.readReq(2, wire.ReadRequest{SinkSTag: 0x99, SinkTO: 0x900, Size: 0})...) // touches nothing
			b = append(b, e.readReq(3, wire.ReadRequest{SinkSTag: 0x98, Size: 4,
				SourceSTag: uint32(e.ro.STag()), SourceTO: coreBase + 4092})...)
			return b
		}, check: func(t testing.TB, e *coreEnv, x *coreEffects) {
			hs, ps := x.outFPDUs(t, e.crc)
			var got []byte
			var sizes []int
			for i, h := range hs {
				if h.Opcode != wire.OpReadResponse {
					t.Fatalf("wrote %v, want Read Responses", h.Opcode)
				}
				got = append(got, ps[i]...)
				sizes = append(sizes, len(ps[i]))
				if h.Last {
					sizes = append(sizes, -1)
				}
			}
			want := append(slices.Clone(e.rw.Bytes()[10:610]), e.ro.Bytes()[4092:]...)
			if !bytes.Equal(got, want) || hs[0].STag != 0x99 || hs[0].TO != 0x100 || hs[len(hs)-1].STag != 0x98 {
				t.Errorf("Read Responses %+v (sizes %v), want 600 bytes from rw to 0x99, none, 4 from ro to 0x98", hs, sizes)
			}
			wantComps(t, x)
		}},
		{name: "atomic requests", ext: true, ird: 4, stream: func(e *coreEnv) []byte {
			var b []byte
			at, word := uint32(e.at.STag()), func(off int) uint64 { return binary.NativeEndian.Uint64(e.fill[off:]) }
			// A Read of a word no atomic touches: a Read Response's bytes
			// are read when it is written, which may be after the atomics
			// behind it ran (a requester fences to see the word before).
			b = append(b, e.readReq(1, wire.ReadRequest{SinkSTag: 0x99, Size: 8, SourceSTag: at, SourceTO: coreBase + 40})...)
			b = append(b, e.atomic(2, wire.AtomicRequest{Op: wire.AtomicFetchAdd, ReqID: 2, RemoteSTag: at, RemoteTO: coreBase + 8, AddSwap: 5})...)
			b = append(b, e.atomic(3, wire.AtomicRequest{Op: wire.AtomicCmpSwap, ReqID: 3, RemoteSTag: at, RemoteTO: coreBase + 8,
				AddSwap: 77, AddSwapMask: ^uint64(0), Compare: word(8) + 5, CompareMask: ^uint64(0)})...)
			b = append(b, e.atomic(4, wire.AtomicRequest{Op: wire.AtomicCmpSwap, ReqID: 4, RemoteSTag: at, RemoteTO: coreBase + 16,
				AddSwap: 1, AddSwapMask: ^uint64(0), Compare: word(16) + 1, CompareMask: ^uint64(0)})...) // no match
			b = append(b, e.atomic(5, wire.AtomicRequest{Op: wire.AtomicCmpSwap, ReqID: 5, RemoteSTag: at, RemoteTO: coreBase + 24,
				AddSwap: 0x1234, AddSwapMask: ^uint64(0)})...) // Atomic Write: compare mask 0
			b = append(b, e.atomic(6, wire.AtomicRequest{Op: wire.AtomicFetchAdd, ReqID: 6, RemoteSTag: at, RemoteTO: coreBase + 32,
				AddSwap: 0x0000_0001_ffff_ffff, AddSwapMask: 1 << 31})...) // two 32-bit fields
			return b
		}, check: func(t testing.TB, e *coreEnv, x *coreEffects) {
			word := func(off int) uint64 { return binary.NativeEndian.Uint64(e.fill[off:]) }
			hs, ps := x.outFPDUs(t, e.crc)
			if len(hs) != 6 || hs[0].Opcode != wire.OpReadResponse || !bytes.Equal(ps[0], e.fill[40:48]) {
				t.Fatalf("wrote %+v, want the Read Response first", hs)
			}
			w32 := word(32)
			want := []uint64{word(8), word(8) + 5, word(16), word(24), w32}
			for i, h := range hs[1:] {
				r, _, err := wire.ParseAtomicResponse(ps[i+1])
				if h.Opcode != wire.OpAtomicResponse || h.QN != wire.QNAtomicResponse || h.MSN != uint32(i+1) || !h.Last ||
					err != nil || r.ReqID != uint32(i+2) || r.Original != want[i] || len(ps[i+1]) != wire.AtomicResponseLen {
					t.Errorf("response %d: %+v %+v (%v), want original %#x", i, h, r, err, want[i])
				}
			}
			m := e.at.Bytes()
			lo, hi := uint32(w32)+0xffffffff, uint32(w32>>32)+1 // no carry between the fields
			for off, v := range map[int]uint64{8: 77, 16: word(16), 24: 0x1234, 32: uint64(hi)<<32 | uint64(lo)} {
				if got := binary.NativeEndian.Uint64(m[off:]); got != v {
					t.Errorf("word at %d = %#x, want %#x", off, got, v)
				}
			}
			wantComps(t, x)
		}},
		{name: "atomic responses", ext: true, setup: func(t testing.TB, e *coreEnv) {
			e.read(t, 10, 0, 8)
			for i, op := range []WROp{OpFetchAdd, OpCmpSwap, OpAtomicWrite} {
				wr := SendWR{ID: uint64(20 + i), Op: op, Flags: Signaled, RKey: 0x77, RemoteAddr: 0x5000,
					SGL: []SGE{{MR: e.local, Offset: 8 * (i + 1), Length: 8}}}
				if err := e.q.PostSend(&wr); err != nil {
					t.Fatal(err)
				}
			}
		}, stream: func(e *coreEnv) []byte {
			b := e.response(0, true, r1[:8])
			for i := range 3 {
				h := chdr(wire.OpAtomicResponse)
				h.MSN = uint32(i + 1)
				b = append(b, e.fpdu(h, (&wire.AtomicResponse{ReqID: uint32(i + 2), Original: 0xa0 + uint64(i)}).Append(nil), nil)...)
			}
			return b
		}, check: func(t testing.TB, e *coreEnv, x *coreEffects) {
			wantComps(t, x, Completion{ID: 10, Op: CompRead, Bytes: 8},
				Completion{ID: 20, Op: CompAtomic, Bytes: 8}, Completion{ID: 21, Op: CompAtomic, Bytes: 8}, Completion{ID: 22, Op: CompAtomic, Bytes: 8})
			for i := range 3 {
				if got := binary.NativeEndian.Uint64(e.local.Bytes()[8*(i+1):]); got != 0xa0+uint64(i) {
					t.Errorf("result %d = %#x", i, got)
				}
			}
		}},
		{name: "read responses", setup: func(t testing.TB, e *coreEnv) {
			e.read(t, 10, 0, 1000)
			e.read(t, 11, 1000, 2100)
			e.read(t, 12, 3100, 0)
		}, stream: func(e *coreEnv) []byte {
			var b []byte
			b = append(b, e.response(0, false, r1[:400])...)
			b = append(b, e.response(400, true, r1[400:])...)
			b = append(b, e.response(1000, true, r2)...)
			b = append(b, e.response(3100, true, nil)...)
			return b
		}, check: func(t testing.TB, e *coreEnv, x *coreEffects) {
			wantMem(t, e.local, 0, r1)
			wantMem(t, e.local, 1000, r2)
			wantComps(t, x,
				Completion{ID: 10, Op: CompRead, Bytes: 1000},
				Completion{ID: 11, Op: CompRead, Bytes: 2100},
				Completion{ID: 12, Op: CompRead})
			if x.placed[5] != 3100 {
				t.Errorf("placed %d in the sink, want 3100", x.placed[5])
			}
		}},
		{name: "peer Terminate", peerTerm: true, setup: func(t testing.TB, e *coreEnv) {
			e.recv(t, 100, 64)
		}, stream: func(e *coreEnv) []byte {
			term := wire.NewTerminate(wire.ErrRDMAPAccessRights, e.write(0x1234, 0x10, []byte{1})[2:16], 15, nil)
			h := chdr(wire.OpTerminate)
			h.MSN = 1
			return append(e.write(e.rw.STag(), coreBase, w1), e.fpdu(h, term.Append(nil), nil)...)
		}, check: func(t testing.TB, e *coreEnv, x *coreEffects) {
			if !bytes.Contains([]byte(x.err), []byte(wire.ErrRDMAPAccessRights.Error())) || len(x.out) != 0 {
				t.Errorf("peer Terminate: error %q, wrote %x; want the peer's reason and nothing written", x.err, x.out)
			}
			wantMem(t, e.rw, 0, w1)
			wantComps(t, x, Completion{ID: 100, Op: CompRecv, Status: WRFlushError})
		}},
	}
}

// hostileCoreCases are root's TestBadInputTerminates, as bytes.
func hostileCoreCases() []coreCase {
	junk := make([]byte, 8)
	w := func(f func(e *coreEnv) (mem.STag, uint64)) func(e *coreEnv) []byte {
		return func(e *coreEnv) []byte { s, to := f(e); return e.write(s, to, junk) }
	}
	rd := func(f func(e *coreEnv) wire.ReadRequest) func(e *coreEnv) []byte {
		return func(e *coreEnv) []byte { return e.readReq(1, f(e)) }
	}
	raw := func(op wire.Opcode, f func(h *wire.Header), body []byte) func(e *coreEnv) []byte {
		return func(e *coreEnv) []byte {
			h := chdr(op)
			f(&h)
			return e.fpdu(h, body, nil)
		}
	}
	recv64 := func(t testing.TB, e *coreEnv) { e.recv(t, 100, 64) }
	// A good Write first, where no case writes: the fault comes in the
	// middle of the stream, and the Write stays placed.
	lead := func(f func(e *coreEnv) []byte) func(e *coreEnv) []byte {
		return func(e *coreEnv) []byte { return append(e.write(e.rw.STag(), coreBase+3000, pattern(40, 9)), f(e)...) }
	}
	cases := []coreCase{
		{name: "write to unknown STag", stream: w(func(e *coreEnv) (mem.STag, uint64) { return 0x00ffff00, 0 }), want: wire.ErrDDPInvalidSTag, echo: true},
		{name: "write with wrong key", stream: w(func(e *coreEnv) (mem.STag, uint64) { return e.rw.STag() ^ 0x5a, coreBase }), want: wire.ErrDDPInvalidSTag, echo: true},
		{name: "write past the region", stream: w(func(e *coreEnv) (mem.STag, uint64) { return e.rw.STag(), coreBase + 4090 }), want: wire.ErrDDPBaseBounds, echo: true},
		{name: "write before the region", stream: w(func(e *coreEnv) (mem.STag, uint64) { return e.rw.STag(), coreBase - 1 }), want: wire.ErrDDPBaseBounds, echo: true},
		{name: "write without the right", stream: w(func(e *coreEnv) (mem.STag, uint64) { return e.ro.STag(), coreBase }), want: wire.ErrDDPInvalidSTag, echo: true},
		{name: "write to another PD", stream: w(func(e *coreEnv) (mem.STag, uint64) { return e.other.STag(), coreBase }), want: wire.ErrDDPSTagNotAssoc, echo: true},
		{name: "write segment past the region", stream: func(e *coreEnv) []byte {
			// Its first segment fits; the second, to the same STag, does not.
			return append(e.writeSeg(e.rw.STag(), coreBase+3500, false, make([]byte, 500)),
				e.writeSeg(e.rw.STag(), coreBase+4000, true, make([]byte, 200))...)
		}, want: wire.ErrDDPBaseBounds, echo: true},
		{name: "write segment to another PD", stream: func(e *coreEnv) []byte {
			return append(e.writeSeg(e.rw.STag(), coreBase+3500, false, make([]byte, 100)),
				e.writeSeg(e.other.STag(), coreBase+3600, true, make([]byte, 100))...)
		}, want: wire.ErrDDPSTagNotAssoc, echo: true},
		{name: "write with TO wrap", stream: w(func(e *coreEnv) (mem.STag, uint64) { return e.rw.STag(), ^uint64(0) - 2 }), want: wire.ErrDDPTOWrap, echo: true},
		{name: "read from unknown STag", ird: 4, stream: rd(func(e *coreEnv) wire.ReadRequest {
			return wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: 0x00ffff00}
		}), want: wire.ErrRDMAPInvalidSTag, echo: true, readRq: true},
		{name: "read past the region", ird: 4, stream: rd(func(e *coreEnv) wire.ReadRequest {
			return wire.ReadRequest{SinkSTag: 7, Size: 4097, SourceSTag: uint32(e.rw.STag()), SourceTO: coreBase}
		}), want: wire.ErrRDMAPBaseBounds, echo: true, readRq: true},
		{name: "read without the right", ird: 4, stream: rd(func(e *coreEnv) wire.ReadRequest {
			return wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: uint32(e.wo.STag()), SourceTO: coreBase}
		}), want: wire.ErrRDMAPAccessRights, echo: true, readRq: true},
		{name: "read from another PD", ird: 4, stream: rd(func(e *coreEnv) wire.ReadRequest {
			return wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: uint32(e.other.STag()), SourceTO: coreBase}
		}), want: wire.ErrRDMAPSTagNotAssoc, echo: true, readRq: true},
		{name: "read beyond IRD", ird: 1, stream: func(e *coreEnv) []byte {
			// The first Read's 128 KiB answer goes to the transmit
			// goroutine (none here), so the second finds the IRQ full.
			rr := wire.ReadRequest{SinkSTag: 7, Size: 128 << 10, SourceSTag: uint32(e.big.STag()), SourceTO: coreBase}
			return append(e.readReq(1, rr), e.readReq(2, rr)...)
		}, want: wire.ErrRDMAPStream, echo: true},
		{name: "read with wrong MSN", ird: 4, stream: func(e *coreEnv) []byte {
			return e.readReq(2, wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: uint32(e.rw.STag()), SourceTO: coreBase})
		}, want: wire.ErrDDPInvalidMSN, echo: true},
		{name: "send without a receive", stream: func(e *coreEnv) []byte { return e.send(wire.OpSend, 1, 0, true, make([]byte, 16)) },
			want: wire.ErrDDPNoBuffer, echo: true},
		{name: "send longer than the receive", setup: func(t testing.TB, e *coreEnv) { e.recv(t, 100, 8) },
			stream: func(e *coreEnv) []byte { return e.send(wire.OpSend, 1, 0, true, make([]byte, 16)) },
			want:   wire.ErrDDPNoBuffer, echo: true, status: LocalLengthError},
		{name: "send segment past the receive", setup: func(t testing.TB, e *coreEnv) { e.recv(t, 100, 40) },
			stream: func(e *coreEnv) []byte {
				return append(e.send(wire.OpSend, 1, 0, false, make([]byte, 32)), e.send(wire.OpSend, 1, 32, true, make([]byte, 16))...)
			}, want: wire.ErrDDPNoBuffer, echo: true, status: LocalLengthError},
		{name: "send with wrong MSN", setup: recv64, stream: func(e *coreEnv) []byte { return e.send(wire.OpSend, 5, 0, true, make([]byte, 4)) },
			want: wire.ErrDDPInvalidMSN, echo: true},
		{name: "send segment with another MSN", setup: recv64, stream: func(e *coreEnv) []byte {
			return append(e.send(wire.OpSend, 1, 0, false, make([]byte, 4)), e.send(wire.OpSend, 2, 4, true, make([]byte, 4))...)
		}, want: wire.ErrDDPInvalidMSN, echo: true},
		{name: "send starting at MO 4", setup: recv64, stream: func(e *coreEnv) []byte { return e.send(wire.OpSend, 1, 4, true, make([]byte, 4)) },
			want: wire.ErrDDPInvalidMO, echo: true},
		{name: "send segment at a gap", setup: recv64, stream: func(e *coreEnv) []byte {
			return append(e.send(wire.OpSend, 1, 0, false, make([]byte, 4)), e.send(wire.OpSend, 1, 8, true, make([]byte, 4))...)
		}, want: wire.ErrDDPInvalidMO, echo: true},
		{name: "send on the Read queue", setup: recv64, stream: raw(wire.OpSend, func(h *wire.Header) { h.MSN, h.QN = 1, 1 }, make([]byte, 4)),
			want: wire.ErrDDPInvalidQN, echo: true},
		{name: "send with invalidate of a foreign STag", setup: recv64, stream: raw(wire.OpSendInv, func(h *wire.Header) { h.MSN, h.RsvdULP = 1, 0x00ffff00 }, nil),
			want: wire.ErrRDMAPCannotInvalidate, echo: true},
		{name: "unknown opcode", stream: raw(wire.OpSend, func(h *wire.Header) { h.Opcode = 0xc }, nil), want: wire.ErrRDMAPOpcode},
		// RFC 7306's opcodes, whole and well formed, from a peer that did
		// not negotiate them: refused as unexpected, before any effect.
		{name: "Immediate Data not negotiated", setup: recv64, stream: raw(wire.OpImmediate, func(h *wire.Header) { h.MSN = 1 },
			wire.AppendImmediate(nil, 7)), want: wire.ErrRDMAPOpcode},
		{name: "Immediate Data with SE not negotiated", setup: recv64, stream: raw(wire.OpImmediateSE, func(h *wire.Header) { h.MSN = 1 },
			wire.AppendImmediate(nil, 7)), want: wire.ErrRDMAPOpcode},
		{name: "Atomic Request not negotiated", ird: 4, stream: func(e *coreEnv) []byte {
			h := chdr(wire.OpAtomicRequest)
			h.MSN = 1
			return e.fpdu(h, (&wire.AtomicRequest{Op: wire.AtomicFetchAdd, ReqID: 1, RemoteSTag: uint32(e.rw.STag()), RemoteTO: coreBase, AddSwap: 1}).Append(nil), nil)
		}, want: wire.ErrRDMAPOpcode},
		{name: "Immediate Data without a receive", ext: true, stream: func(e *coreEnv) []byte { return e.imm(wire.OpImmediate, 1, 0, true, 1, nil) },
			want: wire.ErrDDPNoBuffer, echo: true},
		{name: "Immediate Data longer than the receive", ext: true, setup: func(t testing.TB, e *coreEnv) { e.recv(t, 100, 8) },
			stream: func(e *coreEnv) []byte { return e.imm(wire.OpImmediate, 1, 0, true, 1, make([]byte, 16)) },
			want:   wire.ErrDDPNoBuffer, echo: true, status: LocalLengthError},
		{name: "Immediate Data with wrong MSN", ext: true, setup: recv64, stream: func(e *coreEnv) []byte { return e.imm(wire.OpImmediate, 2, 0, true, 1, nil) },
			want: wire.ErrDDPInvalidMSN, echo: true},
		{name: "Immediate Data shorter than its body", ext: true, setup: recv64, stream: raw(wire.OpImmediate, func(h *wire.Header) { h.MSN = 1 }, make([]byte, 7)),
			want: wire.ErrDDPCatastrophic},
		{name: "Immediate Data on the Read queue", ext: true, setup: recv64, stream: raw(wire.OpImmediate, func(h *wire.Header) { h.MSN, h.QN = 1, 1 }, make([]byte, 8)),
			want: wire.ErrDDPInvalidQN, echo: true},
		{name: "atomic to an unaligned address", ext: true, ird: 4, stream: func(e *coreEnv) []byte {
			return e.atomic(1, wire.AtomicRequest{Op: wire.AtomicFetchAdd, ReqID: 1, RemoteSTag: uint32(e.at.STag()), RemoteTO: coreBase + 4, AddSwap: 1})
		}, want: wire.ErrRDMAPBaseBounds, echo: true},
		{name: "atomic to unknown STag", ext: true, ird: 4, stream: func(e *coreEnv) []byte {
			return e.atomic(1, wire.AtomicRequest{Op: wire.AtomicFetchAdd, ReqID: 1, RemoteSTag: 0x00ffff00, RemoteTO: coreBase, AddSwap: 1})
		}, want: wire.ErrRDMAPInvalidSTag, echo: true},
		{name: "atomic without the right", ext: true, ird: 4, stream: func(e *coreEnv) []byte {
			return e.atomic(1, wire.AtomicRequest{Op: wire.AtomicCmpSwap, ReqID: 1, RemoteSTag: uint32(e.rw.STag()), RemoteTO: coreBase, AddSwap: 1})
		}, want: wire.ErrRDMAPAccessRights, echo: true},
		{name: "atomic past the region", ext: true, ird: 4, stream: func(e *coreEnv) []byte {
			return e.atomic(1, wire.AtomicRequest{Op: wire.AtomicFetchAdd, ReqID: 1, RemoteSTag: uint32(e.at.STag()), RemoteTO: coreBase + 4092, AddSwap: 1})
		}, want: wire.ErrRDMAPBaseBounds, echo: true},
		{name: "atomic with an unknown operation", ext: true, ird: 4, stream: func(e *coreEnv) []byte {
			return e.atomic(1, wire.AtomicRequest{Op: 7, ReqID: 1, RemoteSTag: uint32(e.at.STag()), RemoteTO: coreBase})
		}, want: wire.ErrRDMAPOpcode},
		{name: "atomic beyond IRD", ext: true, stream: func(e *coreEnv) []byte {
			return e.atomic(1, wire.AtomicRequest{Op: wire.AtomicFetchAdd, ReqID: 1, RemoteSTag: uint32(e.at.STag()), RemoteTO: coreBase})
		}, want: wire.ErrRDMAPStream, echo: true},
		{name: "atomic with wrong MSN", ext: true, ird: 4, stream: func(e *coreEnv) []byte {
			return e.atomic(2, wire.AtomicRequest{Op: wire.AtomicFetchAdd, ReqID: 1, RemoteSTag: uint32(e.at.STag()), RemoteTO: coreBase})
		}, want: wire.ErrDDPInvalidMSN, echo: true},
		{name: "Atomic Response with none outstanding", ext: true, stream: raw(wire.OpAtomicResponse, func(h *wire.Header) { h.MSN = 1 },
			(&wire.AtomicResponse{ReqID: 1, Original: 5}).Append(nil)), want: wire.ErrRDMAPOpcode},
		{name: "Read Response where an Atomic Response is due", ext: true, setup: func(t testing.TB, e *coreEnv) {
			wr := SendWR{ID: 20, Op: OpFetchAdd, Flags: Signaled, RKey: 0x77, RemoteAddr: 0x5000, SGL: []SGE{{MR: e.local, Length: 8}}}
			if err := e.q.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
		}, stream: func(e *coreEnv) []byte { return e.response(0, true, junk) }, want: wire.ErrRDMAPOpcode},
		{name: "Atomic Response not negotiated", stream: raw(wire.OpAtomicResponse, func(h *wire.Header) { h.MSN = 1 },
			(&wire.AtomicResponse{ReqID: 1, Original: 5}).Append(nil)), want: wire.ErrRDMAPOpcode},
		{name: "tagged Send", stream: raw(wire.OpWrite, func(h *wire.Header) { h.Opcode = wire.OpSend }, nil), want: wire.ErrRDMAPOpcode},
		{name: "RDMAP version 2", stream: raw(wire.OpWrite, func(h *wire.Header) { h.RDMAPVersion = 2 }, nil), want: wire.ErrRDMAPVersion},
		{name: "DDP version 0 tagged", stream: raw(wire.OpWrite, func(h *wire.Header) { h.DDPVersion = 0 }, nil), want: wire.ErrDDPTaggedVersion},
		{name: "DDP version 3 untagged", stream: raw(wire.OpSend, func(h *wire.Header) { h.DDPVersion = 3 }, nil), want: wire.ErrDDPUntaggedVersion},
		{name: "ULPDU shorter than its header", stream: func(e *coreEnv) []byte {
			b, _ := wire.AppendFPDU(nil, []byte{0xc1, 0x40, 0, 0, 0, 1}, e.crc)
			return b
		}, want: wire.ErrDDPCatastrophic},
		{name: "Read Request shorter than its body", ird: 4, stream: raw(wire.OpReadRequest, func(h *wire.Header) { h.MSN = 1 }, make([]byte, 10)),
			want: wire.ErrDDPCatastrophic},
		{name: "Read Request with a payload", ird: 4, stream: func(e *coreEnv) []byte {
			rr := wire.ReadRequest{SinkSTag: 7, Size: 8, SourceSTag: uint32(e.rw.STag()), SourceTO: coreBase}
			h := chdr(wire.OpReadRequest)
			h.MSN = 1
			return e.fpdu(h, rr.Append(nil), make([]byte, 3000))
		}, want: wire.ErrDDPTooLong, echo: true},
		{name: "Terminate too long", stream: raw(wire.OpTerminate, func(h *wire.Header) { h.MSN = 1 }, make([]byte, 2000)),
			want: wire.ErrDDPCatastrophic},
		{name: "malformed Terminate", stream: raw(wire.OpTerminate, func(h *wire.Header) { h.MSN = 1 }, []byte{1}),
			want: wire.ErrDDPCatastrophic},
		{name: "Read Response with no Read", stream: func(e *coreEnv) []byte { return e.response(0, true, junk) },
			want: wire.ErrRDMAPOpcode},
		{name: "Read Response to the wrong STag", setup: func(t testing.TB, e *coreEnv) { e.read(t, 10, 0, 8) },
			stream: func(e *coreEnv) []byte {
				h := chdr(wire.OpReadResponse)
				h.STag, h.TO = uint32(e.rw.STag()), coreBase
				return e.fpdu(h, nil, junk)
			}, want: wire.ErrDDPInvalidSTag, echo: true},
		{name: "Read Response at the wrong TO", setup: func(t testing.TB, e *coreEnv) { e.read(t, 10, 0, 8) },
			stream: func(e *coreEnv) []byte { return e.response(4, true, junk[:4]) }, want: wire.ErrDDPBaseBounds, echo: true},
		{name: "Read Response too long", setup: func(t testing.TB, e *coreEnv) { e.read(t, 10, 0, 8) },
			stream: func(e *coreEnv) []byte { return e.response(0, true, make([]byte, 12)) }, want: wire.ErrDDPBaseBounds, echo: true},
		{name: "Read Response ending early", setup: func(t testing.TB, e *coreEnv) { e.read(t, 10, 0, 8) },
			stream: func(e *coreEnv) []byte { return e.response(0, true, junk[:4]) }, want: wire.ErrDDPBaseBounds, echo: true},
		{name: "bad CRC", crc: []bool{true}, stream: func(e *coreEnv) []byte {
			b := e.write(e.rw.STag(), coreBase, []byte{1, 2, 3, 4})
			b[len(b)-1] ^= 0xff
			return b
		}, want: wire.ErrMPACRC},
		{name: "bad CRC in a Send", crc: []bool{true}, setup: recv64, stream: func(e *coreEnv) []byte {
			// Staged whole, it is checked before it completes.
			b := e.send(wire.OpSend, 1, 0, true, []byte{1, 2, 3, 4, 5, 6, 7, 8})
			b[len(b)-1] ^= 0xff
			return b
		}, want: wire.ErrMPACRC, status: WRFlushError},
		{name: "bad CRC in a large Write", crc: []bool{true}, stream: func(e *coreEnv) []byte {
			b := e.write(e.rw.STag(), coreBase, pattern(2100, 7))
			b[1000] ^= 0x10
			return b
		}, want: wire.ErrMPACRC},
		{name: "zero CRC when CRC was negotiated", crc: []bool{true}, stream: func(e *coreEnv) []byte {
			e.crc = false
			defer func() { e.crc = true }()
			return e.write(e.rw.STag(), coreBase, []byte{1, 2, 3, 4})
		}, want: wire.ErrMPACRC},
		{name: "bad CRC in a Terminate", crc: []bool{true}, stream: func(e *coreEnv) []byte {
			term := wire.NewTerminate(wire.ErrRDMAPAccessRights, nil, 0, nil)
			h := chdr(wire.OpTerminate)
			h.MSN = 1
			b := e.fpdu(h, term.Append(nil), nil)
			b[len(b)-1] ^= 1
			return b
		}, want: wire.ErrMPACRC},
	}
	// Every hostile input also after good traffic, which must stay placed.
	n := len(cases)
	for i := range n {
		c := cases[i]
		c.name += " after a Write"
		c.stream = lead(c.stream)
		check := c.check
		c.check = func(t testing.TB, e *coreEnv, x *coreEffects) {
			wantMem(t, e.rw, 3000, pattern(40, 9))
			if check != nil {
				check(t, e, x)
			}
		}
		cases = append(cases, c)
	}
	return cases
}

// cutEverywhere cuts a stream in two at each byte boundary in turn; then
// into single bytes; then at random.
func cutPlans(n int, rng *rand.Rand) []func(int) []int {
	var plans []func(int) []int
	for i := 1; i < n; i++ {
		plans = append(plans, func(int) []int { return []int{i} })
	}
	plans = append(plans, func(n int) []int {
		c := make([]int, 0, n)
		for i := 1; i < n; i++ {
			c = append(c, i)
		}
		return c
	})
	for range 20 {
		seed := rng.Uint64()
		plans = append(plans, func(n int) []int { return randomCuts(n, rand.New(rand.NewPCG(seed, 0))) })
	}
	return plans
}

func randomCuts(n int, rng *rand.Rand) []int {
	var c []int
	for at := 0; ; {
		at += 1 + rng.IntN(max(1, min(n/3+1, 700)))
		if at >= n {
			return c
		}
		c = append(c, at)
	}
}

// TestCoreTables feeds every case to the receive core whole and cut at
// every byte boundary, byte by byte and at random, with CRC off and on,
// and checks that it does what the case says, the same every time.
func TestCoreTables(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	cases := append(validCoreCases(), hostileCoreCases()...)
	for i := range cases {
		c := &cases[i]
		crcs := c.crc
		if crcs == nil {
			crcs = []bool{false, true}
		}
		for _, crc := range crcs {
			t.Run(fmt.Sprintf("%s/crc=%v", c.name, crc), func(t *testing.T) {
				e := newCoreEnv(t)
				whole, in := e.run(t, c, crc, func(int) []int { return nil })
				if c.check != nil {
					c.check(t, e, whole)
				}
				if c.want != nil {
					checkTerminate(t, c, whole, crc, in)
				} else if whole.err != "" && !c.peerTerm {
					t.Fatalf("valid traffic failed: %s", whole.err)
				}
				if t.Failed() {
					return
				}
				plans := cutPlans(len(in), rng)
				if testing.Short() || raceEnabled && len(in) > 256 {
					// Byte by byte and at random only: the exhaustive
					// cuts of long streams run without -short and -race.
					plans = plans[len(plans)-21:]
				}
				for _, cuts := range plans {
					x, _ := e.run(t, c, crc, cuts)
					if d := whole.diff(x); d != "" {
						t.Fatalf("fed whole and cut at %v: %s", cuts(len(in)), d)
					}
				}
				// Again with the small staging buffer taken after every
				// wait (rxMini): whole, byte by byte and at random.
				e.miniIdle = true
				defer func() { e.miniIdle = false }()
				for _, cuts := range append(plans[len(plans)-21:], func(int) []int { return nil }) {
					x, _ := e.run(t, c, crc, cuts)
					if d := whole.diff(x); d != "" {
						t.Fatalf("fed with the small buffer, cut at %v: %s", cuts(len(in)), d)
					}
				}
			})
		}
	}
}

// checkTerminate checks the Terminate a hostile case brought: its
// reason, the header it echoes, and the status of receive 100.
func checkTerminate(t testing.TB, c *coreCase, x *coreEffects, crc bool, in []byte) {
	t.Helper()
	term, ok := x.terminate(crc)
	if !ok {
		t.Fatalf("no Terminate written (error %q, wrote %x)", x.err, x.out)
	}
	if !errors.Is(&term.Err, c.want) {
		t.Fatalf("Terminate reports %v, want %v", &term.Err, c.want)
	}
	h, ok := term.DDPHeader()
	if ok != c.echo {
		t.Errorf("echoed DDP header present %v, want %v (%+v)", ok, c.echo, h)
	}
	if ok {
		// The echo is the header of the FPDU at fault: the stream's last.
		var last wire.Header
		for b := in; len(b) > 0; {
			f, n, err := wire.ParseFPDU(b, false)
			if err != nil {
				t.Fatal(err)
			}
			b = b[n:]
			last, _, _ = wire.ParseHeader(f.ULPDU)
		}
		if h != last {
			t.Errorf("echoed header %+v, want the faulty FPDU's %+v", h, last)
		}
	}
	if _, ok := term.ReadRequest(); ok != c.readRq {
		t.Errorf("echoed Read Request present %v, want %v", ok, c.readRq)
	}
	var recv *Completion
	for i := range x.comps {
		if x.comps[i].ID == 100 {
			recv = &x.comps[i]
		}
	}
	want := WRFlushError
	if c.status != Success {
		want = c.status
	}
	switch {
	case recv == nil && c.status != Success:
		t.Errorf("receive 100 did not complete, want status %v", want)
	case recv != nil && recv.Status != want:
		t.Errorf("receive completed %+v, want status %v", *recv, want)
	}
}

// TestCoreDeregisterMidWrite: the FPDUs of one Write look the STag up
// once, but each takes its own hold and is judged again. A Deregister
// between two FPDUs holds nothing up, and the next FPDU is refused with
// nothing of it placed.
func TestCoreDeregisterMidWrite(t *testing.T) {
	e := newCoreEnv(t)
	e.reset(t, false, 4)
	dst, err := e.table.Register(1, [][]byte{make([]byte, 4096)}, mem.RemoteWrite, mem.Options{Addr: coreBase})
	if err != nil {
		t.Fatal(err)
	}
	first := e.writeSeg(dst.STag(), coreBase, false, pattern(1000, 1))
	second := e.writeSeg(dst.STag(), coreBase+1000, true, pattern(1000, 2))
	r := &e.q.rx
	if err := feedCore(t, r, first, nil); err != nil {
		t.Fatal(err)
	}
	if dst.InUse() {
		t.Fatal("the region is held between two FPDUs")
	}
	if err := dst.Deregister(); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	err = feedCore(t, r, second, nil)
	var f *fault
	if !errors.As(err, &f) || f.term != wire.ErrDDPInvalidSTag {
		t.Fatalf("the core said %v, want %v", err, wire.ErrDDPInvalidSTag)
	}
	if dst.Placed() != 1000 {
		t.Errorf("placed %d bytes, want 1000", dst.Placed())
	}
	if !bytes.Equal(dst.Bytes()[1000:2000], make([]byte, 1000)) {
		t.Error("the FPDU after Deregister was placed")
	}
}

// TestCoreReleaseMidPayload: a queue pair that fails while a payload is
// half placed ends the placement's holds, and its core takes no more bytes
// (it must not place into memory it no longer holds).
func TestCoreReleaseMidPayload(t *testing.T) {
	e := newCoreEnv(t)
	e.reset(t, false, 4)
	in := e.write(e.rw.STag(), coreBase, pattern(3000, 1))
	r := &e.q.rx
	if err := feedCore(t, r, in[:1500], nil); err != nil {
		t.Fatal(err)
	}
	if !e.rw.InUse() {
		t.Fatal("a placement under way holds no region")
	}
	e.q.fail(ErrClosed)
	r.release()
	if e.rw.InUse() {
		t.Error("the region is still held")
	}
	if err := feedCore(t, r, in[1500:], nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("after release the core said %v, want net.ErrClosed", err)
	}
	if e.rw.Placed() != 0 {
		t.Errorf("placed %d bytes", e.rw.Placed())
	}
	// Placed counts whole FPDUs only: look at the memory the rest of the
	// payload would have reached.
	if !bytes.Equal(e.rw.Bytes()[1500:3000], e.fill[1500:3000]) {
		t.Error("bytes fed after the release were placed")
	}
}

// TestCoreSendCases: a Send into a file's mapping (placed guarded: a file
// cut short under it is a fault, not a SIGBUS), into a region of a frozen
// table (no write hold granted: nothing placed), and completing into a
// full CQ (the receive is consumed, the overrun reported).
func TestCoreSendCases(t *testing.T) {
	payload := pattern(8, 7)
	t.Run("file", func(t *testing.T) {
		e := newCoreEnv(t)
		f, file := e.fileRegion(t)
		e.reset(t, false, 4)
		if err := e.q.PostRecv(&RecvWR{ID: 9, SGL: []SGE{{MR: file, Offset: 100, Length: 64}}}); err != nil {
			t.Fatal(err)
		}
		if err := feedCore(t, &e.q.rx, e.send(wire.OpSend, 1, 0, true, payload), nil); err != nil {
			t.Fatal(err)
		}
		var wc [2]Completion
		if n := e.cq.Poll(wc[:]); n != 1 || wc[0].ID != 9 || wc[0].Status != Success || wc[0].Bytes != 8 {
			t.Fatalf("completions %+v", wc[:n])
		}
		wantMem(t, file, 100, payload)
		if e.q.rx.guard || file.InUse() {
			t.Error("the file's region is still held")
		}
		// The file cut short under its mapping: placed unguarded, the
		// next Send would kill the process (SIGBUS).
		if err := e.q.PostRecv(&RecvWR{ID: 10, SGL: []SGE{{MR: file, Offset: 100, Length: 64}}}); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(0); err != nil {
			t.Fatal(err)
		}
		err := feedCore(t, &e.q.rx, e.send(wire.OpSend, 2, 0, true, payload), nil)
		if err == nil {
			t.Fatal("a Send into a truncated file's mapping was taken")
		}
		t.Logf("into the truncated file: %v", err)
		e.q.Close()
		if err := file.Deregister(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("frozen", func(t *testing.T) {
		e := newCoreEnv(t)
		e.reset(t, false, 4)
		e.recv(t, 9, 64)
		if err := e.table.Freeze(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer e.table.Thaw()
		err := feedCore(t, &e.q.rx, e.send(wire.OpSend, 1, 0, true, payload), nil)
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("a Send into a frozen table: %v", err)
		}
		var wc [2]Completion
		if n := e.cq.Poll(wc[:]); n != 0 {
			t.Fatalf("completions %+v", wc[:n])
		}
		wantMem(t, e.local, 0, e.fill[:8]) // nothing placed
	})
	t.Run("overrun", func(t *testing.T) {
		e := newCoreEnv(t)
		e.reset(t, false, 4)
		e.recv(t, 9, 64)
		for e.cq.push(&Completion{ID: 1}, false) {
		}
		if err := feedCore(t, &e.q.rx, e.send(wire.OpSend, 1, 0, true, payload), nil); err != nil {
			t.Fatal(err)
		}
		if err := e.q.Err(); !errors.Is(err, ErrCQOverrun) {
			t.Fatalf("queue pair's error %v, want the overrun", err)
		}
		wantMem(t, e.local, 0, payload)
		if e.q.rqHead != e.q.rqTail {
			t.Error("the receive is still posted")
		}
	})
}
