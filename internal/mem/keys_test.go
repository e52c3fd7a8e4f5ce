//go:build unix

package mem

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestExposeLookup: a region's further keys find it, each with its
// semantics; keys it does not have, revoked ones and an invalidated
// region do not; semantics a memory region cannot have are refused.
func TestExposeLookup(t *testing.T) {
	tb := NewTable()
	r, err := tb.Register(1, [][]byte{make([]byte, 4096)}, RemoteWrite, Options{Key: 0x10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Expose(Durable, 0, false); !errors.Is(err, ErrNotFile) {
		t.Fatalf("durable key of memory: %v", err)
	}
	if _, err := r.Expose(numSemantics, 0, false); !errors.Is(err, ErrBadSemantics) {
		t.Fatalf("bad semantics: %v", err)
	}
	s2, err := r.Expose(Plain, 0x20, true)
	if err != nil || s2.Index() != r.STag().Index() || s2.Key() != 0x20 {
		t.Fatalf("Expose: %v %v", s2, err)
	}
	if _, err := r.Expose(Plain, 0x10, true); !errors.Is(err, ErrKeyInUse) {
		t.Fatalf("own key again: %v", err)
	}
	for _, s := range []STag{r.STag(), s2} {
		if got, why := tb.Lookup(s); got != r || why != OK {
			t.Fatalf("Lookup(%v) = %v, %v", s, got, why)
		}
	}
	other := STag(r.STag().Index()<<8 | 0x30)
	if _, why := tb.Lookup(other); why != InvalidSTag {
		t.Fatalf("key never exposed: %v", why)
	}
	// Fill every key: the 256th Expose fails.
	n := 2
	for ; ; n++ {
		if _, err := r.Expose(Plain, 0, false); err != nil {
			if !errors.Is(err, ErrNoKeys) || n != 256 {
				t.Fatalf("after %d keys: %v", n, err)
			}
			break
		}
	}
	if err := r.Revoke(s2); err != nil {
		t.Fatal(err)
	}
	if _, why := tb.Lookup(s2); why != InvalidSTag {
		t.Fatalf("revoked key: %v", why)
	}
	if err := r.Revoke(r.STag()); err == nil {
		t.Fatal("revoked the region's own key")
	}
	if err := tb.Deregister(r); err != nil {
		t.Fatal(err)
	}
	if _, why := tb.Lookup(other); why != InvalidSTag {
		t.Fatalf("deregistered: %v", why)
	}
	if _, err := r.Expose(Plain, 0, false); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Expose after Deregister: %v", err)
	}
}

// TestFileRegion: RegisterFile maps the range (offsets off a page
// boundary included), checks it against the file, and Deregister unmaps.
func TestFileRegionMap(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := make([]byte, 3*pageSize)
	for i := range data {
		data[i] = byte(i / 7)
	}
	f.Write(data)
	tb := NewTable()
	r, err := tb.RegisterFile(1, f, 100, 2*pageSize, RemoteRead, ReadThrough, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.File() || string(r.Bytes()) != string(data[100:100+2*pageSize]) {
		t.Fatal("the mapping does not show the file")
	}
	if sem, ok := r.Semantics(r.STag().Key()); !ok || sem != ReadThrough {
		t.Fatalf("own key's semantics %v %v", sem, ok)
	}
	r.Bytes()[5] = 0x77
	if err := r.Sync(0, 10); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	f.ReadAt(b, 105)
	if b[0] != 0x77 {
		t.Fatal("a store into the mapping is not in the file")
	}
	if !r.CheckFile(0, uint64(2*pageSize)) {
		t.Fatal("CheckFile of the whole range failed")
	}
	f.Truncate(pageSize)
	if r.CheckFile(0, uint64(2*pageSize)) || !r.CheckFile(0, uint64(pageSize-100)) {
		t.Fatal("CheckFile does not see the truncation")
	}
	if _, err := tb.RegisterFile(1, f, 0, pageSize+1, RemoteRead, Plain, Options{}); !errors.Is(err, ErrFileRange) {
		t.Fatalf("past the end: %v", err)
	}
	if err := tb.Deregister(r); err != nil {
		t.Fatal(err)
	}
	if r.file.mapped != nil {
		t.Fatal("not unmapped")
	}
}
