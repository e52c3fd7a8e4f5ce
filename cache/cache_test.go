package cache_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
)

var quiet = slog.New(slog.DiscardHandler)

// testLog logs to the test's output with GOWARP_CACHE_DEBUG set.
func testLog(t testing.TB) *slog.Logger {
	if os.Getenv("GOWARP_CACHE_DEBUG") == "" {
		return quiet
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// startServer serves a data directory on a loopback port until the test
// ends (or stop is called).
func startServer(t testing.TB, o cache.ServerOptions) (addr string, srv *cache.Server, stop func()) {
	t.Helper()
	return startServerAt(t, o, "127.0.0.1:0")
}

// startServerAt is startServer on the address at (host:port).
func startServerAt(t testing.TB, o cache.ServerOptions, at string) (addr string, srv *cache.Server, stop func()) {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if o.Logger == nil {
		o.Logger = quiet
	}
	if o.Device == nil {
		o.Device = gowarp.Open(gowarp.WithLogger(quiet))
	}
	srv, err := cache.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen(at)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
			if err := srv.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return ln.Addr().String(), srv, stop
}

func dial(t testing.TB, addr string, o cache.ClientOptions) *cache.Client {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet
	}
	if o.Device == nil {
		o.Device = gowarp.Open(gowarp.WithLogger(quiet))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cache.Dial(ctx, addr, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func value(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestPutGet: values small (inline) and large (RDMA, several blocks),
// overwrite, delete, list and stats, through the public API.
func TestPutGet(t *testing.T) {
	addr, _, _ := startServer(t, cache.ServerOptions{BlockSize: 256 << 10})
	c := dial(t, addr, cache.ClientOptions{})
	ctx := ctxT(t)
	sizes := []int{0, 1, 100, 4096, cache.InlineMax, cache.InlineMax + 1, 200 << 10, 256<<10 - cache.HeaderLen, 1 << 20, 3<<20 + 17}
	for i, n := range sizes {
		key := fmt.Sprintf("k%02d", i)
		v := value(uint64(i), n)
		if err := c.Put(ctx, key, v, cache.PutOptions{Durable: i%2 == 0}); err != nil {
			t.Fatalf("put %d bytes: %v", n, err)
		}
		got, err := c.Get(ctx, key)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %d bytes: %d bytes, %v", n, len(got), err)
		}
	}
	// Overwrite a large value with a small one and back.
	for _, n := range []int{10, 600 << 10, 5} {
		v := value(uint64(n), n)
		if err := c.Put(ctx, "k09", v, cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Get(ctx, "k09"); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("after overwrite with %d bytes: %d bytes, %v", n, len(got), err)
		}
	}
	keys, err := c.List(ctx, "k0", 0)
	if err != nil || len(keys) != len(sizes) || keys[0] != "k00" {
		t.Fatalf("list: %v, %v", keys, err)
	}
	if err := c.Delete(ctx, "k03"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "k03"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("get after delete: %v, want ErrNotFound", err)
	}
	if err := c.Delete(ctx, "k03"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("second delete: %v, want ErrNotFound", err)
	}
	st, err := c.Stats(ctx)
	// The miss and the delete of a missing key are answers, not errors.
	if err != nil || st.Keys != uint64(len(sizes)-1) || st.Puts != uint64(len(sizes)+3) || st.Misses != 1 || st.Errors != 0 {
		t.Fatalf("stats %+v, %v", st, err)
	}
}

// TestSmallBlocks: blocks smaller than InlineMax hold inline values in
// several pieces, each with its own header; values of every size read
// back whole, by Get and by ReadAt, also after a restart.
func TestSmallBlocks(t *testing.T) {
	dir := t.TempDir()
	sizes := []int{0, 1, 4096 - cache.HeaderLen, 4096 - cache.HeaderLen + 1, 10 << 10, cache.InlineMax, cache.InlineMax + 1, 100 << 10}
	for round := range 2 { // the second after a restart
		addr, _, stop := startServer(t, cache.ServerOptions{Dir: dir, BlockSize: 4096})
		c := dial(t, addr, cache.ClientOptions{})
		ctx := ctxT(t)
		dst, err := c.PD().Register(make([]byte, 100<<10), gowarp.LocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range sizes {
			key := fmt.Sprintf("s%02d", i)
			v := value(uint64(i+7), n)
			if round == 0 {
				if err := c.Put(ctx, key, v, cache.PutOptions{Durable: i%2 == 0}); err != nil {
					t.Fatalf("put %d bytes: %v", n, err)
				}
			}
			if got, err := c.Get(ctx, key); err != nil || !bytes.Equal(got, v) {
				t.Fatalf("round %d: get %d bytes: %d bytes, %v", round, n, len(got), err)
			}
			if n == 0 {
				continue
			}
			clear(dst.Bytes())
			if k, err := c.ReadAt(ctx, key, dst, 0, n, 0); err != nil || k != n || !bytes.Equal(dst.Bytes()[:n], v) {
				t.Fatalf("round %d: ReadAt %d bytes: %d, %v", round, n, k, err)
			}
		}
		c.Close()
		stop()
	}
}

// TestReadAtWriteAt: zero-copy reads of ranges and a write from a
// registered buffer.
func TestReadAtWriteAt(t *testing.T) {
	addr, _, _ := startServer(t, cache.ServerOptions{BlockSize: 64 << 10})
	c := dial(t, addr, cache.ClientOptions{})
	ctx := ctxT(t)
	v := value(1, 300<<10)
	src, err := c.PD().Register(append([]byte(nil), v...), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteAt(ctx, "big", src, 0, len(v), cache.PutOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	dst, err := c.PD().Register(make([]byte, len(v)+100), gowarp.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ off, n int }{{0, len(v)}, {1, 10}, {64<<10 - 40, 100}, {len(v) - 5, 5}, {100, 200 << 10}} {
		clear(dst.Bytes())
		n, err := c.ReadAt(ctx, "big", dst, 7, r.n, int64(r.off))
		if err != nil || n != r.n || !bytes.Equal(dst.Bytes()[7:7+n], v[r.off:r.off+r.n]) {
			t.Fatalf("ReadAt(%d, %d): %d, %v", r.off, r.n, n, err)
		}
	}
	if n, err := c.ReadAt(ctx, "big", dst, 0, 100, int64(len(v)-10)); n != 10 || err != io.EOF {
		t.Fatalf("ReadAt past the end: %d, %v", n, err)
	}
	if _, err := c.ReadAt(ctx, "none", dst, 0, 10, 0); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("ReadAt of a missing key: %v", err)
	}
}

// TestServerGone: once the server is gone, every call fails at once with
// ErrUnavailable (whether it meets the lost connection or the refused
// dial after it), and so does a new Dial; none waits for its context.
// Calls right after a failed dial do not dial again (which built a whole
// connection, 873 KB, per call), and once the server is back on its
// address the client reaches it again.
func TestServerGone(t *testing.T) {
	o := cache.ServerOptions{BlockSize: 128 << 10, Dir: t.TempDir(), Logger: quiet}
	addr, _, stop := startServer(t, o)
	c := dial(t, addr, cache.ClientOptions{Conns: 2})
	ctx := ctxT(t)
	if err := c.Put(ctx, "k", value(1, 5000), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	dst, err := c.PD().Register(make([]byte, 5000), gowarp.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	calls := map[string]func(context.Context) error{
		"Get":    func(ctx context.Context) error { _, err := c.Get(ctx, "k"); return err },
		"Put":    func(ctx context.Context) error { return c.Put(ctx, "k", value(2, 100), cache.PutOptions{}) },
		"Delete": func(ctx context.Context) error { return c.Delete(ctx, "k") },
		"Lookup": func(ctx context.Context) error { _, err := c.Lookup(ctx, "k"); return err },
		"ReadAt": func(ctx context.Context) error { _, err := c.ReadAt(ctx, "k", dst, 0, 5000, 0); return err },
		"Dial": func(ctx context.Context) error {
			c2, err := cache.Dial(ctx, addr, cache.ClientOptions{Logger: quiet, Device: gowarp.Open(gowarp.WithLogger(quiet))})
			if err == nil {
				c2.Close()
			}
			return err
		},
	}
	for round := range 2 {
		for name, call := range calls {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			err := call(cctx)
			cancel()
			if !errors.Is(err, cache.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("round %d: %s with the server gone: %v", round, name, err)
			}
		}
	}
	// Within the redial backoff (50 ms at first): no dial, so next to no
	// memory; a dial allocates a connection's buffers (873 KB).
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range 20 {
		c.Get(ctx, "k")
	}
	runtime.ReadMemStats(&m1)
	if per := (m1.TotalAlloc - m0.TotalAlloc) / 20; per > 16<<10 {
		t.Errorf("a call to a server found down allocates %d bytes", per)
	}

	startServerAt(t, o, addr)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := c.Get(ctx, "k")
		if err == nil {
			if !bytes.Equal(got, value(1, 5000)) {
				t.Fatalf("value after the server came back: %d bytes", len(got))
			}
			break
		}
		if !errors.Is(err, cache.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("Get once the server is back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
