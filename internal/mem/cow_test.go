package mem

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func cowRegion(t testing.TB, bufs ...[]byte) *Region {
	t.Helper()
	r, err := NewTable().Register(1, bufs, LocalWrite|RemoteWrite, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func snapBytes(t testing.TB, s *Snapshot) []byte {
	t.Helper()
	b, err := s.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSnapshotKeepsContent: a snapshot shows the region as it was when
// taken, whatever is written after, and each later snapshot shows the
// writes before it.
func TestSnapshotKeepsContent(t *testing.T) {
	buf := bytes.Repeat([]byte{1}, 3*PageSize+100)
	r := cowRegion(t, buf)
	ctx := context.Background()
	s1, err := r.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want1 := bytes.Clone(buf)
	if _, err := r.WriteAt(bytes.Repeat([]byte{2}, 200), PageSize-100); err != nil {
		t.Fatal(err)
	}
	s2, err := r.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want2 := bytes.Clone(buf)
	if _, err := r.WriteAt(bytes.Repeat([]byte{3}, 150), 3*PageSize-50); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WriteAt([]byte{4}, PageSize); err != nil { // page 1 again: copied for s2 only
		t.Fatal(err)
	}
	if got := snapBytes(t, s1); !bytes.Equal(got, want1) {
		t.Error("first snapshot changed by later writes")
	}
	if got := snapBytes(t, s2); !bytes.Equal(got, want2) {
		t.Error("second snapshot changed by later writes")
	}
	if buf[PageSize-100] != 2 || buf[PageSize] != 4 || buf[3*PageSize+99] != 3 {
		t.Error("the writes did not reach the region")
	}
	s3, _ := r.Snapshot(ctx)
	if got := snapBytes(t, s3); !bytes.Equal(got, buf) {
		t.Error("a new snapshot does not show the region")
	}
	for _, s := range []*Snapshot{s1, s2, s3} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if r.wuse.Load() != 0 {
		t.Errorf("wuse %#x with no snapshot and no write", r.wuse.Load())
	}
}

// TestSnapshotModel checks snapshots of a region of several buffers
// against a reference that copies the whole region for each snapshot,
// under random writes, snapshots, closes and reads.
func TestSnapshotModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var bufs [][]byte
		for range 1 + rng.IntN(4) {
			bufs = append(bufs, make([]byte, 1+rng.IntN(3*PageSize)))
		}
		r := cowRegion(t, bufs...)
		n := r.Len()
		live := make([]byte, n)
		type pair struct {
			s    *Snapshot
			want []byte
		}
		var snaps []pair
		for step := range 300 {
			switch op := rng.IntN(10); {
			case op < 6:
				off := rng.IntN(n)
				b := make([]byte, rng.IntN(n-off+1))
				for i := range b {
					b[i] = byte(step)
				}
				if _, err := r.WriteAt(b, int64(off)); err != nil {
					t.Fatal(err)
				}
				copy(live[off:], b)
			case op < 8 && len(snaps) < 5:
				s, err := r.Snapshot(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				snaps = append(snaps, pair{s, bytes.Clone(live)})
			case op < 9 && len(snaps) > 0:
				i := rng.IntN(len(snaps))
				if err := snaps[i].s.Close(); err != nil {
					t.Fatal(err)
				}
				snaps = append(snaps[:i], snaps[i+1:]...)
			case len(snaps) > 0:
				p := snaps[rng.IntN(len(snaps))]
				off := rng.IntN(n + 1)
				b := make([]byte, rng.IntN(n+10))
				k, err := p.s.ReadAt(b, int64(off))
				want := p.want[off:min(n, off+len(b))]
				if k != len(want) || !bytes.Equal(b[:k], want) {
					t.Fatalf("seed %d step %d: ReadAt(%d bytes at %d) = %d bytes, differing from the reference", seed, step, len(b), off, k)
				}
				if (k < len(b)) != (err == io.EOF) || err != nil && err != io.EOF {
					t.Fatalf("seed %d step %d: ReadAt of %d at %d read %d: %v", seed, step, len(b), off, k, err)
				}
			}
		}
		var got []byte
		for _, b := range bufs {
			got = append(got, b...)
		}
		if !bytes.Equal(got, live) {
			t.Fatalf("seed %d: the region differs from the reference", seed)
		}
		for _, p := range snaps {
			if !bytes.Equal(snapBytes(t, p.s), p.want) {
				t.Fatalf("seed %d: a snapshot differs from the reference", seed)
			}
			p.s.Close()
		}
	}
}

// TestSnapshotNoTornWrite: writers place units of 8-byte words in pieces,
// yielding between them as an FPDU arriving in several reads does, each
// under one write hold, while snapshots are taken. Every unit in every
// snapshot is one writer's, whole, and the snapshot holds for each writer
// a prefix of its units (it writes them in order).
func TestSnapshotNoTornWrite(t *testing.T) {
	const (
		writers = 3
		unit    = 1000 // bytes: units straddle pages
		units   = 60   // per writer, one area each, written round and round
	)
	area := unit * units
	buf := make([]byte, writers*area)
	r := cowRegion(t, buf)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst [][]byte
			var word [8]byte
			for seq := uint64(1); !stop.Load(); seq++ {
				if !r.TryHoldWrite() {
					t.Error("TryHoldWrite failed")
					return
				}
				off := uint64(w*area) + (seq-1)%units*unit
				dst = r.WriteSlices(dst[:0], off, unit)
				binary.LittleEndian.PutUint64(word[:], uint64(w)<<56|seq)
				i := 0
				for _, d := range dst {
					for j := range d {
						d[j] = word[i%8]
						i++
						if i%256 == 0 {
							runtime.Gosched()
						}
					}
				}
				r.UnholdWrite()
			}
		}()
	}
	ctx := context.Background()
	deadline := time.Now().Add(300 * time.Millisecond)
	nsnap := 0
	for nsnap < 20 || time.Now().Before(deadline) && nsnap < 400 {
		s, err := r.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkUnits(t, snapBytes(t, s), writers, units, unit)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		nsnap++
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d snapshots checked", nsnap)
}

// checkUnits checks a snapshot of TestSnapshotNoTornWrite's region.
func checkUnits(t *testing.T, b []byte, writers, units, unit int) {
	t.Helper()
	for w := range writers {
		var seqs []uint64
		for u := range units {
			p := b[(w*units+u)*unit:][:unit]
			first := binary.LittleEndian.Uint64(p)
			for i := 0; i < unit; i++ {
				if p[i] != byte(first>>(8*(i%8))) {
					t.Fatalf("writer %d unit %d torn: %x… at byte %d", w, u, p[:16], i)
				}
			}
			if first != 0 && int(first>>56) != w {
				t.Fatalf("writer %d unit %d holds writer %d's word", w, u, first>>56)
			}
			seqs = append(seqs, first&(1<<56-1))
		}
		// Seq s goes to unit (s-1)%units: a prefix of the writes leaves
		// the units holding max-units+1 .. max in that order.
		hi := uint64(0)
		for _, s := range seqs {
			hi = max(hi, s)
		}
		for u, s := range seqs {
			// The last write up to hi that went to unit u.
			want, k, U, u := uint64(0), (hi-1)%uint64(units), uint64(units), uint64(u)
			switch {
			case hi == 0:
			case u <= k:
				want = hi - (k - u)
			case hi > k+U-u:
				want = hi - k - U + u
			}
			if s != want {
				t.Fatalf("writer %d: unit %d holds write %d, want %d (latest %d): not a prefix", w, u, s, want, hi)
			}
		}
	}
}

// TestSnapshotBadInput: snapshots of a deregistered region, a second
// Close, reads after Close, writes out of bounds and a Deregister under a
// snapshot get clear errors.
func TestSnapshotBadInput(t *testing.T) {
	tb := NewTable()
	r, _ := tb.Register(1, [][]byte{make([]byte, 100)}, LocalWrite, Options{})
	ctx := context.Background()
	s, err := r.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Deregister(); !errors.Is(err, ErrBusy) {
		t.Errorf("Deregister under a snapshot: %v, want ErrBusy", err)
	}
	for _, c := range []struct {
		off int64
		n   int
	}{{-1, 1}, {100, 1}, {99, 2}, {0, 101}} {
		if _, err := r.WriteAt(make([]byte, c.n), c.off); !errors.Is(err, ErrBounds) {
			t.Errorf("WriteAt of %d at %d: %v, want ErrBounds", c.n, c.off, err)
		}
	}
	if _, err := s.ReadAt(make([]byte, 1), -1); !errors.Is(err, ErrBounds) {
		t.Errorf("ReadAt at -1: %v", err)
	}
	if n, err := s.ReadAt(make([]byte, 10), 95); n != 5 || err != io.EOF {
		t.Errorf("ReadAt past the end: %d, %v", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, ErrSnapshotClosed) {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrSnapshotClosed) {
		t.Errorf("ReadAt after Close: %v", err)
	}
	if _, err := s.Bytes(); !errors.Is(err, ErrSnapshotClosed) {
		t.Errorf("Bytes after Close: %v", err)
	}
	if err := r.Deregister(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Snapshot(ctx); !errors.Is(err, ErrInvalid) {
		t.Errorf("Snapshot of a deregistered region: %v", err)
	}
	if _, err := r.WriteAt([]byte{1}, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("WriteAt to a deregistered region: %v", err)
	}
}

// TestSnapshotStalledWrite: a write that does not end (a peer stopped in
// the middle of an FPDU) makes Snapshot give up with ErrBusy when its
// context ends, and lets writes go on after.
func TestSnapshotStalledWrite(t *testing.T) {
	r := cowRegion(t, make([]byte, 100))
	if !r.TryHoldWrite() {
		t.Fatal("TryHoldWrite")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := r.Snapshot(ctx)
		done <- err
	}()
	for r.wuse.Load()&wGate == 0 {
		runtime.Gosched()
	}
	// A write that begins now waits at the gate.
	wrote := make(chan error)
	go func() {
		_, err := r.WriteAt([]byte{7}, 0)
		wrote <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, ErrBusy) || !errors.Is(err, context.Canceled) {
		t.Errorf("Snapshot under a stalled write: %v, want ErrBusy and context.Canceled", err)
	}
	if err := <-wrote; err != nil {
		t.Errorf("WriteAt after the snapshot gave up: %v", err)
	}
	r.UnholdWrite()
	if r.InUse() {
		t.Error("region still in use")
	}
	s, err := r.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

// TestWriteHoldAllocs: a placement's write hold and destination cost no
// allocation, with no snapshot and with one whose pages are copied.
func TestWriteHoldAllocs(t *testing.T) {
	r := cowRegion(t, make([]byte, 4*PageSize))
	dst := make([][]byte, 0, 4)
	place := func() {
		if !r.TryHoldWrite() {
			t.Fatal("TryHoldWrite")
		}
		dst = r.WriteSlices(dst[:0], 100, 3*PageSize)
		r.UnholdWrite()
	}
	if a := testing.AllocsPerRun(100, place); a != 0 {
		t.Errorf("placement without a snapshot allocates %v times", a)
	}
	s, _ := r.Snapshot(context.Background())
	defer s.Close()
	place() // copies the pages once
	if a := testing.AllocsPerRun(100, place); a != 0 {
		t.Errorf("placement into copied pages allocates %v times", a)
	}
}

// BenchmarkPlace is one placement's memory bookkeeping, with and without
// a snapshot open (whose pages are copied after the first pass), and
// readhold the read hold and Slices a placement took before write holds.
func BenchmarkPlace(b *testing.B) {
	b.Run("readhold", func(b *testing.B) {
		r := cowRegion(b, make([]byte, 1<<20))
		dst := make([][]byte, 0, 4)
		for i := 0; b.Loop(); i++ {
			r.TryHold()
			dst = r.Slices(dst[:0], uint64(i%256)*PageSize, PageSize)
			r.Unhold()
		}
	})
	for _, snap := range []bool{false, true} {
		name := "nosnapshot"
		if snap {
			name = "snapshot"
		}
		b.Run(name, func(b *testing.B) {
			r := cowRegion(b, make([]byte, 1<<20))
			if snap {
				s, _ := r.Snapshot(context.Background())
				defer s.Close()
			}
			dst := make([][]byte, 0, 4)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				r.TryHoldWrite()
				dst = r.WriteSlices(dst[:0], uint64(i%256)*PageSize, PageSize)
				r.UnholdWrite()
			}
		})
	}
}
