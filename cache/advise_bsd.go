//go:build unix && !linux

package cache

import "os"

// dropFileCache does nothing here: posix_fadvise is Linux's in x/sys, and
// the kernel reclaims a file's clean pages under pressure anyway.
func dropFileCache(f *os.File, n int64) {}
