package gowarp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// A pattern write fills its range with one 4-byte word naming it: the top
// bit set and its sequence number, so that every word of a region says
// which write put it there (0: none). FPDUs are cut at 4-byte multiples of
// 4-aligned ranges, so a word is never split between two.
type patWrite struct{ off, n, seq int }

func patWord(seq int) uint32 { return 1<<31 | uint32(seq) }

// patWrites makes n writes into an area of the given size: most fit one
// FPDU (up to 1000 bytes), some span several pages; all are 4-aligned
// and many straddle a page boundary.
func patWrites(rng *rand.Rand, n, area int) []patWrite {
	ws := make([]patWrite, n)
	for i := range ws {
		size := 4 * (1 + rng.IntN(250))
		if rng.IntN(8) == 0 {
			size = 4 * (1 + rng.IntN(3*gowarp.PageSize/4))
		}
		ws[i] = patWrite{off: 4 * rng.IntN((area-size)/4+1), n: size, seq: i + 1}
	}
	return ws
}

// patModel is one writer's area after its first applied writes.
type patModel struct {
	ws      []patWrite
	words   []uint32
	applied int
}

// checkPattern checks one writer's area of a snapshot: its writes are in
// it as a prefix of their sequence, the last one by a prefix of its words
// (whole if it fits one FPDU, which oneFPDU says), every earlier one as
// later ones left it. The model only moves forward: check snapshots in
// the order they were taken.
func (m *patModel) check(t *testing.T, name string, area []byte, oneFPDU func(patWrite) bool) (hi int) {
	t.Helper()
	for i := range m.words {
		if w := binary.LittleEndian.Uint32(area[4*i:]); w != 0 {
			if w>>31 == 0 || int(w&^(1<<31)) > len(m.ws) {
				t.Fatalf("%s: word %d is %#x, no write's", name, i, w)
			}
			hi = max(hi, int(w&^(1<<31)))
		}
	}
	if max(hi-1, 0) < m.applied {
		t.Fatalf("%s: a snapshot has writes up to %d, an earlier one had %d", name, hi, m.applied+1)
	}
	for _, w := range m.ws[m.applied:max(hi-1, 0)] {
		for i := w.off / 4; i < (w.off+w.n)/4; i++ {
			m.words[i] = patWord(w.seq)
		}
	}
	m.applied = max(hi-1, 0)
	lo, end := 0, 0 // the last write's words in the snapshot
	if hi > 0 {
		w := m.ws[hi-1]
		lo, end = w.off/4, w.off/4
		for end < (w.off+w.n)/4 && binary.LittleEndian.Uint32(area[4*end:]) == patWord(hi) {
			end++
		}
		if got := 4*end - w.off; got != w.n && oneFPDU(w) {
			t.Fatalf("%s: write %d (%d bytes at %d) is in by %d bytes: torn", name, hi, w.n, w.off, got)
		}
	}
	for i, want := range m.words {
		if i >= lo && i < end {
			want = patWord(hi)
		}
		if got := binary.LittleEndian.Uint32(area[4*i:]); got != want {
			t.Fatalf("%s: word %d (page %d) is %#x, want %#x: not the writes up to %d in order",
				name, i, 4*i/gowarp.PageSize, got, want, hi)
		}
	}
	return hi
}

