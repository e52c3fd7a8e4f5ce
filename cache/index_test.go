package cache_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
)

// TestIndexLookup: with LookupIndex, gets and lookups of indexed values
// (one piece, a key that fits a bucket) never reach the server's control
// path, and the rest (several pieces, long keys, values over the inline
// limit of Get's bounce buffer) still read back right through it; a
// delete takes the key out of the index; a server without an index
// serves the same client through the control path.
func TestIndexLookup(t *testing.T) {
	for _, buckets := range []int{0, -1} {
		t.Run(fmt.Sprint("buckets=", buckets), func(t *testing.T) {
			addr, srv, _ := startServer(t, cache.ServerOptions{BlockSize: 256 << 10, IndexBuckets: buckets})
			c := dial(t, addr, cache.ClientOptions{Lookup: cache.LookupIndex})
			ctx := ctxT(t)
			type kv struct {
				key     string
				v       []byte
				indexed bool
			}
			var kvs []kv
			for i, n := range []int{0, 1, 100, 4096, cache.InlineMax, cache.InlineMax + 1, 200 << 10} {
				kvs = append(kvs, kv{fmt.Sprintf("k%d", i), value(uint64(i), n), true})
			}
			kvs = append(kvs, kv{"several-pieces", value(99, 600<<10), false}, kv{strings.Repeat("L", 100), value(98, 10), false})
			for _, x := range kvs {
				if err := c.Put(ctx, x.key, x.v, cache.PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			dst, _ := c.PD().Register(make([]byte, 1<<20), gowarp.LocalWrite)
			for _, x := range kvs {
				gets := srv.Stats().Gets
				got, err := c.Get(ctx, x.key)
				if err != nil || !bytes.Equal(got, x.v) {
					t.Fatalf("get %.10s: %d bytes, %v", x.key, len(got), err)
				}
				e, err := c.Lookup(ctx, x.key)
				if err != nil || e.Size != int64(len(x.v)) {
					t.Fatalf("lookup %.10s: %+v, %v", x.key, e, err)
				}
				if n, err := c.ReadEntry(ctx, e, dst, 0, len(x.v), 0); (err != nil && len(x.v) > 0) || !bytes.Equal(dst.Bytes()[:n], x.v) {
					t.Fatalf("read entry %.10s: %d, %v", x.key, n, err)
				}
				want := gets + 2 // Get and Lookup asked the server
				if x.indexed && buckets == 0 {
					want = gets
				}
				if g := srv.Stats().Gets; g != want {
					t.Fatalf("%.10s: the server served %d gets, want %d", x.key, g-gets, want-gets)
				}
			}
			if err := c.Delete(ctx, "k3"); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Get(ctx, "k3"); !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("get after delete: %v", err)
			}
			if _, err := c.ReadAt(ctx, "k3", dst, 0, 10, 0); !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("ReadAt after delete: %v", err)
			}
		})
	}
}

