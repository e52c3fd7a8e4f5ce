package cache_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
)

// BenchmarkGet4K, BenchmarkGetIndex4K and BenchmarkReadAt4K: 4 KiB
// values, 8 goroutines per GOMAXPROCS, by the control path, through the
// client-readable index and one-sided through a kept address; for
// profiles (the comparison with memcached is `gowarp cache bench`).
// cpu-ns/op is the process's CPU time (client and server) per op, which
// says more than ns/op on a host other work loads.
func BenchmarkGet4K(b *testing.B)      { bench4K(b, false, cache.LookupControl) }
func BenchmarkGetIndex4K(b *testing.B) { bench4K(b, false, cache.LookupIndex) }
func BenchmarkReadAt4K(b *testing.B)   { bench4K(b, true, cache.LookupControl) }

func bench4K(b *testing.B, oneSided bool, lookup cache.LookupMode) {
	addr, _, _ := startServer(b, cache.ServerOptions{})
	c := dial(b, addr, cache.ClientOptions{Conns: 1, Lookup: lookup})
	ctx := ctxT(b)
	v := value(1, 4096)
	for i := range 100 {
		if err := c.Put(ctx, key4K(i), v, cache.PutOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.SetParallelism(8)
	b.SetBytes(4096)
	b.ResetTimer()
	cpu0 := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		mr, _ := c.PD().Register(make([]byte, 4096), gowarp.LocalWrite)
		var buf []byte
		for pb.Next() {
			k := key4K(int(next.Add(1) % 100))
			var err error
			if oneSided {
				_, err = c.ReadAt(ctx, k, mr, 0, 4096, 0)
			} else {
				buf, err = c.GetInto(ctx, k, buf, cache.GetOptions{})
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

var keys4K = func() (ks [100]string) {
	for i := range ks {
		ks[i] = "k4-" + string(rune('a'+i/26)) + string(rune('a'+i%26))
	}
	return
}()

func key4K(i int) string { return keys4K[i] }

// BenchmarkLookupRead1M: a lookup of a 1 MiB value, by the control path
// or the index, then its Read, 2 at a time.
func BenchmarkLookupRead1MControl(b *testing.B)       { benchLookupRead1M(b, cache.LookupControl, 1) }
func BenchmarkLookupRead1MControl2Conns(b *testing.B) { benchLookupRead1M(b, cache.LookupControl, 2) }
func BenchmarkLookupRead1MIndex(b *testing.B)         { benchLookupRead1M(b, cache.LookupIndex, 1) }
func BenchmarkLookupRead1MIndex2Conns(b *testing.B)   { benchLookupRead1M(b, cache.LookupIndex, 2) }

func benchLookupRead1M(b *testing.B, lookup cache.LookupMode, conns int) {
	bench1M(b, cache.ClientOptions{Lookup: lookup, Conns: conns}, func(ctx context.Context, c *cache.Client, key string, mr *gowarp.MR) error {
		e, err := c.Lookup(ctx, key)
		if err == nil {
			_, err = c.ReadEntry(ctx, e, mr, 0, 1<<20, 0)
		}
		return err
	})
}

// BenchmarkReadAt1M: ReadAt of 1 MiB values through kept addresses, one
// goroutine per GOMAXPROCS (2 in flight on 2 CPUs, as `gowarp cache
// bench` reads them).
func BenchmarkReadAt1M(b *testing.B) {
	bench1M(b, cache.ClientOptions{}, func(ctx context.Context, c *cache.Client, key string, mr *gowarp.MR) error {
		_, err := c.ReadAt(ctx, key, mr, 0, 1<<20, 0)
		return err
	})
}

// bench1M puts ten 1 MiB values and reads them in turn with read, one
// goroutine per GOMAXPROCS, each into a registered buffer of its own.
func bench1M(b *testing.B, o cache.ClientOptions, read func(ctx context.Context, c *cache.Client, key string, mr *gowarp.MR) error) {
	addr, _, _ := startServer(b, cache.ServerOptions{})
	c := dial(b, addr, o)
	ctx := ctxT(b)
	v := value(1, 1<<20)
	for i := range 10 {
		if err := c.Put(ctx, key4K(i), v, cache.PutOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.SetParallelism(1)
	b.SetBytes(1 << 20)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		mr, err := c.PD().Register(make([]byte, 1<<20), gowarp.LocalWrite)
		if err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			if err := read(ctx, c, key4K(int(next.Add(1)%10)), mr); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
