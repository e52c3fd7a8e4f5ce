//go:build unix

package mem

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrFileRange is a file range that is not inside the file: past its end
// at registration, or cut off by a truncation since.
var ErrFileRange = errors.New("gowarp: range is not inside the file")

// fileMap is the shared, read-write mapping of a file range that backs a
// region. The mapping starts on a page boundary; data is the region's
// part of it.
type fileMap struct {
	f      *os.File // a duplicate of the caller's descriptor, for the size checks
	fd     int      // f's descriptor, open until unmap
	off    int64    // the file offset of the region's first byte
	mapped []byte
	data   []byte
	once   sync.Once
	err    error
}

var pageSize = int64(os.Getpagesize())

// RegisterFile maps length bytes of f from offset off (shared, read and
// write: f must be open for both) and registers the mapping as a region of
// protection domain pd. A length of zero means up to the file's end. The
// range must lie inside the file: a range past its end is ErrFileRange.
// Deregister unmaps it. The semantics of the STag's own key is sem.
func (t *Table) RegisterFile(pd uint32, f *os.File, off, length int64, access Access, sem Semantics, o Options) (*Region, error) {
	if access&^(LocalWrite|RemoteRead|RemoteWrite|RemoteInvalidate) != 0 {
		return nil, fmt.Errorf("%w: %#x", ErrBadAccess, uint8(access))
	}
	if sem >= numSemantics {
		return nil, fmt.Errorf("%w: %d", ErrBadSemantics, uint8(sem))
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("gowarp: register file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("gowarp: register file: %s is not a regular file", f.Name())
	}
	size := st.Size()
	if length == 0 {
		length = size - off
	}
	switch {
	case off < 0 || length < 0 || off > size || length > size-off:
		return nil, fmt.Errorf("%w: %d bytes at offset %d of %s, %d bytes long", ErrFileRange, length, off, f.Name(), size)
	case length == 0:
		return nil, ErrEmpty
	case int64(int(length)) != length:
		return nil, fmt.Errorf("%w: %d bytes", ErrAddrWrap, length)
	}
	fm, err := mapFile(f, off, length)
	if err != nil {
		return nil, err
	}
	r := &Region{pd: pd, access: access, table: t, file: fm, sem: sem}
	if err := t.insert(r, [][]byte{fm.data}, o); err != nil {
		fm.unmap()
		return nil, err
	}
	return r, nil
}

// mapFile maps length bytes of f from offset off, shared and read-write,
// keeping a duplicate of f's descriptor.
func mapFile(f *os.File, off, length int64) (*fileMap, error) {
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		return nil, fmt.Errorf("gowarp: register file: %w", err)
	}
	dup := os.NewFile(uintptr(fd), f.Name())
	skip := off % pageSize
	mapped, err := unix.Mmap(fd, off-skip, int(skip+length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	runtime.KeepAlive(f)
	if err != nil {
		dup.Close()
		return nil, fmt.Errorf("gowarp: register file: mmap %s: %w", f.Name(), err)
	}
	return &fileMap{f: dup, fd: fd, off: off, mapped: mapped, data: mapped[skip : skip+length : skip+length]}, nil
}

// fileOrigin returns the name and offset of the file range a file region
// maps.
func (r *Region) fileOrigin() (string, int64) { return r.file.f.Name(), r.file.off }

// unmap releases the mapping and the descriptor; it runs once.
func (m *fileMap) unmap() error {
	m.once.Do(func() {
		if err := unix.Munmap(m.mapped); err != nil {
			m.err = fmt.Errorf("gowarp: munmap: %w", err)
		}
		m.f.Close()
		m.mapped, m.data = nil, nil
	})
	return m.err
}

// File reports whether the region is a file's mapping (RegisterFile).
func (r *Region) File() bool { return r.file != nil }

// pageRange returns the page-aligned part of the mapping that covers
// [off, off+n) of the region.
func (m *fileMap) pageRange(off, n uint64) []byte {
	start := uint64(len(m.mapped)-len(m.data)) + off
	end := start + n
	start -= start % uint64(pageSize)
	return m.mapped[start:end]
}

// Sync writes [off, off+n) of a file-backed region, offsets from the
// region's start, to the file's stable storage and waits until it is
// there (msync MS_SYNC of the pages the range touches). The caller holds
// the region (a hold or a pin). It does nothing for a memory region.
func (r *Region) Sync(off, n uint64) error {
	if r.file == nil || n == 0 {
		return nil
	}
	if err := unix.Msync(r.file.pageRange(off, n), unix.MS_SYNC); err != nil {
		return fmt.Errorf("gowarp: msync: %w", err)
	}
	return nil
}

// Prefetch asks the kernel to read [off, off+n) of a file-backed region
// into the page cache now, all of it at once (MADV_WILLNEED), without
// waiting for it. It does nothing for a memory region.
func (r *Region) Prefetch(off, n uint64) {
	if r.file == nil || n == 0 {
		return
	}
	_ = unix.Madvise(r.file.pageRange(off, n), unix.MADV_WILLNEED) // advice only
}

// CheckFile reports whether [off, off+n) of a file-backed region is still
// inside its file: a truncation since registration may have cut it off,
// and touching the pages past the file's end would raise SIGBUS. A memory
// region always passes.
func (r *Region) CheckFile(off, n uint64) bool {
	room, ok := r.FileRoom()
	return !ok || room >= off && room-off >= n
}

// FileRoom returns how many bytes of a file-backed region, from its
// start, its file holds now (one fstat), and true; false for a memory
// region. A caller checking several ranges at once (the receive path,
// the Reads of one read from the socket) stats once for all.
func (r *Region) FileRoom() (uint64, bool) {
	if r.file == nil {
		return 0, false
	}
	var st unix.Stat_t // not f.Stat, which allocates
	if err := unix.Fstat(r.file.fd, &st); err != nil || st.Size < r.file.off {
		return 0, true
	}
	return uint64(st.Size - r.file.off), true
}
