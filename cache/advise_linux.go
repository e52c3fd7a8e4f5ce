package cache

import (
	"os"

	"golang.org/x/sys/unix"
)

// dropFileCache drops a block file's clean pages from the page cache, so
// a paged-out block costs no memory until a Read faults it back in.
func dropFileCache(f *os.File, n int64) {
	_ = unix.Fadvise(int(f.Fd()), 0, n, unix.FADV_DONTNEED)
}
