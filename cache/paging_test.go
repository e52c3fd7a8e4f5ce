package cache_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
)

// TestPagingUnderBudget: 24 blocks of data under a budget of 3 blocks.
// Every value reads back whole, by Get and by ReadAt (one-sided, which
// needs the blocks in memory), while no more than the budget stays
// resident.
func TestPagingUnderBudget(t *testing.T) {
	const bs = 64 << 10
	addr, srv, _ := startServer(t, cache.ServerOptions{BlockSize: bs, Budget: 3 * bs})
	c := dial(t, addr, cache.ClientOptions{})
	ctx := ctxT(t)
	var keys []string
	vals := map[string][]byte{}
	for i := range 48 { // two 30 KiB values a block
		k := fmt.Sprintf("p%02d", i)
		keys = append(keys, k)
		vals[k] = value(uint64(i), 30<<10)
		if err := c.Put(ctx, k, vals[k], cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dst, _ := c.PD().Register(make([]byte, 30<<10), gowarp.LocalWrite)
	for round := range 2 {
		for _, k := range keys {
			got, err := c.Get(ctx, k)
			if err != nil || !bytes.Equal(got, vals[k]) {
				t.Fatalf("round %d: get %s: %d bytes, %v", round, k, len(got), err)
			}
			n, err := c.ReadAt(ctx, k, dst, 0, len(vals[k]), 0)
			if err != nil || !bytes.Equal(dst.Bytes()[:n], vals[k]) {
				t.Fatalf("round %d: ReadAt %s: %d bytes, %v", round, k, n, err)
			}
			if st := srv.Stats(); st.Resident > 3 {
				t.Fatalf("%d blocks resident, budget 3", st.Resident)
			}
		}
	}
	st := srv.Stats()
	if st.Blocks < 24 || st.PageOuts < 20 {
		t.Fatalf("stats %+v: expected 24 blocks and pages out", st)
	}
}

// TestStaleAfterPaging: an entry whose block was paged out reads the
// value from the block's file; one whose block was reused for other
// values never reads other bytes: ReadEntry fails with ErrStale, and
// ReadAt by key looks the key up again and reads the right value. The
// server serves on for everyone.
func TestStaleAfterPaging(t *testing.T) {
	const bs = 64 << 10
	addr, srv, _ := startServer(t, cache.ServerOptions{BlockSize: bs, Budget: 2 * bs})
	c := dial(t, addr, cache.ClientOptions{})
	other := dial(t, addr, cache.ClientOptions{})
	ctx := ctxT(t)
	v := value(1, 40<<10)
	if err := c.Put(ctx, "a", v, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	e, err := c.Lookup(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	dst, _ := c.PD().Register(make([]byte, 40<<10), gowarp.LocalWrite)
	if _, err := c.ReadEntry(ctx, e, dst, 0, len(v), 0); err != nil {
		t.Fatal(err)
	}
	// Page "a" out: values in other blocks, looked up.
	for i := range 4 {
		k := fmt.Sprintf("f%d", i)
		if err := other.Put(ctx, k, value(uint64(i+10), 40<<10), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Lookup(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if st := srv.Stats(); st.PageOuts == 0 || st.Resident > 2 {
		t.Fatalf("stats %+v: no page-out", st)
	}
	clear(dst.Bytes())
	if n, err := c.ReadEntry(ctx, e, dst, 0, len(v), 0); err != nil || !bytes.Equal(dst.Bytes()[:n], v) {
		t.Fatalf("read through a paged-out block: %d bytes, %v", n, err)
	}
	if n, err := c.ReadAt(ctx, "a", dst, 0, len(v), 0); err != nil || !bytes.Equal(dst.Bytes()[:n], v) {
		t.Fatalf("ReadAt after paging: %d bytes, %v", n, err)
	}

	// Reuse: "a" replaced, its block's other values deleted, the block
	// filled again with other values.
	e, err = c.Lookup(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, "a", []byte("small now"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if err := other.Put(ctx, fmt.Sprintf("g%d", i), value(uint64(i+20), 40<<10), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		if _, err := other.Lookup(ctx, fmt.Sprintf("g%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.ReadEntry(ctx, e, dst, 0, len(v), 0); !errors.Is(err, cache.ErrStale) {
		t.Fatalf("read through a reused block: %v, want ErrStale", err)
	}
	if n, err := c.ReadAt(ctx, "a", dst, 0, len(v), 0); err != io.EOF || string(dst.Bytes()[:n]) != "small now" {
		t.Fatalf("ReadAt after reuse: %q, %v", dst.Bytes()[:n], err)
	}
	if got, err := c.Get(ctx, "a"); err != nil || string(got) != "small now" {
		t.Fatalf("get a: %q, %v", got, err)
	}
	for i := range 6 {
		k := fmt.Sprintf("g%d", i)
		if got, err := other.Get(ctx, k); err != nil || !bytes.Equal(got, value(uint64(i+20), 40<<10)) {
			t.Fatalf("get %s: %v", k, err)
		}
	}
	if srv.Stats().Conns != 2 {
		t.Fatalf("%d clients connected, want 2", srv.Stats().Conns)
	}
}

// TestConcurrentClients: clients with several connections, many
// goroutines each, putting, getting and reading their own keys and
// shared ones, under a budget that pages.
func TestConcurrentClients(t *testing.T) {
	const bs = 64 << 10
	addr, _, _ := startServer(t, cache.ServerOptions{BlockSize: bs, Budget: 4 * bs})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for ci := range 3 {
		c := dial(t, addr, cache.ClientOptions{Conns: 2, Slots: 8, Logger: testLog(t)})
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dst, err := c.PD().Register(make([]byte, 64<<10), gowarp.LocalWrite)
				if err != nil {
					errc <- err
					return
				}
				for i := range 15 {
					k := fmt.Sprintf("c%d-%d-%d", ci, g, i%5)
					v := value(uint64(ci*1000+g*100+i), []int{100, 3000, 20 << 10, 50 << 10}[i%4])
					if err := c.Put(ctx, k, v, cache.PutOptions{Durable: i%7 == 0}); err != nil {
						errc <- fmt.Errorf("put %s: %w", k, err)
						return
					}
					got, err := c.Get(ctx, k)
					if err != nil || !bytes.Equal(got, v) {
						errc <- fmt.Errorf("get %s: %d bytes, %v", k, len(got), err)
						return
					}
					n, err := c.ReadAt(ctx, k, dst, 0, len(v), 0)
					if err != nil || !bytes.Equal(dst.Bytes()[:n], v) {
						errc <- fmt.Errorf("ReadAt %s: %d bytes, %v", k, n, err)
						return
					}
					// A shared key: any complete value of it is right.
					sv := value(uint64(i%3), 10<<10)
					if err := c.Put(ctx, "shared", sv, cache.PutOptions{}); err != nil {
						errc <- err
						return
					}
					if got, err := c.Get(ctx, "shared"); err != nil || len(got) != len(sv) {
						errc <- fmt.Errorf("shared: %d bytes, %v", len(got), err)
						return
					} else if !bytes.Equal(got, value(0, 10<<10)) && !bytes.Equal(got, value(1, 10<<10)) && !bytes.Equal(got, value(2, 10<<10)) {
						errc <- errors.New("shared: a value nobody put")
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// TestBudgetAfterLargePut: a value larger than the budget holds its
// blocks in memory while it is written; once it is committed the server
// is back under the budget without waiting for another page-in, and the
// value still reads back whole, by Get and one-sided.
func TestBudgetAfterLargePut(t *testing.T) {
	const bs = 64 << 10
	addr, srv, _ := startServer(t, cache.ServerOptions{BlockSize: bs, Budget: 3 * bs})
	c := dial(t, addr, cache.ClientOptions{})
	ctx := ctxT(t)
	big := value(7, 12*bs)
	if err := c.Put(ctx, "big", big, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if st := srv.Stats(); st.Resident > 3 {
		t.Fatalf("after a put of 12 blocks: %d blocks resident, budget 3", st.Resident)
	}
	// Small puts land in the open block: no page-in to trim on.
	for i := range 4 {
		if err := c.Put(ctx, fmt.Sprintf("s%d", i), value(uint64(i), 100), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if st := srv.Stats(); st.Resident > 3 {
		t.Fatalf("after small puts: %d blocks resident, budget 3", st.Resident)
	}
	got, err := c.Get(ctx, "big")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("get big: %d bytes, %v", len(got), err)
	}
	dst, _ := c.PD().Register(make([]byte, len(big)), gowarp.LocalWrite)
	n, err := c.ReadAt(ctx, "big", dst, 0, len(big), 0)
	if err != nil || !bytes.Equal(dst.Bytes()[:n], big) {
		t.Fatalf("ReadAt big: %d bytes, %v", n, err)
	}
}

// BenchmarkPutOverBudget puts 64 KiB values, 4 at a time, into a server
// whose budget holds 2 blocks of 256 KiB: most puts page a block in and
// one out, and the store's lock is held meanwhile for whatever paging
// does there.
func BenchmarkPutOverBudget(b *testing.B) {
	addr, _, _ := startServer(b, cache.ServerOptions{BlockSize: 256 << 10, Budget: 512 << 10})
	c := dial(b, addr, cache.ClientOptions{})
	ctx := ctxT(b)
	v := value(1, 64<<10)
	var next atomic.Int64
	b.SetParallelism(2)
	b.SetBytes(int64(len(v)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := fmt.Sprintf("over-%d", next.Add(1)%256)
			if err := c.Put(ctx, k, v, cache.PutOptions{}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkGetWhilePaging gets a small value by the control path while
// another client puts 64 KiB values over the budget, as in
// BenchmarkPutOverBudget: what paging costs those who do not page.
func BenchmarkGetWhilePaging(b *testing.B) {
	addr, _, _ := startServer(b, cache.ServerOptions{BlockSize: 256 << 10, Budget: 512 << 10})
	c := dial(b, addr, cache.ClientOptions{})
	w := dial(b, addr, cache.ClientOptions{})
	ctx := ctxT(b)
	if err := c.Put(ctx, "small", value(2, 100), cache.PutOptions{}); err != nil {
		b.Fatal(err)
	}
	v := value(1, 64<<10)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := w.Put(ctx, fmt.Sprintf("over-%d", i%256), v, cache.PutOptions{}); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	var buf []byte
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		var err error
		t0 := time.Now()
		if buf, err = c.GetInto(ctx, "small", buf, cache.GetOptions{}); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(t0)
	}
	b.StopTimer()
	close(stop)
	<-done
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
