package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/etcdtest"
)

// TestCacheClusterCommands: two servers join a cluster in an etcd of the
// test's own; put, get, del and members go through it, with the flags
// before or after the arguments, and a missing key fails with exit 1 and
// a one-line error.
func TestCacheClusterCommands(t *testing.T) {
	endpoint := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	var served []chan int
	for _, id := range []string{"a", "b"} {
		done := make(chan int, 1)
		var stderr syncBuffer
		go func() {
			done <- runCache(sctx, []string{"serve", "-etcd", endpoint, "-id", id, "-addr", "127.0.0.1:0", "-dir", t.TempDir(), "-budget", "16MiB", "-ttl", "5s"}, &stderr, &stderr)
		}()
		served = append(served, done)
		for !strings.Contains(stderr.String(), "cache: serving") {
			select {
			case code := <-done:
				t.Fatalf("serve %s exited %d:\n%s", id, code, stderr.String())
			case <-time.After(10 * time.Millisecond):
			}
			if ctx.Err() != nil {
				t.Fatalf("serve %s did not start:\n%s", id, stderr.String())
			}
		}
	}
	defer func() {
		stop()
		for _, d := range served {
			<-d
		}
	}()
	etcd := "-etcd=" + endpoint
	for {
		code, out, errs := runCmd(t, ctx, "cache", "members", etcd)
		if code != exitOK {
			t.Fatalf("members: exit %d: %s", code, errs)
		}
		if strings.HasPrefix(out, "cluster default: 2 members") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("members: %q", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	dir := t.TempDir()
	val := bytes.Repeat([]byte("cluster!"), 50000)
	os.WriteFile(filepath.Join(dir, "v"), val, 0o644)
	if code, _, errs := runCmd(t, ctx, "cache", "put", "-q", "k", filepath.Join(dir, "v"), etcd); code != exitOK {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	if code, _, errs := runCmd(t, ctx, "cache", "get", etcd, "k", filepath.Join(dir, "out")); code != exitOK {
		t.Fatalf("get: exit %d: %s", code, errs)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "out")); !bytes.Equal(got, val) {
		t.Fatalf("got %d bytes back, put %d", len(got), len(val))
	}
	if code, _, errs := runCmd(t, ctx, "cache", "del", "k", etcd); code != exitOK {
		t.Fatalf("del: exit %d: %s", code, errs)
	}
	code, _, errs := runCmd(t, ctx, "cache", "get", "k", etcd)
	if code != exitFailure || !strings.HasPrefix(errs, "gowarp cache get: ") || strings.Contains(errs, "cache: cache") || strings.Count(errs, "\n") != 1 {
		t.Fatalf("get of a deleted key: exit %d, %q", code, errs)
	}
}
