package cm

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// shmDir is where the shared files live: tmpfs, this host's only.
var shmDir = "/dev/shm"

// shmOffer is an initiator's file, created and mapped, and the block
// that offers it.
type shmOffer struct {
	blk  shmBlock
	path string
	m    *SharedMemory
}

// shmStaleAge is how old a file of a process that is gone must be for
// sweepShm to remove it, and shmSweepEvery how often a process sweeps.
// A file lives for one MPA exchange, milliseconds; the age keeps a live
// process of another PID namespace sharing the directory, whose ID means
// nothing here, safe while it connects.
const (
	shmStaleAge   = time.Minute
	shmSweepEvery = time.Minute
)

// shmSwept is when this process last swept (Unix nanoseconds).
var shmSwept atomic.Int64

// sweepShm removes this user's gowarp files in shmDir left by processes
// that are gone: one killed between creating its file and the
// responder's mapping it (which unlinks it) leaves it behind. A file is
// stale when the process its name names (the ID in hex after the prefix)
// no longer exists and it was last changed more than shmStaleAge before
// now. It returns how many it removed.
func sweepShm(now time.Time) int {
	dir, err := os.ReadDir(shmDir)
	if err != nil {
		return 0
	}
	removed := 0
	for _, e := range dir {
		name := e.Name()
		if !validShmName(name) || len(name) < len(shmNamePrefix)+8 || !e.Type().IsRegular() {
			continue
		}
		pid, err := strconv.ParseUint(name[len(shmNamePrefix):len(shmNamePrefix)+8], 16, 31)
		if err != nil || pid == 0 || unix.Kill(int(pid), 0) != unix.ESRCH {
			continue // alive (or another user's, EPERM), or not a process ID
		}
		path := shmDir + "/" + name
		var st unix.Stat_t
		if unix.Lstat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() ||
			now.Sub(time.Unix(st.Mtim.Unix())) < shmStaleAge {
			continue
		}
		if unix.Unlink(path) == nil {
			removed++
		}
	}
	return removed
}

// createShm creates, sizes and maps a file for rings of ring bytes and
// writes its header with a random token; first, at most once every
// shmSweepEvery, it sweeps the files of processes that are gone.
func createShm(ring int) (*shmOffer, error) {
	if now := time.Now(); now.UnixNano()-shmSwept.Load() >= int64(shmSweepEvery) {
		shmSwept.Store(now.UnixNano())
		sweepShm(now)
	}
	var id [8]byte
	o := &shmOffer{blk: shmBlock{Ring: uint32(ring)}}
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	if _, err := rand.Read(o.blk.Token[:]); err != nil {
		return nil, err
	}
	// The process's ID in the name tells whose a file is.
	o.blk.Name = fmt.Sprintf("%s%08x%s", shmNamePrefix, os.Getpid(), hex.EncodeToString(id[:]))
	o.path = shmDir + "/" + o.blk.Name
	fd, err := unix.Open(o.path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "create", Path: o.path, Err: err}
	}
	defer unix.Close(fd)
	size := shmFileSize(ring)
	// Allocated now, not at the first touch: a full tmpfs fails here
	// with ENOSPC rather than with SIGBUS in the middle of a copy.
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		unix.Unlink(o.path)
		return nil, &os.PathError{Op: "fallocate", Path: o.path, Err: err}
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Unlink(o.path)
		return nil, &os.PathError{Op: "mmap", Path: o.path, Err: err}
	}
	copy(mem, shmFileMagic[:])
	binary.NativeEndian.PutUint32(mem[16:], uint32(ring))
	copy(mem[shmTokI:], o.blk.Token[:])
	o.m = &SharedMemory{Mem: mem, Ring: ring, Initiator: true}
	return o, nil
}

// unlink removes the file's name; the mappings stay. Both sides call it,
// the second finding it gone.
func (o *shmOffer) unlink() { unix.Unlink(o.path) }

// discard unlinks and unmaps an offer not taken.
func (o *shmOffer) discard() {
	o.unlink()
	o.m.Unmap()
}

// taken reports whether the responder's answer b names this file: its
// token is the one the responder wrote into it.
func (o *shmOffer) taken(b *shmBlock) bool {
	if b.Ring != o.blk.Ring || b.Name != "" || b.Token == ([16]byte{}) {
		return false
	}
	return bytes.Equal(o.m.Mem[shmTokR:shmTokR+16], b.Token[:])
}

// openShm is the responder's side: it opens and maps the file the offer
// names, checks it is the initiator's, writes the responder's token into
// it, unlinks it, and returns the mapping and the answer.
func openShm(offer *shmBlock) (*SharedMemory, *shmBlock, error) {
	if !validShmName(offer.Name) {
		return nil, nil, fmt.Errorf("%w: name %q", ErrShmOffer, offer.Name)
	}
	path := shmDir + "/" + offer.Name
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	ring := int(offer.Ring)
	size := shmFileSize(ring)
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, nil, fmt.Errorf("%w: %s is not a regular file", ErrShmOffer, path)
	case int(st.Uid) != os.Geteuid():
		return nil, nil, fmt.Errorf("%w: %s belongs to uid %d", ErrShmOffer, path, st.Uid)
	case st.Size != int64(size):
		return nil, nil, fmt.Errorf("%w: %s has %d bytes, the offer's rings need %d", ErrShmOffer, path, st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	m := &SharedMemory{Mem: mem, Ring: ring}
	switch {
	case !bytes.Equal(mem[:shmFileMagicSz], shmFileMagic[:]) || binary.NativeEndian.Uint32(mem[16:]) != offer.Ring:
		m.Unmap()
		return nil, nil, fmt.Errorf("%w: %s is not a gowarp link's file", ErrShmOffer, path)
	case !bytes.Equal(mem[shmTokI:shmTokI+16], offer.Token[:]) || offer.Token == ([16]byte{}):
		m.Unmap()
		return nil, nil, fmt.Errorf("%w: %s does not hold the offer's token", ErrShmOffer, path)
	}
	ans := &shmBlock{Ring: offer.Ring}
	if _, err := rand.Read(ans.Token[:]); err != nil {
		m.Unmap()
		return nil, nil, err
	}
	copy(mem[shmTokR:], ans.Token[:])
	// Both sides have it mapped now.
	if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
		m.Unmap()
		return nil, nil, &os.PathError{Op: "unlink", Path: path, Err: err}
	}
	return m, ans, nil
}

func unmapShm(mem []byte) error { return unix.Munmap(mem) }
