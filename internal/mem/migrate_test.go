package mem

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// exportTable fills a table with regions of every kind an export carries
// (one buffer and several, further keys, a Placed count) and returns it
// with the regions.
func exportTable(t testing.TB) (*Table, []*Region) {
	t.Helper()
	tb := NewTable()
	rng := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	var regs []*Region
	for i, c := range []struct {
		bufs   [][]byte
		access Access
		pd     uint32
		addr   uint64
	}{
		{[][]byte{fill(4096)}, RemoteWrite | RemoteRead, 7, 0},
		{[][]byte{fill(100), fill(3), fill(5000)}, RemoteRead | LocalWrite, 7, 0x1000},
		{[][]byte{fill(64)}, RemoteAtomic | RemoteWrite | RemoteInvalidate, 9, 1<<64 - 128},
	} {
		r, err := tb.Register(c.pd, c.bufs, c.access, Options{Addr: c.addr})
		if err != nil {
			t.Fatal(err)
		}
		r.AddPlaced(100 * (i + 1))
		if i == 0 {
			if _, err := r.Expose(Plain, 0x42, true); err != nil && r.stag.Key() != 0x42 {
				t.Fatal(err)
			}
		}
		regs = append(regs, r)
	}
	return tb, regs
}

func export(t testing.TB, tb *Table) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := tb.Export(context.Background(), &b, "tenant t1"); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func newPDs() func() uint32 {
	n := uint32(100)
	return func() uint32 { n++; return n }
}

