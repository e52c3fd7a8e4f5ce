//go:build unix

package cache

import (
	"os"

	"golang.org/x/sys/unix"
)

// willNeed asks the kernel to read a block's pages ahead of the Reads
// that will fault them in. Advice only: an error changes nothing.
func willNeed(b []byte) { _ = unix.Madvise(b, unix.MADV_WILLNEED) }

// dropPages gives back the memory of a paged-out block whose pages are
// clean: its mapping's pages, then the file's page cache.
func dropPages(mem []byte, f *os.File, n int64) {
	_ = unix.Madvise(mem, unix.MADV_DONTNEED)
	dropFileCache(f, n)
}
