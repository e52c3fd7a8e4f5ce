package engine

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// TestHandOffMidFPDU: the receive path changes hands in the middle of
// FPDUs (an inline waiter whose context ends leaves it there; the next
// waiter, or the receive goroutine after the watcher hands it back, goes
// on), and what was cut in a header, a payload read straight into place,
// or a trailer lands whole.
func TestHandOffMidFPDU(t *testing.T) {
	q, cq, table, raw := tcpQP(t, Handed)
	buf := make([]byte, 8192)
	region, err := table.Register(1, [][]byte{buf}, mem.RemoteWrite, mem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w1, w2 := pattern(5000, 1), pattern(100, 2)
	var stream []byte
	for _, w := range []struct {
		to uint64
		b  []byte
	}{{0, w1}, {6000, w2}} {
		h := chdr(wire.OpWrite)
		h.STag, h.TO = uint32(region.STag()), region.Addr()+w.to
		stream, _ = wire.AppendFPDU(stream, append(h.Append(nil), w.b...), false)
	}
	// In the first header, in the first payload (before and after the
	// direct read starts), in its trailer, in the second header and in
	// the second trailer.
	cuts := []int{1, 9, 20, 1000, 3000, 5016, 5021, 5030, len(stream) - 2, len(stream)}
	prev := 0
	for i, c := range cuts {
		if _, err := raw.Write(stream[prev:c]); err != nil {
			t.Fatal(err)
		}
		prev = c
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Millisecond)
		if i%2 == 0 {
			cq.Wait(ctx) // no completion comes: it leaves when ctx ends
		} else {
			q.Progress(ctx)
		}
		cancel()
		if i%3 == 2 {
			time.Sleep(2 * rxReclaim) // the receive goroutine takes the path back
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := region.WaitPlaced(ctx, uint64(len(w1)+len(w2))); err != nil {
		t.Fatalf("placed %d of %d bytes: %v (queue pair %v, %v)", region.Placed(), len(w1)+len(w2), err, q.State(), q.Err())
	}
	if !bytes.Equal(buf[:5000], w1) || !bytes.Equal(buf[6000:6100], w2) {
		t.Error("the Writes placed other bytes")
	}
	if q.State() != StateReady || q.Err() != nil {
		t.Errorf("queue pair %v, %v", q.State(), q.Err())
	}
}
