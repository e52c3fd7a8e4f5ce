//go:build unix

package engine

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// TestCRCGuardedTruncated: the transmit path's CRC over a file region
// whose file was cut under it recovers the fault (SIGBUS without the
// guard) instead of killing the process; over pages that are there it is
// the plain CRC.
func TestCRCGuardedTruncated(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(make([]byte, 64<<10))
	tb := mem.NewTable()
	r, err := tb.RegisterFile(1, f, 0, 0, mem.RemoteRead, mem.Plain, mem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Deregister(r)
	iov := r.Slices(nil, 0, 64<<10)
	if got, want := crcGuarded(7, iov), wire.UpdateCRC32c(7, r.Bytes()); got != want {
		t.Fatalf("CRC %#x, want %#x", got, want)
	}
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	crcGuarded(7, iov) // must return
}
