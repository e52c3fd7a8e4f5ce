package engine

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// discardLink takes whatever it is given at once and keeps nothing.
type discardLink struct{ sinkLink }

func (l *discardLink) Writev(bufs [][]byte, _ []int, _ bool) (int, error) {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n, nil
}

// BenchmarkPostWrite8 and BenchmarkRecvWrite8 are the engine's own cost of
// an 8-byte Write, without the system calls: posting and framing it onto
// a link that takes it at once, and receiving and placing it in the core.
// Hot in cache they take about 160 and 90 ns here; in gowarp perf's
// write_lat the same code costs about 0.36 and 0.33 µs per message (CPU
// profile), and about as much with the process on one CPU (taskset), so
// it is not the two cores' caches; that the system calls between two
// messages evict what the engine touches is a guess, not measured. It is
// most of write_lat's margin over tcp_lat (issue 7).
func BenchmarkPostWrite8(b *testing.B) {
	e := newCoreEnv(b)
	e.reset(b, false, 4)
	l := &discardLink{sinkLink: *newSinkLink()}
	q, err := NewQP(Config{SendDepth: 16, RecvDepth: 16, SendCQ: e.cq, RecvCQ: e.cq, PD: 1, Table: e.table})
	if err != nil {
		b.Fatal(err)
	}
	q.mu.Lock()
	q.readyLocked(l, Params{IRD: 4, ORD: 4})
	q.mu.Unlock()
	wr := SendWR{Op: OpWrite, SGL: []SGE{{MR: e.local, Length: 8}}, RemoteAddr: coreBase, RKey: 0x1234}
	b.ReportAllocs()
	for b.Loop() {
		if err := q.PostSend(&wr); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRecvWrite8(b *testing.B) {
	e := newCoreEnv(b)
	dst, err := e.table.Register(1, [][]byte{make([]byte, 64)}, mem.RemoteWrite, mem.Options{Addr: coreBase})
	if err != nil {
		b.Fatal(err)
	}
	e.reset(b, false, 4)
	h := chdr(wire.OpWrite)
	h.STag, h.TO, h.Last = uint32(dst.STag()), coreBase, true
	in := e.fpdu(h, nil, make([]byte, 8))
	r := &e.q.rx
	b.ReportAllocs()
	for b.Loop() {
		feedOnce(b, r, in)
		for r.staged() {
			if err := r.advance(0); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkRecvSend8 is BenchmarkRecvWrite8 for a Send: the receive
// core takes an 8-byte Send into a posted receive and completes it, and
// the application polls the completion and posts the receive again, as
// send_lat's server does.
func BenchmarkRecvSend8(b *testing.B) {
	e := newCoreEnv(b)
	e.reset(b, false, 4)
	recv := RecvWR{ID: 1, SGL: []SGE{{MR: e.local, Length: 64}}}
	if err := e.q.PostRecv(&recv); err != nil {
		b.Fatal(err)
	}
	r := &e.q.rx
	var wc [4]Completion
	msn := uint32(1)
	h := chdr(wire.OpSend)
	h.MSN = 0x01020304
	in := e.fpdu(h, nil, make([]byte, 8))
	at := bytes.Index(in, []byte{1, 2, 3, 4}) // the MSN, set for each (CRC off)
	b.ReportAllocs()
	for b.Loop() {
		binary.BigEndian.PutUint32(in[at:], msn)
		msn++
		feedOnce(b, r, in)
		for e.cq.Poll(wc[:]) > 0 {
			if err := e.q.PostRecv(&recv); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// feedOnce hands in to the core as one read into the vectors it gives
// (in fits them).
func feedOnce(b *testing.B, r *rxState, in []byte) {
	k := 0
	for _, v := range r.next() {
		k += copy(v, in[k:])
		if k == len(in) {
			break
		}
	}
	if err := r.advance(k); err != nil {
		b.Fatal(err)
	}
}
