//go:build !unix

package cache

import "os"

// No memory advice on this system (and no file-backed registration: the
// store cannot open here: RegisterFile returns errors.ErrUnsupported).
func willNeed(b []byte)                         {}
func dropPages(mem []byte, f *os.File, n int64) {}
