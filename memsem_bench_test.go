//go:build linux

package gowarp_test

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gowarp/gowarp"
)

// BenchmarkFileWrite measures a Write into a file region, each followed
// by a visibility flush so that an operation ends when the responder has
// processed it: through a plain key (placed in the page cache) and
// through a durable key (msync of the pages it touched before the flush
// is answered), and a plain Write followed by a persistence flush of its
// range. disk is the test's temporary directory (a disk here: check
// df), tmpfs /dev/shm, where msync has no device to wait for.
func BenchmarkFileWrite(b *testing.B) {
	for _, fs := range []struct{ name, dir string }{{"disk", ""}, {"tmpfs", "/dev/shm"}} {
		for _, mode := range []string{"plain", "durable", "persist-flush"} {
			for _, size := range []int{4 << 10, 1 << 20} {
				b.Run(fs.name+"/"+mode+"/"+sizeName(size), func(b *testing.B) {
					dir := fs.dir
					if dir == "" {
						dir = b.TempDir()
					} else if _, err := os.Stat(dir); err != nil {
						b.Skip(err)
					}
					f, err := os.CreateTemp(dir, "gowarp-bench")
					if err != nil {
						b.Fatal(err)
					}
					defer os.Remove(f.Name())
					defer f.Close()
					if err := f.Truncate(int64(size)); err != nil {
						b.Fatal(err)
					}
					sem := gowarp.Plain
					if mode == "durable" {
						sem = gowarp.Durable
					}
					p, fmr, key := benchFileMR(b, f, gowarp.RemoteWrite, sem)
					typ := gowarp.FlushVisibility
					if mode == "persist-flush" {
						typ = gowarp.FlushPersistence
					}
					src, sbuf := p.reg(b, size, gowarp.LocalWrite)
					wr := gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: fmr.Addr(), RKey: gowarp.STag(uint32(key))}
					fl := gowarp.FlushWR{Flags: gowarp.Signaled, Type: typ, RKey: fmr.STag(), RemoteAddr: fmr.Addr(), Length: uint64(size)}
					b.SetBytes(int64(size))
					b.ResetTimer()
					for i := range b.N {
						sbuf[0] = byte(i) // a page to write back each time
						if err := p.a.PostSend(&wr); err != nil {
							b.Fatal(err)
						}
						if err := p.a.PostFlush(&fl); err != nil {
							b.Fatal(err)
						}
						if c := wait(b, p.acq); c.Err() != nil {
							b.Fatal(c.Err())
						}
					}
				})
			}
		}
	}
}

// benchFileMR connects a pair and registers all of f on it with access
// acc; key is the region's own STag for Plain, else a key exposed with sem.
func benchFileMR(b *testing.B, f *os.File, acc gowarp.Access, sem gowarp.Semantics) (*pair, *gowarp.MR, gowarp.STag) {
	b.Helper()
	p := newPair(b, gowarp.ConnectOptions{})
	fmr, err := p.pd.RegisterFile(f, 0, 0, acc, gowarp.FileOptions{})
	if err != nil {
		b.Fatal(err)
	}
	key := fmr.STag()
	if sem != gowarp.Plain {
		if key, err = fmr.Expose(sem); err != nil {
			b.Fatal(err)
		}
	}
	return p, fmr, key
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return itoa(n>>20) + "MiB"
	}
	return itoa(n>>10) + "KiB"
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// BenchmarkFileRead measures an RDMA Read of a file region on disk
// through a plain key and through a read-through key, cold (the file's
// pages dropped from the page cache before each Read, as a cache's cold
// blocks are) and warm (resident). Through a plain key the pages of a
// cold range fault in one by one as the response is sent; through a
// read-through key the range is asked for at once (MADV_WILLNEED) before
// the response is framed.
func BenchmarkFileRead(b *testing.B) {
	for _, mode := range []string{"plain", "readthrough"} {
		for _, cold := range []bool{true, false} {
			for _, size := range []int{4 << 10, 1 << 20} {
				name := mode + "/warm/" + sizeName(size)
				if cold {
					name = mode + "/cold/" + sizeName(size)
				}
				b.Run(name, func(b *testing.B) {
					f, err := os.CreateTemp(b.TempDir(), "gowarp-bench")
					if err != nil {
						b.Fatal(err)
					}
					defer f.Close()
					if _, err := f.Write(make([]byte, size)); err != nil {
						b.Fatal(err)
					}
					if err := f.Sync(); err != nil { // clean pages can be dropped
						b.Fatal(err)
					}
					sem := gowarp.Plain
					if mode == "readthrough" {
						sem = gowarp.ReadThrough
					}
					p, fmr, key := benchFileMR(b, f, gowarp.RemoteRead, sem)
					dst, _ := p.reg(b, size, gowarp.LocalWrite)
					wr := gowarp.SendWR{Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: dst, Length: size}}, RemoteAddr: fmr.Addr(), RKey: gowarp.STag(uint32(key))}
					b.SetBytes(int64(size))
					b.ResetTimer()
					for range b.N {
						if cold {
							b.StopTimer()
							// The mapping's pages leave the page cache
							// only once unmapped from it too.
							if err := unix.Madvise(fmr.Bytes(), unix.MADV_DONTNEED); err != nil {
								b.Fatal(err)
							}
							if err := unix.Fadvise(int(f.Fd()), 0, int64(size), unix.FADV_DONTNEED); err != nil {
								b.Fatal(err)
							}
							b.StartTimer()
						}
						if err := p.a.PostSend(&wr); err != nil {
							b.Fatal(err)
						}
						if c := wait(b, p.acq); c.Err() != nil {
							b.Fatal(c.Err())
						}
					}
				})
			}
		}
	}
}
