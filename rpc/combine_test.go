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