// TestIndexConcurrentUpdates: readers get keys through the index while
// writers replace, delete and put them again, small and large, so that
// buckets are rewritten under the readers' Reads and blocks are reused.
// Every value a reader gets is one a writer put under that key, whole
// (each value carries its key and version and is a function of them);
// never another key's, never torn.
func TestIndexConcurrentUpdates(t *testing.T) {
	const bs = 64 << 10
	addr, srv, _ := startServer(t, cache.ServerOptions{BlockSize: bs, Budget: 4 * bs, IndexBuckets: 16})
	w := dial(t, addr, cache.ClientOptions{Conns: 2})
	r := dial(t, addr, cache.ClientOptions{Conns: 2, Lookup: cache.LookupIndex})
	ctx := ctxT(t)
	const keys = 12 // 16 buckets, neighbourhoods of 4: some keys overflow
	mk := func(k, ver int) []byte {
		n := 64 + (k*977+ver*131)%(20<<10) // some inline, some by RDMA Write
		v := value(uint64(k)<<32|uint64(ver), n)
		binary.BigEndian.PutUint32(v, uint32(k))
		binary.BigEndian.PutUint32(v[4:], uint32(ver))
		return v
	}
	for k := range keys {
		if err := w.Put(ctx, fmt.Sprint("c", k), mk(k, 0), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var puts, gets, misses atomic.Int64
	for g := range 2 {
		wg.Go(func() {
			for ver := 1; ; ver++ {
				select {
				case <-stop:
					return
				default:
				}
				k := (ver*7 + g) % keys
				key := fmt.Sprint("c", k)
				if ver%11 == 0 {
					if err := w.Delete(ctx, key); err != nil && !errors.Is(err, cache.ErrNotFound) {
						t.Error(err)
						return
					}
					continue
				}
				if err := w.Put(ctx, key, mk(k, ver), cache.PutOptions{}); err != nil {
					t.Error(err)
					return
				}
				puts.Add(1)
			}
		})
	}
	for g := range 4 {
		wg.Go(func() {
			mr, _ := r.PD().Register(make([]byte, 32<<10), gowarp.LocalWrite)
			var buf []byte
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := (i + g) % keys
				key := fmt.Sprint("c", k)
				var err error
				var v []byte
				if i%2 == 0 {
					buf, err = r.GetInto(ctx, key, buf, cache.GetOptions{})
					v = buf
				} else {
					var e *cache.Entry
					if e, err = r.Lookup(ctx, key); err == nil {
						var n int
						n, err = r.ReadEntry(ctx, e, mr, 0, int(e.Size), 0)
						v = mr.Bytes()[:n]
						if errors.Is(err, cache.ErrStale) {
							continue // replaced meanwhile: fails cleanly
						}
					}
				}
				if errors.Is(err, cache.ErrNotFound) {
					misses.Add(1)
					continue
				}
				if err != nil {
					t.Errorf("get %s: %v", key, err)
					return
				}
				if len(v) < 8 || binary.BigEndian.Uint32(v) != uint32(k) {
					t.Errorf("get %s: a value of another key (%d bytes)", key, len(v))
					return
				}
				if want := mk(k, int(binary.BigEndian.Uint32(v[4:]))); !bytes.Equal(v, want) {
					t.Errorf("get %s: %d bytes, not a value put under it", key, len(v))
					return
				}
				gets.Add(1)
			}
		})
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	st := srv.Stats()
	t.Logf("%d puts, %d gets (%d misses), server: %d control-path gets, %d page-outs", puts.Load(), gets.Load(), misses.Load(), st.Gets, st.PageOuts)
	if puts.Load() < 10 || gets.Load() < 10 {
		t.Fatalf("too little done: %d puts, %d gets", puts.Load(), gets.Load())
	}
}

// TestIndexPaging: values in blocks paged out under the budget read back
// right through the index (the Read faults the pages in from the file),
// and after a restart the index is rebuilt from the store.
func TestIndexPaging(t *testing.T) {
	const bs = 64 << 10
	dir := t.TempDir()
	addr, srv, stop := startServer(t, cache.ServerOptions{Dir: dir, BlockSize: bs, Budget: 2 * bs})
	c := dial(t, addr, cache.ClientOptions{Lookup: cache.LookupIndex})
	ctx := ctxT(t)
	vals := map[string][]byte{}
	for i := range 40 { // 20 blocks
		k := fmt.Sprintf("p%02d", i)
		vals[k] = value(uint64(i), 30<<10)
		if err := c.Put(ctx, k, vals[k], cache.PutOptions{Durable: i%4 == 0}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(c *cache.Client, srv *cache.Server) {
		gets := srv.Stats().Gets
		for k, v := range vals {
			if got, err := c.Get(ctx, k); err != nil || !bytes.Equal(got, v) {
				t.Fatalf("get %s: %d bytes, %v", k, len(got), err)
			}
		}
		if g := srv.Stats().Gets; g != gets {
			t.Fatalf("%d gets reached the server", g-gets)
		}
	}
	check(c, srv)
	if st := srv.Stats(); st.PageOuts < 10 {
		t.Fatalf("stats %+v: expected pages out", st)
	}
	c.Close()
	stop()
	addr, srv, _ = startServer(t, cache.ServerOptions{Dir: dir, BlockSize: bs, Budget: 2 * bs})
	check(dial(t, addr, cache.ClientOptions{Lookup: cache.LookupIndex}), srv)
}
