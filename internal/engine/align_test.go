package engine

import (
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// segLink is a link with a 1448-byte MSS that models how Linux TCP cuts
// what it is given into segments: a record (a sendmsg with MSG_EOR, and so
// every Writev's end) closes the segment being filled; within a record,
// segments fill up to the MSS and carry on across calls. It keeps the
// stream and where each segment starts.
type segLink struct {
	streamLink
	mu     sync.Mutex
	stream []byte
	starts []int // stream offsets where segments start
	fill   int   // bytes in the open segment
}

const segMSS = 1448

func (l *segLink) MSS() int { return segMSS }

func (l *segLink) Writev(bufs [][]byte, records []int, block bool) (int, error) {
	l.mu.Lock()
	r := 0
	for i, b := range bufs {
		for r < len(records) && records[r] <= i {
			l.fill = 0
			r++
		}
		for _, c := range b {
			if l.fill == 0 || l.fill == segMSS {
				l.starts = append(l.starts, len(l.stream))
				l.fill = 0
			}
			l.stream = append(l.stream, c)
			l.fill++
		}
	}
	l.fill = 0
	l.mu.Unlock()
	return l.streamLink.Writev(bufs, records, block)
}

// check reports FPDUs that straddle two segments or exceed the MSS.
func (l *segLink) check(t *testing.T, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	seg := 0 // index in starts of the segment holding offset off
	fpdus := 0
	for off := 0; off < len(l.stream); {
		_, n, err := wire.ParseFPDU(l.stream[off:], false)
		if err != nil {
			t.Fatalf("%s: FPDU at %d: %v", name, off, err)
		}
		for seg+1 < len(l.starts) && l.starts[seg+1] <= off {
			seg++
		}
		end := len(l.stream)
		if seg+1 < len(l.starts) {
			end = l.starts[seg+1]
		}
		if off+n > end {
			t.Errorf("%s: FPDU %d at %d (%d bytes) straddles the segment boundary at %d", name, fpdus, off, n, end)
		}
		if n > segMSS {
			t.Errorf("%s: FPDU %d of %d bytes, more than the %d-byte MSS", name, fpdus, n, segMSS)
		}
		off += n
		fpdus++
	}
	if fpdus < 20 {
		t.Errorf("%s: only %d FPDUs", name, fpdus)
	}
}

// TestFPDUsAlignToSegments: on a link with real segments, every FPDU lies
// within one TCP segment (RFC 5044 §4.4, and what siw does), whatever mix
// of Writes, Sends and Read Responses of several FPDUs and of small ones is
// queued. A peer then never sees a header split over two segments (siw 6.1
// miscounts such Sends; docs/interop.md §11). Messages of one FPDU between
// an eighth of a segment and a whole one are left to TCP to pack.
func TestFPDUsAlignToSegments(t *testing.T) {
	table := mem.NewTable()
	acq, bcq := NewCQ(1024), NewCQ(1024)
	a, err := NewQP(Config{SendDepth: 64, RecvDepth: 64, SendCQ: acq, RecvCQ: acq, PD: 1, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewQP(Config{SendDepth: 64, RecvDepth: 64, SendCQ: bcq, RecvCQ: bcq, PD: 1, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	ca, cb := net.Pipe()
	la, lb := &segLink{streamLink: streamLink{c: ca}}, &segLink{streamLink: streamLink{c: cb}}
	p := Params{IRD: 4, ORD: 4}
	if err := a.Start(la, p); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(lb, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	if got := a.FPDUSize(); got != segMSS {
		t.Fatalf("FPDU size %d, want the %d-byte MSS", got, segMSS)
	}
	const size = 20000
	reg := func(acc mem.Access) *mem.Region {
		m, err := table.Register(1, [][]byte{make([]byte, size)}, acc, mem.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	src, dst := reg(0), reg(mem.RemoteWrite|mem.RemoteRead|mem.LocalWrite)
	sizes := []int{10000, 64, 1448, 8, 3 * 1424, 100, 19999, 150, 1, 5000}
	for range 2 { // a Send of each size, and a 16-byte one after it
		for range sizes {
			if err := b.PostRecv(&RecvWR{SGL: []SGE{{MR: dst, Length: size}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var id uint64
	post := func(wr SendWR) {
		id++
		wr.ID = id
		if err := a.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range sizes {
		sgl := []SGE{{MR: src, Length: n}}
		post(SendWR{Op: OpWrite, SGL: sgl, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())})
		post(SendWR{Op: OpSend, SGL: sgl})
		post(SendWR{Op: OpRead, SGL: []SGE{{MR: dst, Length: n}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())})
		post(SendWR{Op: OpSend, SGL: []SGE{{MR: src, Length: 16}}})
	}
	post(SendWR{Op: OpRead, Flags: Signaled, SGL: []SGE{{MR: dst, Length: 8}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())})
	if c := next(t, acq); c.ID != id || c.Status != Success {
		t.Fatalf("last Read: %+v (%v)", c, a.Err())
	}
	la.check(t, "requester")
	lb.check(t, "responder (Read Responses)")
}

// TestRecordsAfterShortWrites: after the socket took part of a batch, the
// record ends handed to the link count from the first unwritten vector,
// and those already written are gone.
func TestRecordsAfterShortWrites(t *testing.T) {
	tx := txState{recs: []int{3, 5, 9}}
	for _, c := range []struct {
		first int
		want  []int
	}{{0, []int{3, 5, 9}}, {4, []int{1, 5}}, {5, []int{4}}, {9, []int{}}} {
		tx.first = c.first
		if got := tx.records(); !slices.Equal(got, c.want) {
			t.Errorf("first %d: records %v, want %v", c.first, got, c.want)
		}
	}
}
