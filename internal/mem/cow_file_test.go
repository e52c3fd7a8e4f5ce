//go:build unix

package mem

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestSnapshotFileTruncated: a file truncated under a file region with a
// snapshot open. A WriteAt past the file's new end, a placement's copy of
// a page the file lost, and a snapshot's read of such a page get
// ErrFileRange; none touches the lost pages (that raises SIGBUS, which
// kills the test). What the file still holds reads as before.
func TestSnapshotFileTruncated(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "region"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(bytes.Repeat([]byte{5}, 3*PageSize)); err != nil {
		t.Fatal(err)
	}
	r, err := NewTable().RegisterFile(1, f, 0, 3*PageSize, LocalWrite|RemoteWrite, Plain, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(PageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WriteAt([]byte{1}, 2*PageSize); !errors.Is(err, ErrFileRange) {
		t.Errorf("WriteAt past the truncated file's end: %v, want ErrFileRange", err)
	}
	if _, err := s.ReadAt(make([]byte, 10), PageSize+5); !errors.Is(err, ErrFileRange) {
		t.Errorf("snapshot read of a page the file lost: %v, want ErrFileRange", err)
	}
	// A placement into page 2 copies it for the snapshot first: the copy
	// must not touch it. (The placement itself is guarded by the engine.)
	if !r.TryHoldWrite() {
		t.Fatal("TryHoldWrite")
	}
	r.WriteSlices(nil, 2*PageSize, 10)
	r.UnholdWrite()
	if _, err := s.ReadAt(make([]byte, 10), 2*PageSize); !errors.Is(err, ErrFileRange) {
		t.Errorf("snapshot read of a page lost before its copy: %v, want ErrFileRange", err)
	}
	if _, err := r.WriteAt([]byte{9}, 10); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, PageSize)
	if _, err := s.ReadAt(b, 0); err != nil || !bytes.Equal(b, bytes.Repeat([]byte{5}, PageSize)) {
		t.Errorf("snapshot read of the page the file kept: %v", err)
	}
	s.Close()
	if err := r.Deregister(); err != nil {
		t.Fatal(err)
	}
}
