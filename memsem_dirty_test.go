//go:build linux

package gowarp_test

import (
	"encoding/binary"
	"os"
	"testing"
	"unsafe"

	"github.com/gowarp/gowarp"
)

// dirtyPages counts the pages of b (a file mapping) that the kernel holds
// dirty: written, and not yet written back to the file's storage. It
// reads the page frames from /proc/self/pagemap and their flags from
// /proc/kpageflags (KPF_DIRTY), which needs root; ok is false without.
func dirtyPages(b []byte) (dirty int, ok bool) {
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return 0, false
	}
	defer pm.Close()
	kf, err := os.Open("/proc/kpageflags")
	if err != nil {
		return 0, false
	}
	defer kf.Close()
	ps := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(&b[0])) &^ (ps - 1)
	end := uintptr(unsafe.Pointer(&b[len(b)-1]))
	var e [8]byte
	for va := start; va <= end; va += ps {
		if _, err := pm.ReadAt(e[:], int64(va/ps*8)); err != nil {
			return 0, false
		}
		v := binary.LittleEndian.Uint64(e[:])
		pfn := v & (1<<55 - 1)
		if v&(1<<63) == 0 {
			continue // not in memory: not dirty either
		}
		if pfn == 0 {
			return 0, false // frame numbers hidden: not root
		}
		if _, err := kf.ReadAt(e[:], int64(pfn*8)); err != nil {
			return 0, false
		}
		if binary.LittleEndian.Uint64(e[:])&(1<<4) != 0 { // KPF_DIRTY
			dirty++
		}
	}
	return dirty, true
}

// TestDurableReachesStorage: a Write through a durable key, and a Write
// followed by a persistence flush, leave no dirty page behind when the
// requester's completion comes (the msync ran, and before the answer); a
// plain Write followed by a visibility flush leaves its pages dirty,
// which shows that the test can see the difference. A kill of the
// process cannot show it (the page cache survives: see
// memsem_kill_test.go); the pages' dirty flags can.
func TestDurableReachesStorage(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	const size = 64 << 10
	f := newFile(t, 4*size) // on t.TempDir: a disk here (tmpfs pages never come clean)
	fmr, err := p.pd.RegisterFile(f, 0, 0, gowarp.RemoteWrite, gowarp.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	durable, err := fmr.Expose(gowarp.Durable)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil { // the file's first contents: clean
		t.Fatal(err)
	}
	src, sbuf := p.reg(t, size, gowarp.LocalWrite)
	copy(sbuf, pattern(size, 5))
	write := func(i int, key gowarp.STag, typ gowarp.FlushType, whole bool) int {
		post(t, p, &gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: fmr.Addr() + uint64(i*size), RKey: gowarp.STag(uint32(key))})
		fl := gowarp.FlushWR{Type: typ, RKey: fmr.STag(), RemoteAddr: fmr.Addr() + uint64(i*size), Length: size}
		if whole {
			fl.RemoteAddr, fl.Length = 0, 0
		}
		if c := flush(t, p, &fl); c.Err() != nil {
			t.Fatal(c.Err())
		}
		d, ok := dirtyPages(fmr.Bytes()[i*size : (i+1)*size])
		if !ok {
			t.Skip("page flags unreadable (needs root and /proc/kpageflags)")
		}
		return d
	}
	if d := write(0, fmr.STag(), gowarp.FlushVisibility, false); d == 0 {
		t.Skip("a plain Write left no dirty page: written back already, the test cannot tell")
	} else {
		t.Logf("plain Write, visibility flush: %d of %d pages dirty", d, size/4096)
	}
	if d := write(1, durable, gowarp.FlushVisibility, false); d != 0 {
		t.Errorf("Write through a durable key: %d pages still dirty", d)
	}
	if d := write(2, fmr.STag(), gowarp.FlushPersistence, false); d != 0 {
		t.Errorf("plain Write, persistence flush of its range: %d pages still dirty", d)
	}
	if d := write(3, fmr.STag(), gowarp.FlushPersistence, true); d != 0 {
		t.Errorf("plain Write, persistence flush of the whole region: %d pages still dirty", d)
	}
}
