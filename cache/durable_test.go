package cache_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
	"github.com/gowarp/gowarp/internal/testwatch"
)

// TestRestart: a server closed and opened again on its data directory
// has every value, and registers the blocks under the STags they had: an
// entry looked up before the restart reads the same bytes after it.
func TestRestart(t *testing.T) {
	dir := t.TempDir()
	o := cache.ServerOptions{Dir: dir, BlockSize: 128 << 10}
	addr, _, stop := startServer(t, o)
	c := dial(t, addr, cache.ClientOptions{})
	ctx := ctxT(t)
	vals := map[string][]byte{}
	for i := range 40 {
		k := fmt.Sprintf("v%d", i)
		vals[k] = value(uint64(i), []int{10, 5000, 40 << 10, 300 << 10}[i%4])
		if err := c.Put(ctx, k, vals[k], cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Delete(ctx, "v4"); err != nil {
		t.Fatal(err)
	}
	delete(vals, "v4")
	e, err := c.Lookup(ctx, "v3")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	stop()

	addr, _, _ = startServer(t, o)
	c = dial(t, addr, cache.ClientOptions{})
	for k, v := range vals {
		got, err := c.Get(ctx, k)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("%s after restart: %d bytes, %v", k, len(got), err)
		}
	}
	if _, err := c.Get(ctx, "v4"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("deleted key after restart: %v", err)
	}
	dst, _ := c.PD().Register(make([]byte, e.Size), gowarp.LocalWrite)
	if n, err := c.ReadEntry(ctx, e, dst, 0, int(e.Size), 0); err != nil || !bytes.Equal(dst.Bytes()[:n], vals["v3"]) {
		t.Fatalf("entry from before the restart: %d bytes, %v", n, err)
	}
	e2, err := c.Lookup(ctx, "v3")
	if err != nil || fmt.Sprint(e2.Addrs) != fmt.Sprint(e.Addrs) {
		t.Fatalf("addresses after restart %v, before %v (%v)", e2.Addrs, e.Addrs, err)
	}
}

// The helper process: with GOWARP_CACHE_HELPER set to a data directory,
// the test binary serves it on a loopback port, prints the address, and
// runs until killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("GOWARP_CACHE_HELPER"); dir != "" {
		srv, err := cache.NewServer(cache.ServerOptions{Dir: dir, BlockSize: 256 << 10, Logger: quiet, Device: gowarp.Open(gowarp.WithLogger(quiet))})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		ln, err := srv.Listen("127.0.0.1:0")
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("addr", ln.Addr())
		srv.Serve(context.Background(), ln)
		os.Exit(0)
	}
	os.Exit(testwatch.Run(m))
}

// helper starts the server as a process of its own on dir.
func helper(t *testing.T, dir string) (addr string, cmd *exec.Cmd) {
	t.Helper()
	cmd = exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GOWARP_CACHE_HELPER="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "addr ") {
		t.Fatalf("helper said %q (%v)", line, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "addr ")), cmd
}

