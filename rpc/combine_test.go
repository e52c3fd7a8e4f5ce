package rpc

import (
	"runtime"
	"sync"
	"testing"

	"github.com/gowarp/gowarp"
)

// TestCombinerWaitsForOthers: a poster told that others are about to
// post lets the goroutines ready to run queue theirs first, and all go
// out in one PostSendList; a lone poster posts at once.
func TestCombinerWaitsForOthers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var lists [][]uint64
	var b combiner
	b.postList = func(wrs []gowarp.SendWR) (int, error) {
		ids := make([]uint64, len(wrs))
		for i := range wrs {
			ids[i] = wrs[i].ID
		}
		lists = append(lists, ids)
		return len(wrs), nil
	}
	// On one P the goroutines started here run only once the poster
	// yields; the scheduler may now and then run the poster first (it
	// looks at the global queue every 61st time), so a few tries.
	for try := 0; ; try++ {
		lists = nil
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := b.post(nil, true, gowarp.SendWR{ID: uint64(i + 1)}); err != nil {
					t.Error(err)
				}
			}()
		}
		if err := b.post(nil, true, gowarp.SendWR{ID: 0}); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if len(lists) == 1 && len(lists[0]) == 4 {
			break
		}
		if try == 5 {
			t.Fatalf("posted as %v, want one list of 4", lists)
		}
	}
	lists = nil
	if err := b.post(nil, false, gowarp.SendWR{ID: 9}); err != nil {
		t.Fatal(err)
	}
	if len(lists) != 1 || len(lists[0]) != 1 {
		t.Fatalf("lone post went as %v", lists)
	}
}

// TestCombinerEnqueue: work queued without a post leaves with the next
// post, even one with nothing of its own, and the posted hook hears of
// every list the queue pair took, and of nothing it refused.
func TestCombinerEnqueue(t *testing.T) {
	var b combiner
	var lists, heard [][]uint64
	fail := false
	ids := func(wrs []gowarp.SendWR) []uint64 {
		out := make([]uint64, len(wrs))
		for i := range wrs {
			out[i] = wrs[i].ID
		}
		return out
	}
	b.postList = func(wrs []gowarp.SendWR) (int, error) {
		lists = append(lists, ids(wrs))
		if fail {
			return 0, gowarp.ErrQueueFull
		}
		return len(wrs), nil
	}
	b.posted = func(wrs []gowarp.SendWR) { heard = append(heard, ids(wrs)) }
	if err := b.enqueue(gowarp.SendWR{ID: 1}, gowarp.SendWR{ID: 2}); err != nil {
		t.Fatal(err)
	}
	if len(lists) != 0 {
		t.Fatalf("enqueue posted %v", lists)
	}
	if err := b.post(nil, false); err != nil {
		t.Fatal(err)
	}
	if len(lists) != 1 || len(lists[0]) != 2 || len(heard) != 1 || len(heard[0]) != 2 {
		t.Fatalf("posted %v, heard %v; want [1 2] once each", lists, heard)
	}
	fail = true
	if err := b.post(nil, false, gowarp.SendWR{ID: 3}); err == nil {
		t.Fatal("a refused post succeeded")
	}
	if len(heard) != 1 {
		t.Fatalf("heard of a refused list: %v", heard)
	}
	if err := b.enqueue(gowarp.SendWR{ID: 4}); err == nil {
		t.Fatal("enqueue after a failed post succeeded")
	}
}
