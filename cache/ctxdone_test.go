package cache_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
)

// TestDoneContextDoesNothing: a call whose context is already done
// returns its error and touches nothing, on a warm connection too (the
// free-slot fast path once skipped the check).
func TestDoneContextDoesNothing(t *testing.T) {
	addr, _, _ := startServer(t, cache.ServerOptions{BlockSize: 64 << 10})
	c := dial(t, addr, cache.ClientOptions{})
	ctx := ctxT(t)
	keep := value(3, 100<<10)
	if err := c.Put(ctx, "keep", keep, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, "small", []byte("v1"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	dst, err := c.PD().Register(make([]byte, len(keep)), gowarp.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	src, err := c.PD().Register(value(4, 1000), 0)
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	calls := []struct {
		name string
		call func() error
	}{
		{"Put", func() error { return c.Put(done, "small", []byte("v2"), cache.PutOptions{}) }},
		{"Put new", func() error { return c.Put(done, "new", []byte("x"), cache.PutOptions{}) }},
		{"Put large", func() error { return c.Put(done, "keep", value(5, 100<<10), cache.PutOptions{}) }},
		{"WriteAt", func() error { return c.WriteAt(done, "keep", src, 0, src.Len(), cache.PutOptions{}) }},
		{"Delete", func() error { return c.Delete(done, "small") }},
		{"Get", func() error { _, err := c.Get(done, "small"); return err }},
		{"ReadAt", func() error { _, err := c.ReadAt(done, "keep", dst, 0, 10, 0); return err }},
	}
	for _, k := range calls {
		for range 3 {
			if err := k.call(); !errors.Is(err, context.Canceled) {
				t.Errorf("%s with a done context: %v, want context.Canceled", k.name, err)
			}
		}
	}
	if got, err := c.Get(ctx, "small"); err != nil || string(got) != "v1" {
		t.Errorf("small after: %q, %v", got, err)
	}
	if got, err := c.Get(ctx, "keep"); err != nil || string(got) != string(keep) {
		t.Errorf("keep after: %d bytes, %v", len(got), err)
	}
	if _, err := c.Get(ctx, "new"); !errors.Is(err, cache.ErrNotFound) {
		t.Errorf("new after: %v, want ErrNotFound", err)
	}
	// The connection serves on.
	if err := c.Put(ctx, "small", []byte("v3"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
}
