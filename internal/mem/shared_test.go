//go:build linux

package mem

import (
	"errors"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFindShared: a slice inside a shared region is found with its
// offset, one that runs past it or lies in other memory is not, a
// deregistered region is gone, and a lookup allocates nothing.
func TestFindShared(t *testing.T) {
	tbl := NewTable()
	var rs [3]*Region
	for i := range rs {
		r, err := tbl.RegisterShared(1, 64<<10, LocalWrite, Options{})
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = r
	}
	for i, r := range rs {
		b := r.Bytes()
		if s, off := FindShared(b[100:200]); s == nil || s != r.shared || off != 100 {
			t.Errorf("region %d: found %v at %d", i, s, off)
		}
		if s, _ := FindShared(b[len(b)-10:][:10:10]); s != r.shared {
			t.Errorf("region %d: its last bytes not found", i)
		}
	}
	if s, _ := FindShared(make([]byte, 100)); s != nil {
		t.Error("heap memory found shared")
	}
	if n := testing.AllocsPerRun(100, func() { FindShared(rs[1].Bytes()[5:50]) }); n != 0 {
		t.Errorf("FindShared allocates %v", n)
	}
	gone := rs[1].shared
	if err := rs[1].Deregister(); err != nil {
		t.Fatal(err)
	}
	if !gone.Dead() {
		t.Error("a deregistered segment is not dead")
	}
	for _, r := range []*Region{rs[0], rs[2]} {
		if s, _ := FindShared(r.Bytes()[:10]); s != r.shared {
			t.Error("a region still registered is not found after another went")
		}
		r.Deregister()
	}
}

// TestRegisterAnon: anonymous memory registers zeroed and writable, is
// no Go heap, refuses Deregister while pinned, and is unmapped by it.
func TestRegisterAnon(t *testing.T) {
	tbl := NewTable()
	if _, err := tbl.RegisterAnon(1, 0, LocalWrite, Options{}); err != ErrEmpty {
		t.Fatalf("0 bytes: %v, want ErrEmpty", err)
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	r, err := tbl.RegisterAnon(1, 8<<20, LocalWrite, Options{})
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&m1)
	if got := m1.TotalAlloc - m0.TotalAlloc; got > 1<<20 {
		t.Errorf("8 MiB registered took %d bytes of heap", got)
	}
	b := r.bufs[0]
	if len(b) != 8<<20 || b[0] != 0 || b[len(b)-1] != 0 {
		t.Fatalf("%d bytes, not zeroed", len(b))
	}
	b[12345] = 7
	if !mapped(b) {
		t.Fatal("madvise fails on the mapping")
	}
	if !r.TryAcquire() {
		t.Fatal("TryAcquire failed")
	}
	if err := tbl.Deregister(r); !errors.Is(err, ErrBusy) {
		t.Fatalf("Deregister while pinned: %v, want ErrBusy", err)
	}
	r.Release()
	if err := tbl.Deregister(r); err != nil {
		t.Fatal(err)
	}
	if mapped(b) {
		t.Fatal("still mapped after Deregister")
	}
}

// mapped reports whether b's first page is still mapped: madvise fails
// with ENOMEM on an unmapped range.
func mapped(b []byte) bool {
	return unix.Madvise(b[:4096], unix.MADV_NORMAL) == nil
}