// TestExportImportKeepsSTags: an imported table holds every region under
// its STag, base, length, rights and keys, with its content, Placed count
// and protection domain grouping.
func TestExportImportKeepsSTags(t *testing.T) {
	src, regs := exportTable(t)
	stream := export(t, src)
	dst := NewTable()
	imp, err := dst.Import(context.Background(), bytes.NewReader(stream), newPDs(), ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if imp.Header.Identity != "tenant t1" || len(imp.PDs) != 2 || len(imp.Regions) != len(regs) || dst.Len() != len(regs) {
		t.Fatalf("imported %+v, %d regions", imp.Header, dst.Len())
	}
	pdOf := map[uint32]uint32{}
	for _, r := range regs {
		n, why := dst.Lookup(r.stag)
		if why != OK {
			t.Fatalf("%v: %v", r.stag, why)
		}
		var want, got bytes.Buffer
		for _, b := range r.bufs {
			want.Write(b)
		}
		got.Write(n.Bytes())
		switch {
		case n.base != r.base || n.length != r.length || n.access != r.access || n.Placed() != r.Placed():
			t.Errorf("%v: base %#x len %d access %v placed %d, want %#x %d %v %d", r.stag,
				n.base, n.length, n.access, n.Placed(), r.base, r.length, r.access, r.Placed())
		case !bytes.Equal(got.Bytes(), want.Bytes()):
			t.Errorf("%v: content differs", r.stag)
		}
		if p, ok := pdOf[r.pd]; ok && p != n.pd {
			t.Errorf("%v: regions of one PD split over PDs %d and %d", r.stag, p, n.pd)
		}
		pdOf[r.pd] = n.pd
		if why := n.CheckRemote(n.pd, r.access, r.base, r.length); why != OK {
			t.Errorf("%v: the whole region through its own PD: %v", r.stag, why)
		}
	}
	if pdOf[7] == pdOf[9] {
		t.Errorf("regions of two PDs share PD %d", pdOf[7])
	}
	exposed := STag(regs[0].stag.Index()<<8 | 0x42)
	if _, why := dst.Lookup(exposed); why != OK {
		t.Errorf("exposed key %v lost: %v", exposed, why)
	}
	// Exporting the import gives the same stream, but for the PD ordinals' origin.
	if again := export(t, dst); !bytes.Equal(again, stream) {
		t.Errorf("re-export differs: %d bytes, first %d", len(again), len(stream))
	}
}

// TestExportFreezes: once exported, a table refuses writes and changes
// with ErrFrozen and reads still work; Thaw resumes it.
func TestExportFreezes(t *testing.T) {
	tb, regs := exportTable(t)
	export(t, tb)
	r := regs[0]
	if !tb.Frozen() || r.TryHoldWrite() {
		t.Fatal("a write hold was granted on a frozen table")
	}
	if _, why := tb.LookupHoldWrite(r.stag); why != InvalidSTag {
		t.Errorf("remote write lookup: %v, want invalid STag", why)
	}
	if _, err := r.WriteAt([]byte{1}, 0); !errors.Is(err, ErrFrozen) {
		t.Errorf("WriteAt: %v", err)
	}
	if _, err := tb.Register(1, [][]byte{make([]byte, 8)}, RemoteRead, Options{}); !errors.Is(err, ErrFrozen) {
		t.Errorf("Register: %v", err)
	}
	if err := tb.Deregister(r); !errors.Is(err, ErrFrozen) {
		t.Errorf("Deregister: %v", err)
	}
	if why := tb.Invalidate(9, regs[2].stag); why != InvalidSTag {
		t.Errorf("Invalidate: %v", why)
	}
	if _, err := r.Expose(Plain, 0, false); !errors.Is(err, ErrFrozen) {
		t.Errorf("Expose: %v", err)
	}
	if got, why := tb.LookupHold(r.stag); why != OK {
		t.Errorf("read lookup on a frozen table: %v", why)
	} else {
		got.Unhold()
	}
	if err := tb.Freeze(context.Background()); !errors.Is(err, ErrFrozen) {
		t.Errorf("second Freeze: %v", err)
	}
	tb.Thaw()
	if _, err := r.WriteAt([]byte{1}, 0); err != nil {
		t.Errorf("WriteAt after Thaw: %v", err)
	}
	if err := tb.Deregister(r); err != nil {
		t.Errorf("Deregister after Thaw: %v", err)
	}
}

// failWriter fails every write after the first n bytes.
type failWriter struct{ n int }

func (w *failWriter) Write(b []byte) (int, error) {
	if len(b) > w.n {
		return 0, errors.New("the importing node went away")
	}
	w.n -= len(b)
	return len(b), nil
}

// TestExportFailureThaws: an export whose stream fails (the importing
// node died) thaws the table it froze, so writes go on; one of a table
// frozen already leaves it frozen.
func TestExportFailureThaws(t *testing.T) {
	tb, regs := exportTable(t)
	if _, err := tb.Export(context.Background(), &failWriter{n: 100}, ""); err == nil {
		t.Fatal("export to a failing stream succeeded")
	}
	if tb.Frozen() {
		t.Fatal("a failed export left the table frozen")
	}
	if _, err := regs[0].WriteAt([]byte{1}, 0); err != nil {
		t.Fatalf("WriteAt after a failed export: %v", err)
	}
	export(t, tb)
	if _, err := tb.Export(context.Background(), &failWriter{}, ""); err == nil || !tb.Frozen() {
		t.Fatalf("a failed second export: %v, frozen %v", err, tb.Frozen())
	}
}

// TestFreezeWaitsForWrites: a freeze waits for a write in progress, and
// gives up (thawed) when it does not end.
func TestFreezeWaitsForWrites(t *testing.T) {
	tb, regs := exportTable(t)
	if !regs[1].TryHoldWrite() {
		t.Fatal("no write hold")
	}
	old := freezeWait
	freezeWait = 20e6
	defer func() { freezeWait = old }()
	if err := tb.Freeze(context.Background()); !errors.Is(err, ErrBusy) {
		t.Fatalf("Freeze with a write held: %v", err)
	}
	if tb.Frozen() {
		t.Fatal("a failed freeze left the table frozen")
	}
	regs[1].UnholdWrite()
	if err := tb.Freeze(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestImportBadStream: every truncation and every flipped byte of a
// stream is refused with ErrBadExport, and leaves the table empty.
func TestImportBadStream(t *testing.T) {
	// A small table, so that every byte is tried: two PDs, two buffers, a key.
	src := NewTable()
	r, _ := src.Register(3, [][]byte{[]byte("abc"), []byte("defgh")}, RemoteRead, Options{})
	r.Expose(Plain, 0, false)
	src.Register(4, [][]byte{[]byte("i")}, RemoteWrite, Options{Addr: 1 << 40})
	stream := export(t, src)
	try := func(b []byte) error {
		dst := NewTable()
		_, err := dst.Import(context.Background(), bytes.NewReader(b), newPDs(), ImportOptions{})
		if err != nil && dst.Len() != 0 {
			t.Fatalf("a failed import left %d regions", dst.Len())
		}
		return err
	}
	for n := range len(stream) {
		if err := try(stream[:n]); !errors.Is(err, ErrBadExport) {
			t.Fatalf("stream cut at %d of %d: %v", n, len(stream), err)
		}
	}
	for i := range stream {
		b := bytes.Clone(stream)
		b[i] ^= 0x10
		if err := try(b); !errors.Is(err, ErrBadExport) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	// A stream of a later version, with a valid CRC.
	var h ExportHeader
	body := (&ExportHeader{Version: TableFormatVersion + 1}).Append(nil)
	rec, _ := AppendRecord(nil, recHeader, body)
	if err := try(rec); !errors.Is(err, ErrBadExport) {
		t.Errorf("version %d: %v (%v)", TableFormatVersion+1, err, h)
	}
}

// TestImportOverExistingSTag: an import whose STag index is in use
// registers nothing; a region larger than MaxBytes is refused before it
// is allocated; a frozen table takes no import.
func TestImportOverExistingSTag(t *testing.T) {
	src, regs := exportTable(t)
	stream := export(t, src)
	dst := NewTable()
	if _, err := dst.Import(context.Background(), bytes.NewReader(stream), newPDs(), ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Import(context.Background(), bytes.NewReader(stream), newPDs(), ImportOptions{}); !errors.Is(err, ErrIndexInUse) {
		t.Fatalf("second import: %v", err)
	}
	if dst.Len() != len(regs) {
		t.Fatalf("%d regions after the refused import, want %d", dst.Len(), len(regs))
	}
	if _, err := NewTable().Import(context.Background(), bytes.NewReader(stream), newPDs(), ImportOptions{MaxBytes: 1000}); !errors.Is(err, ErrImportSize) {
		t.Errorf("MaxBytes 1000: %v", err)
	}
	frozen := NewTable()
	frozen.Freeze(context.Background())
	if _, err := frozen.Import(context.Background(), bytes.NewReader(stream), newPDs(), ImportOptions{}); !errors.Is(err, ErrFrozen) {
		t.Errorf("import into a frozen table: %v", err)
	}
}

// TestExportFileRegion: a file region is named, not copied, and the
// import maps the same file: what the first mapping wrote, the second
// reads, and the Durable key survives.
func TestExportFileRegion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, bytes.Repeat([]byte{7}, 3*4096), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src := NewTable()
	r, err := src.RegisterFile(1, f, 4096, 8192, RemoteWrite|RemoteRead, Plain, Options{})
	if err != nil {
		t.Fatal(err)
	}
	durable, err := r.Expose(Durable, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	r.WriteAt([]byte("moved"), 10)
	var b bytes.Buffer
	st, err := src.Export(context.Background(), &b, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 1 || st.Bytes != 0 || b.Len() > 200 {
		t.Fatalf("export of a file region: %+v, %d bytes", st, b.Len())
	}
	dst := NewTable()
	if _, err := dst.Import(context.Background(), &b, newPDs(), ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	n, why := dst.Lookup(durable)
	if why != OK || !n.File() {
		t.Fatalf("durable key: %v, file %v", why, n != nil && n.File())
	}
	if sem, _ := n.Semantics(durable.Key()); sem != Durable {
		t.Errorf("durable key has semantics %v", sem)
	}
	if got := string(n.Bytes()[10:15]); got != "moved" {
		t.Errorf("imported mapping reads %q", got)
	}
	// A file that is not there fails the import, registering nothing.
	var b2 bytes.Buffer
	src.Export(context.Background(), &b2, "")
	other := NewTable()
	_, err = other.Import(context.Background(), &b2, newPDs(), ImportOptions{OpenFile: func(string) (*os.File, error) { return nil, os.ErrNotExist }})
	if !errors.Is(err, os.ErrNotExist) || other.Len() != 0 {
		t.Errorf("import with the file missing: %v, %d regions", err, other.Len())
	}
}

// FuzzImport feeds arbitrary streams to Import: it never panics, and a
// stream it takes exports again to a stream that imports to the same.
func FuzzImport(f *testing.F) {
	// Small seeds (a few bytes of content each) keep the inputs short,
	// so the fuzzer spends its time on the records, not on minimizing
	// kilobytes of content.
	src := NewTable()
	r, _ := src.Register(3, [][]byte{[]byte("abc"), []byte("de")}, RemoteRead|RemoteWrite, Options{})
	r.Expose(Plain, 0, false)
	if k, err := r.Expose(Plain, 0, false); err == nil {
		r.Retire(k) // a retired key travels too
	}
	src.Register(4, [][]byte{[]byte("f")}, RemoteAtomic, Options{Addr: 1 << 40})
	stream := export(f, src)
	f.Add(stream)
	f.Add(stream[:40])
	one := NewTable()
	one.Register(1, [][]byte{[]byte("x")}, RemoteRead, Options{Addr: 1})
	f.Add(export(f, one))
	f.Add(export(f, NewTable()))
	f.Fuzz(func(t *testing.T, b []byte) {
		dst := NewTable()
		imp, err := dst.Import(context.Background(), bytes.NewReader(b), newPDs(), ImportOptions{MaxBytes: 1 << 20,
			OpenFile: func(string) (*os.File, error) { return nil, os.ErrNotExist }})
		if err != nil {
			if dst.Len() != 0 {
				t.Fatalf("failed import left %d regions", dst.Len())
			}
			return
		}
		again := export(t, dst)
		dst2 := NewTable()
		if _, err := dst2.Import(context.Background(), bytes.NewReader(again), newPDs(), ImportOptions{}); err != nil {
			t.Fatalf("re-export of an accepted import does not import: %v", err)
		}
		if dst2.Len() != len(imp.Regions) {
			t.Fatalf("%d regions, then %d", len(imp.Regions), dst2.Len())
		}
	})
}

// FuzzParseExportRegion: the region record parser never panics, and what
// it accepts appends back to the same bytes.
func FuzzParseExportRegion(f *testing.F) {
	for _, e := range []ExportRegion{
		{STag: 0x123456, Access: RemoteRead, Base: 1, Length: 2},
		{STag: 0x100, PD: 3, Access: RemoteWrite, Semantics: Durable, Base: 4096, Length: 1 << 30, Placed: 5,
			Keys: []ExportKey{{1, ReadThrough}, {2, Plain}}, File: "/var/data/f", FileOff: 8192},
		{STag: 0x200, Access: RemoteRead, Base: 1, Length: 9, Keys: []ExportKey{{7, Detached}}},
	} {
		b, _ := e.Append(nil)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := ParseExportRegion(b)
		if err != nil {
			return
		}
		out, err := e.Append(nil)
		if err != nil || !bytes.Equal(out, b) {
			t.Fatalf("parsed %+v, appends to %x (%v), was %x", e, out, err, b)
		}
		if _, _, _, err := ParseRecord(b); err == nil {
			rec, _ := AppendRecord(nil, recRegion, b)
			if _, body, n, err := ParseRecord(rec); err != nil || n != len(rec) || !bytes.Equal(body, b) {
				t.Fatalf("record round trip: %v", err)
			}
		}
	})
}

// BenchmarkExportImport64MiB exports a table of 16 regions of 4 MiB
// through an in-memory pipe into another table: the pause's cost without
// the network (MB/s is of the content moved).
func BenchmarkExportImport64MiB(b *testing.B) {
	src := NewTable()
	for range 16 {
		if _, err := src.Register(1, [][]byte{make([]byte, 4<<20)}, RemoteWrite|RemoteRead, Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(64 << 20)
	for range b.N {
		src.Thaw()
		pr, pw := io.Pipe()
		errc := make(chan error, 1)
		go func() {
			_, err := src.Export(context.Background(), pw, "")
			pw.CloseWithError(err)
			errc <- err
		}()
		if _, err := NewTable().Import(context.Background(), pr, newPDs(), ImportOptions{}); err != nil {
			b.Fatal(err)
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
}

// TestExportImportRetiredKey: a retired key travels as one: on the new
// node it still answers from the region's sink.
func TestExportImportRetiredKey(t *testing.T) {
	src, regs := exportTable(t)
	old, err := regs[1].Expose(Plain, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := regs[1].Retire(old); err != nil {
		t.Fatal(err)
	}
	dst := NewTable()
	if _, err := dst.Import(context.Background(), bytes.NewReader(export(t, src)), newPDs(), ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	n, why := dst.Lookup(old)
	if why != OK {
		t.Fatalf("retired key %v after import: %v", old, why)
	}
	sem, _ := n.Semantics(old.Key())
	if sem != Detached {
		t.Fatalf("retired key %v after import: %v", old, sem)
	}
	d, sunk := n.RemoteWriteSlices(nil, sem, 0, n.length)
	total := 0
	for _, b := range d {
		total += len(b)
		if len(b) > 0 && &b[0] == &n.bufs[0][0] {
			t.Fatal("a retired key's write reaches the memory")
		}
	}
	if !sunk || total != int(n.length) {
		t.Fatalf("sink pieces: %v, %d bytes of %d", sunk, total, n.length)
	}
}