// TestSnapshotUnderRemoteWrites: snapshots taken while two queue pairs
// RDMA Write patterns into two areas of one region and a local writer
// WriteAts a third. In every snapshot each area holds its writer's writes
// up to some point in its order, each write that fits one FPDU whole and
// the one at the cut by its first words; the region ends with every write.
func TestSnapshotUnderRemoteWrites(t *testing.T) {
	const area = 16 * gowarp.PageSize
	nw := 5000
	if testing.Short() {
		nw = 1000
	}
	p := newPair(t, gowarp.ConnectOptions{})
	dst, dbuf := p.reg(t, 3*area, gowarp.RemoteWrite)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	seed := rng.Uint64()
	t.Logf("seed %d", seed)
	rng = rand.New(rand.NewPCG(seed, 2))
	writes := [3][]patWrite{patWrites(rng, nw, area), patWrites(rng, nw, area), patWrites(rng, nw, area)}
	// Every write that fits one FPDU: up to 1000 bytes on any link.
	oneFPDU := func(w patWrite) bool { return w.n <= 1000 }

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for k, qp := range []*gowarp.QP{p.a, p.b} {
		cq := []*gowarp.CQ{p.acq, p.bcq}[k]
		ws := writes[k]
		// The sources, each write's at its own place, never reused.
		total := 0
		for _, w := range ws {
			total += w.n
		}
		src, sbuf := p.reg(t, total, 0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- writePatterns(ctx, qp, cq, src, sbuf, dst, k*area, ws)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		var b []byte
		for _, w := range writes[2] {
			b = fillWords(b[:0], w)
			if _, err := dst.WriteAt(b, int64(2*area+w.off)); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	var models [3]patModel
	for k := range models {
		models[k] = patModel{ws: writes[k], words: make([]uint32, area/4)}
	}
	nsnap, mid := 0, 0 // snapshots, and those taken in the middle of a writer's sequence
	check := func(s *gowarp.Snapshot) {
		b, err := s.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		m := false
		for k := range 3 {
			hi := models[k].check(t, []string{"Writes of a", "Writes of b", "WriteAt"}[k], b[k*area:(k+1)*area],
				func(w patWrite) bool { return k == 2 || oneFPDU(w) })
			m = m || hi > 0 && hi < nw
		}
		if m {
			mid++
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		nsnap++
	}
	var open []*gowarp.Snapshot // a few stay open at once, sharing pages
loop:
	for {
		select {
		case <-done:
			break loop
		default:
		}
		s, err := dst.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, s)
		if len(open) == 3 {
			check(open[0])
			open = open[1:]
		}
	}
	for _, s := range open {
		check(s)
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Completions say the socket took the Writes: wait for their placement.
	placed := 0
	for _, ws := range writes[:2] {
		for _, w := range ws {
			placed += w.n
		}
	}
	if err := dst.WaitPlaced(ctx, uint64(placed)); err != nil {
		t.Fatal(err)
	}
	for k := range 3 {
		b := dbuf[k*area : (k+1)*area]
		models[k].check(t, "the region", b, func(patWrite) bool { return true })
		// Every write is in: the region is the whole sequence's result.
		last := writes[k][len(writes[k])-1]
		if binary.LittleEndian.Uint32(b[last.off:]) != patWord(last.seq) {
			t.Fatalf("area %d: the last write is missing", k)
		}
	}
	if mid == 0 {
		t.Fatalf("none of %d snapshots was taken while writes went on", nsnap)
	}
	t.Logf("%d snapshots checked, %d taken while writes went on", nsnap, mid)
	if err := dst.Deregister(); err != nil {
		t.Fatalf("Deregister after every snapshot closed: %v", err)
	}
}

func fillWords(b []byte, w patWrite) []byte {
	for range w.n / 4 {
		b = binary.LittleEndian.AppendUint32(b, patWord(w.seq))
	}
	return b
}

// writePatterns posts ws as RDMA Writes into dst at base, in order, each
// from its own place in src.
func writePatterns(ctx context.Context, qp *gowarp.QP, cq *gowarp.CQ, src *gowarp.MR, sbuf []byte, dst *gowarp.MR, base int, ws []patWrite) error {
	off, out := 0, 0
	var wc [16]gowarp.Completion
	reap := func(block bool) error {
		if block {
			if err := cq.Wait(ctx); err != nil {
				return err
			}
		}
		n := cq.Poll(wc[:])
		for _, c := range wc[:n] {
			if err := c.Err(); err != nil {
				return err
			}
		}
		out -= n
		return nil
	}
	for _, w := range ws {
		fillWords(sbuf[off:off], w)
		wr := &gowarp.SendWR{ID: uint64(w.seq), Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			SGL:        []gowarp.SGE{{MR: src, Offset: off, Length: w.n}},
			RemoteAddr: dst.Addr() + uint64(base+w.off), RKey: dst.STag()}
		for {
			err := qp.PostSend(wr)
			if err == nil {
				break
			}
			if !errors.Is(err, gowarp.ErrQueueFull) {
				return err
			}
			if err := reap(true); err != nil {
				return err
			}
		}
		out++
		off += w.n
		if err := reap(false); err != nil {
			return err
		}
	}
	for out > 0 {
		if err := reap(true); err != nil {
			return err
		}
	}
	// One-sided: the Writes are placed once the peer has placed them all.
	return nil
}

// TestSnapshotBadInput: a snapshot of a deregistered region, a second
// Close, reads after Close and writes outside the region get errors the
// root package names; Deregister refuses while a snapshot is open.
func TestSnapshotBadInput(t *testing.T) {
	pd := gowarp.Open().AllocPD()
	mr, err := pd.Register(make([]byte, 8192), gowarp.RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := mr.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := mr.Deregister(); !errors.Is(err, gowarp.ErrRegionBusy) {
		t.Errorf("Deregister with a snapshot open: %v", err)
	}
	if _, err := mr.WriteAt(make([]byte, 10), 8190); !errors.Is(err, gowarp.ErrOutOfBounds) {
		t.Errorf("WriteAt past the end: %v", err)
	}
	if _, err := mr.WriteAt(make([]byte, 1), -1); !errors.Is(err, gowarp.ErrOutOfBounds) {
		t.Errorf("WriteAt before the start: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, gowarp.ErrSnapshotClosed) {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.ReadAt(make([]byte, 1), 0); !errors.Is(err, gowarp.ErrSnapshotClosed) {
		t.Errorf("ReadAt after Close: %v", err)
	}
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if _, err := mr.Snapshot(ctx); !errors.Is(err, gowarp.ErrRegionInvalid) {
		t.Errorf("Snapshot of a deregistered region: %v", err)
	}
	if _, err := mr.WriteAt([]byte{1}, 0); !errors.Is(err, gowarp.ErrRegionInvalid) {
		t.Errorf("WriteAt of a deregistered region: %v", err)
	}
}
