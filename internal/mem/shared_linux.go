//go:build linux

package mem

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// RegisterShared registers n bytes of new, zeroed memory that a
// same-host peer can map: a memfd sealed against shrinking (so that the
// peer's mapping can never fault), mapped shared. Deregister unmaps it
// and closes the memfd.
func (t *Table) RegisterShared(pd uint32, n int, access Access, o Options) (*Region, error) {
	if n <= 0 {
		return nil, ErrEmpty
	}
	fd, err := unix.MemfdCreate("gowarp-mr", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("gowarp: register shared: memfd_create: %w", err)
	}
	fail := func(what string, err error) (*Region, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("gowarp: register shared: %s: %w", what, err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("seal", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail("fstat", err)
	}
	m, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	r, err := t.registerMapping(pd, &Shared{ID: sharedIDs.Add(1), PID: os.Getpid(), FD: fd, Ino: st.Ino, Size: n, mem: m}, access, o)
	if err != nil {
		return nil, err
	}
	addShared(r.shared)
	return r, nil
}

// registerMapping registers sh's mapping as a region, which then owns it:
// Deregister unmaps it and closes its memfd, if any (free). If the
// registration fails, both go at once.
func (t *Table) registerMapping(pd uint32, sh *Shared, access Access, o Options) (*Region, error) {
	r, err := t.Register(pd, [][]byte{sh.mem}, access, o)
	if err != nil {
		unix.Munmap(sh.mem)
		if sh.FD >= 0 {
			unix.Close(sh.FD)
		}
		return nil, err
	}
	r.shared = sh // set before the caller has r: only its Deregister reads it
	return r, nil
}

// free unmaps the segment and closes its memfd: the region is gone.
func (s *Shared) free() error {
	if s.FD >= 0 { // not RegisterAnon's
		removeShared(s)
		unix.Close(s.FD)
	}
	err := unix.Munmap(s.mem)
	if err != nil {
		return fmt.Errorf("gowarp: munmap: %w", err)
	}
	return nil
}

// RegisterAnon registers n bytes of new, zeroed memory mapped privately
// from the kernel, outside the Go heap: its pages cost nothing until
// touched, the garbage collector neither counts nor scans them, and
// Deregister gives them back at once. Buffers that are mostly never
// touched (a session's receive slots) belong here: from the heap, the
// next owner of freed memory zeroes, so touches, all of it, and the
// runtime counts it whole against GOMEMLIMIT. Once Deregister has
// returned nil the memory must not be touched again.
func (t *Table) RegisterAnon(pd uint32, n int, access Access, o Options) (*Region, error) {
	if n <= 0 {
		return nil, ErrEmpty
	}
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("gowarp: register: mmap: %w", err)
	}
	// Never listed (addShared): no peer maps it.
	return t.registerMapping(pd, &Shared{FD: -1, Size: n, mem: m}, access, o)
}
