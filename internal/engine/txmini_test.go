package engine

import (
	"bytes"
	"sync"
	"testing"

	"github.com/gowarp/gowarp/wire"
)

// vecLink records what each Writev was given: the bytes, and how many
// vectors held them.
type vecLink struct {
	sinkLink
	vmu  sync.Mutex
	vecs []int
}

func (l *vecLink) Writev(bufs [][]byte, recs []int, block bool) (int, error) {
	l.vmu.Lock()
	l.vecs = append(l.vecs, len(bufs))
	l.vmu.Unlock()
	return l.sinkLink.Writev(bufs, recs, block)
}

// miniQP is e's queue pair made ready again on a vecLink.
func miniQP(t *testing.T, e *coreEnv, crc bool) *vecLink {
	e.reset(t, crc, 4)
	l := &vecLink{sinkLink: *newSinkLink()}
	e.q.mu.Lock()
	e.q.readyLocked(l, Params{CRC: crc, IRD: 4, ORD: 4, MaxFPDU: 512})
	e.q.mu.Unlock()
	return l
}

// TestMiniBatch: a lone message of at most miniPayload bytes goes out as
// one buffer, its payload copied after its header (txMini), and its FPDU
// is the one a whole batch frames: same header, payload, pad and CRC.
// Larger ones, and a file's mapping, keep their vectors into the region.
func TestMiniBatch(t *testing.T) {
	e := newCoreEnv(t)
	_, file := e.fileRegion(t)
	copy(file.Bytes(), pattern(4096, 9))
	cases := []struct {
		name string
		op   WROp
		sges []int // lengths, at offsets 7, 307, 607… of the region
		file bool
		one  bool // goes out as one buffer
	}{
		{"write 8", OpWrite, []int{8}, false, true},
		{"write 0", OpWrite, []int{0}, false, true},
		{"write 1", OpWrite, []int{1}, false, true},
		{"write max", OpWrite, []int{miniPayload}, false, true},
		{"write max+1", OpWrite, []int{miniPayload + 1}, false, false},
		{"write 3 sges", OpWrite, []int{5, 0, 100}, false, true},
		{"write 8 sges", OpWrite, []int{1, 2, 3, 4, 5, 6, 7, 8}, false, true},
		{"write file", OpWrite, []int{8}, true, false},
		{"send 8", OpSend, []int{8}, false, true},
		{"send 0", OpSend, nil, false, true},
		{"send max in 2", OpSend, []int{90, miniPayload - 90}, false, true},
		{"send max+1 in 2", OpSend, []int{90, miniPayload - 89}, false, false},
		{"send 300", OpSend, []int{300}, false, false},
	}
	for _, crc := range []bool{false, true} {
		for _, c := range cases {
			l := miniQP(t, e, crc)
			src := e.local
			if c.file {
				src = file
			}
			var sgl []SGE
			var want []byte
			for i, n := range c.sges {
				sgl = append(sgl, SGE{MR: src, Offset: 7 + 300*i, Length: n})
				want = append(want, src.Bytes()[7+300*i:7+300*i+n]...)
			}
			for k := range 2 { // the second after the first's batch went
				wr := SendWR{ID: uint64(k), Op: c.op, SGL: sgl, RKey: 0x1234, RemoteAddr: 0x9000}
				if err := e.q.PostSend(&wr); err != nil {
					t.Fatal(err)
				}
			}
			x := &coreEffects{out: l.written()}
			hs, ps := x.outFPDUs(t, crc)
			if len(hs) != 2 {
				t.Fatalf("%s crc %v: %d FPDUs, want 2", c.name, crc, len(hs))
			}
			for i, h := range hs {
				if wantOp := map[WROp]wire.Opcode{OpWrite: wire.OpWrite, OpSend: wire.OpSend}[c.op]; h.Opcode != wantOp || !h.Last || !bytes.Equal(ps[i], want) {
					t.Errorf("%s crc %v: FPDU %d %+v payload %x, want %v with %x", c.name, crc, i, h, ps[i], c.op, want)
				}
				if c.op == OpWrite && (h.STag != 0x1234 || h.TO != 0x9000) {
					t.Errorf("%s: STag %#x TO %#x", c.name, h.STag, h.TO)
				}
				if c.op == OpSend && h.MSN != uint32(i+1) {
					t.Errorf("%s: MSN %d, want %d", c.name, h.MSN, i+1)
				}
			}
			l.vmu.Lock()
			vecs := l.vecs
			l.vmu.Unlock()
			for _, v := range vecs {
				if one := v == 1; one != c.one {
					t.Errorf("%s crc %v: written in %v vectors, want one buffer %v", c.name, crc, vecs, c.one)
					break
				}
			}
			if e.q.tx.inMini || e.q.tx.bufs != nil || len(e.q.tx.holds) != 0 {
				t.Errorf("%s: the batch's arrays or holds are kept after it went", c.name)
			}
		}
	}
}
