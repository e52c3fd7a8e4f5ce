package mem

import (
	"context"
	"math/rand/v2"
	"testing"
)

// TestSlicesFit: SlicesFit and RemoteSlicesFit say how many bytes, and in
// how many pieces, the first max pieces Slices and RemoteSlices give
// cover: regions of one buffer and of many, of sizes that do not divide
// each other, and a detached region whose reads wrap around its sink.
func TestSlicesFit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tb := NewTable()
	var regions []*Region
	for _, sizes := range [][]int{{100}, {1, 2, 3, 4, 5}, {7, 7, 7, 7, 7, 7, 7, 7, 7, 7}, {4096, 1, 8191, 3}} {
		var bufs [][]byte
		for _, n := range sizes {
			bufs = append(bufs, make([]byte, n))
		}
		r, err := tb.Register(1, bufs, RemoteRead, Options{})
		if err != nil {
			t.Fatal(err)
		}
		regions = append(regions, r)
	}
	detached, err := tb.Register(1, [][]byte{make([]byte, 3*sinkMax+100)}, RemoteRead, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := detached.Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	regions = append(regions, detached)
	for _, r := range regions {
		for range 2000 {
			off := rng.Uint64N(r.length + 1)
			n := rng.Uint64N(r.length - off + 1)
			max := rng.IntN(12)
			all := r.RemoteSlices(nil, Plain, off, n)
			wantK := min(max, len(all))
			var want uint64
			for _, v := range all[:wantK] {
				want += uint64(len(v))
			}
			if n == 0 {
				wantK = 0
			}
			got, k := r.RemoteSlicesFit(Plain, off, n, max)
			if got != want || k != wantK {
				t.Fatalf("region of %d buffers (detached %v), [%d, +%d) in %d pieces: fit %d bytes in %d, want %d in %d",
					len(r.bufs), r.Detached(), off, n, max, got, k, want, wantK)
			}
			if r.Detached() {
				continue
			}
			if got, k := r.SlicesFit(off, n, max); got != want || k != wantK {
				t.Fatalf("region of %d buffers, [%d, +%d) in %d pieces: SlicesFit %d bytes in %d, want %d in %d", len(r.bufs), off, n, max, got, k, want, wantK)
			}
		}
	}
}