// TestKillAfterDurablePut: the server is a process of its own, killed
// with SIGKILL the moment durable puts (inline and by RDMA Write) are
// acknowledged; a new server on the same directory has them all, and
// the values put before them.
func TestKillAfterDurablePut(t *testing.T) {
	dir := t.TempDir()
	addr, cmd := helper(t, dir)
	c := dial(t, addr, cache.ClientOptions{})
	ctx := ctxT(t)
	vals := map[string][]byte{}
	for i := range 12 {
		k := fmt.Sprintf("d%d", i)
		vals[k] = value(uint64(100+i), []int{100, 4096, 100 << 10, 700 << 10}[i%4])
		if err := c.Put(ctx, k, vals[k], cache.PutOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	c.Close()

	addr, _ = helper(t, dir)
	c = dial(t, addr, cache.ClientOptions{})
	for k, v := range vals {
		got, err := c.Get(ctx, k)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("%s after kill -9: %d bytes, %v", k, len(got), err)
		}
	}
}

// TestKillMidPut: a server killed while a client writes a large value
// (the RDMA Writes under way, no commit) comes back with every committed
// value and without the half-written one.
func TestKillMidPut(t *testing.T) {
	dir := t.TempDir()
	addr, cmd := helper(t, dir)
	c := dial(t, addr, cache.ClientOptions{})
	ctx := ctxT(t)
	keep := value(5, 50<<10)
	if err := c.Put(ctx, "keep", keep, cache.PutOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		big := value(6, 8<<20)
		errc <- c.Put(ctx, "half", big, cache.PutOptions{Progress: func(done, total int64) {
			if done > 0 && done < total {
				cmd.Process.Signal(syscall.SIGKILL)
			}
		}})
	}()
	select {
	case err := <-errc:
		if err == nil {
			t.Log("the put finished before the kill landed")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("put did not return after the server was killed")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	c.Close()
	addr, _ = helper(t, dir)
	c = dial(t, addr, cache.ClientOptions{})
	if got, err := c.Get(ctx, "keep"); err != nil || !bytes.Equal(got, keep) {
		t.Fatalf("keep: %d bytes, %v", len(got), err)
	}
	if got, err := c.Get(ctx, "half"); err == nil && !bytes.Equal(got, value(6, 8<<20)) {
		t.Fatal("half-written value served with other bytes")
	}
}

// TestSums: a lookup reports each value's CRC32c, inline, written by
// RDMA in one piece or in several, and after a restart; a sum whose
// generation is not its record's (left by a server before sums, which
// replaced the value without one) is not reported.
func TestSums(t *testing.T) {
	dir := t.TempDir()
	o := cache.ServerOptions{Dir: dir, BlockSize: 128 << 10}
	addr, _, stop := startServer(t, o)
	c := dial(t, addr, cache.ClientOptions{})
	ctx := ctxT(t)
	sizes := []int{10, 5000, 40 << 10, 300 << 10}
	check := func(when string, skip string) {
		t.Helper()
		for i, n := range sizes {
			k := fmt.Sprintf("s%d", i)
			e, err := c.Lookup(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			want := crc32.Checksum(value(uint64(i), n), crc32.MakeTable(crc32.Castagnoli))
			if k == skip {
				if e.HasSum {
					t.Errorf("%s: %s reports sum %#x of another generation", when, k, e.Sum)
				}
			} else if !e.HasSum || e.Sum != want {
				t.Errorf("%s: %s of %d bytes: sum %#x (%v), want %#x", when, k, n, e.Sum, e.HasSum, want)
			}
		}
	}
	for i, n := range sizes {
		if err := c.Put(ctx, fmt.Sprintf("s%d", i), value(uint64(i), n), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	check("after put", "")
	c.Close()
	stop()

	addr, _, stop = startServer(t, o)
	c = dial(t, addr, cache.ClientOptions{})
	check("after restart", "")
	c.Close()
	stop()

	db, err := bolt.Open(filepath.Join(dir, "index.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("sums"))
		v := bytes.Clone(b.Get([]byte("s1")))
		if len(v) != 12 {
			return fmt.Errorf("sum of s1: %x", v)
		}
		v[7]++ // another generation
		return b.Put([]byte("s1"), v)
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	addr, _, _ = startServer(t, o)
	c = dial(t, addr, cache.ClientOptions{})
	check("with a sum of another generation", "s1")
}

// TestDirInUse: a second server on a data directory another one serves
// fails at once, saying so, rather than waiting for the index's lock.
func TestDirInUse(t *testing.T) {
	dir := t.TempDir()
	a, err := cache.NewServer(cache.ServerOptions{Dir: dir, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := cache.NewServer(cache.ServerOptions{Dir: dir, Logger: quiet})
	if err == nil {
		b.Close()
		t.Fatal("a second server on one data directory started")
	}
	if !errors.Is(err, cache.ErrServer) || !strings.Contains(err.Error(), "in use by another cache server") {
		t.Fatalf("second server: %v", err)
	}
}
