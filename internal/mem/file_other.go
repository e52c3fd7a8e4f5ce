//go:build !unix

package mem

import (
	"errors"
	"os"
)

// ErrFileRange is a file range that is not inside the file.
var ErrFileRange = errors.New("gowarp: range is not inside the file")

// fileMap is never made here (mapFile fails); data keeps the import code
// that reads it building on every system.
type fileMap struct{ data []byte }

func (m *fileMap) unmap() error { return nil }

// RegisterFile is not supported on this system.
func (t *Table) RegisterFile(pd uint32, f *os.File, off, length int64, access Access, sem Semantics, o Options) (*Region, error) {
	return nil, errors.ErrUnsupported
}

// File reports whether the region is a file's mapping.
func (r *Region) File() bool { return false }

// Sync does nothing: no region is file-backed here.
func (r *Region) Sync(off, n uint64) error { return nil }

// Prefetch does nothing: no region is file-backed here.
func (r *Region) Prefetch(off, n uint64) {}

// CheckFile reports true: no region is file-backed here.
func (r *Region) CheckFile(off, n uint64) bool { return true }

// FileRoom reports false: no region is file-backed here.
func (r *Region) FileRoom() (uint64, bool) { return 0, false }

func mapFile(f *os.File, off, length int64) (*fileMap, error) { return nil, errors.ErrUnsupported }

func (r *Region) fileOrigin() (string, int64) { return "", 0 }
