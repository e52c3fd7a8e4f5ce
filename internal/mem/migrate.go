package mem

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"time"
)

// Moving a whole table to another node (capability C12): Export writes
// its regions, their keys, rights and content to a stream (tablefmt.go),
// Import registers them in a table of another node under the same STags
// and tagged offsets, so a peer that held an STag on the first node
// reaches the same bytes on the second.
//
// For the copy to be consistent the table is frozen first: from then on
// no write to its regions' memory begins (a peer's Write or atomic is
// refused as to an invalid STag, which the peer is told with a Terminate;
// a local WriteAt fails with ErrFrozen; a receive into one of its buffers
// fails its queue pair), nothing is registered, deregistered, exposed,
// revoked or invalidated in it, and the writes under way are waited for.
// Reads go on being served: the memory no longer changes. After a
// successful export the table stays frozen: its content now lives on the
// importing node, and a write accepted here would be lost. Thaw undoes a
// freeze (an export that failed, an import that did not happen).

// Errors of export and import.
var (
	ErrFrozen     = errors.New("gowarp: the STag table is frozen for an export")
	ErrImportSize = errors.New("gowarp: an imported region is larger than the import allows")
)

// freezeWait bounds how long a freeze waits for the writes in progress.
var freezeWait = time.Second

// Freeze holds the table still for an export (see above). It returns
// once no write to its regions is in progress; if some do not end within
// a second (a peer stopped in the middle of an FPDU) or before ctx is
// done, it thaws the table and fails with ErrBusy. Freezing a frozen
// table fails with ErrFrozen.
func (t *Table) Freeze(ctx context.Context) error {
	t.mu.Lock()
	if t.frozen.Load() {
		t.mu.Unlock()
		return ErrFrozen
	}
	t.frozen.Store(true)
	regs := make([]*Region, 0, len(t.regions))
	for _, r := range t.regions {
		r.wuse.Or(wFrozen)
		regs = append(regs, r)
	}
	t.mu.Unlock()
	for _, r := range regs {
		if err := r.drainWrites(ctx, freezeWait); err != nil {
			t.Thaw()
			return fmt.Errorf("freeze, region %v: %w", r.stag, err)
		}
	}
	return nil
}

// Thaw ends a freeze: writes, registrations and the rest are allowed
// again. It does nothing to a table that is not frozen.
func (t *Table) Thaw() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.regions {
		r.wuse.And(^uint64(wFrozen))
	}
	t.frozen.Store(false)
}

// Frozen reports whether the table is frozen.
func (t *Table) Frozen() bool { return t.frozen.Load() }

// ExportStats says what an export wrote and how long it held the table.
type ExportStats struct {
	Regions int
	PDs     int
	Bytes   int64         // content bytes copied into the stream
	Files   int           // file regions, named rather than copied
	Drain   time.Duration // waiting for the writes in progress to end
	Copy    time.Duration // writing the stream
}

// exportChunk is how much content is written (and ctx looked at) at once.
const exportChunk = 1 << 20

// Export freezes the table (unless it is frozen already: an export may be
// repeated) and writes it to w: every valid region, in STag order, with
// its content, or, for a file region, its file's name and offset after
// its pages are written to the file (msync), so that a node that sees the
// same file maps it again rather than copying it. identity is recorded
// for the importer's information. On success the table stays frozen; on
// failure a freeze Export made is undone.
func (t *Table) Export(ctx context.Context, w io.Writer, identity string) (st ExportStats, err error) {
	if err := ctx.Err(); err != nil {
		return st, err // nothing frozen, nothing written
	}
	if len(identity) > 255 {
		return st, fmt.Errorf("%w: identity of %d bytes", ErrBadExport, len(identity))
	}
	t0 := time.Now()
	switch ferr := t.Freeze(ctx); {
	case ferr == nil:
		defer func() {
			if err != nil { // Export's own result
				t.Thaw()
			}
		}()
	case !errors.Is(ferr, ErrFrozen):
		return st, ferr
	}
	st.Drain = time.Since(t0)
	t.mu.RLock()
	regs := make([]*Region, 0, len(t.regions))
	for _, r := range t.regions {
		if r.valid.Load() {
			regs = append(regs, r)
		}
	}
	t.mu.RUnlock()
	slices.SortFunc(regs, func(a, b *Region) int { return int(a.stag.Index()) - int(b.stag.Index()) })
	pds := map[uint32]uint32{}
	for _, r := range regs {
		if _, ok := pds[r.pd]; !ok {
			pds[r.pd] = uint32(len(pds))
		}
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	rec := make([]byte, 0, 512)
	body := make([]byte, 0, 512)
	put := func(kind byte, b []byte) error {
		var err error
		if rec, err = AppendRecord(rec[:0], kind, b); err != nil {
			return err
		}
		_, err = bw.Write(rec)
		return err
	}
	h := ExportHeader{Version: TableFormatVersion, Regions: uint32(len(regs)), PDs: uint32(len(pds)), Identity: identity}
	if err := put(recHeader, h.Append(body[:0])); err != nil {
		return st, fmt.Errorf("gowarp: export: %w", err)
	}
	for _, r := range regs {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		e := ExportRegion{STag: r.stag, PD: pds[r.pd], Access: r.access, Semantics: r.sem,
			Base: r.base, Length: r.length, Placed: r.placed.Load()}
		if k := r.keys.Load(); k != nil {
			for key := range 256 {
				if k.contains(uint8(key)) {
					e.Keys = append(e.Keys, ExportKey{Key: uint8(key), Semantics: k.sem[key]})
				}
			}
		}
		if r.file != nil {
			e.File, e.FileOff = r.fileOrigin()
			if err := r.Sync(0, r.length); err != nil {
				return st, err
			}
			st.Files++
		}
		b, err := e.Append(body[:0])
		if err != nil {
			return st, err
		}
		body = b
		if err := put(recRegion, body); err != nil {
			return st, fmt.Errorf("gowarp: export: %w", err)
		}
		if r.file == nil {
			if err := r.writeContent(ctx, bw); err != nil {
				return st, err
			}
			st.Bytes += int64(r.length)
		}
	}
	end := ExportEnd{Regions: uint32(len(regs)), Bytes: uint64(st.Bytes)}
	if err := put(recEnd, end.Append(body[:0])); err != nil {
		return st, fmt.Errorf("gowarp: export: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("gowarp: export: %w", err)
	}
	st.Regions, st.PDs = len(regs), len(pds)
	st.Copy = time.Since(t0) - st.Drain
	return st, nil
}

// writeContent writes the region's bytes and their CRC32c.
func (r *Region) writeContent(ctx context.Context, w io.Writer) error {
	var crc uint32
	for _, b := range r.bufs {
		for len(b) > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			c := b[:min(len(b), exportChunk)]
			crc = crc32.Update(crc, castagnoli, c)
			if _, err := w.Write(c); err != nil {
				return fmt.Errorf("gowarp: export: %w", err)
			}
			b = b[len(c):]
		}
	}
	var tail [4]byte
	putUint32(tail[:], crc)
	_, err := w.Write(tail[:])
	return err
}

func putUint32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}

// ImportOptions tune Import.
type ImportOptions struct {
	// MaxBytes bounds the content one region may bring (its memory is
	// allocated before it is read); 0 means DefaultImportMax.
	MaxBytes int64
	// OpenFile opens the file a file region maps, read-write; nil means
	// os.OpenFile(name, os.O_RDWR, 0).
	OpenFile func(name string) (*os.File, error)
}

// DefaultImportMax is ImportOptions.MaxBytes' default: 16 GiB.
const DefaultImportMax = 16 << 30

// Imported is what Import registered.
type Imported struct {
	Header  ExportHeader
	Regions []*Region // in the stream's order
	PDs     []uint32  // the protection domain given to each PD ordinal
	Bytes   int64
}

// Import reads an export stream and registers its regions in t under
// their STags and tagged offsets, with their keys, rights and content;
// newPD is called once per protection domain of the stream, in order, for
// the PD its regions get here. Nothing is registered unless the whole
// stream is read and checked: a corrupt or truncated stream fails with
// ErrBadExport, an STag whose index is in use with ErrIndexInUse, a frozen
// table with ErrFrozen.
func (t *Table) Import(ctx context.Context, rd io.Reader, newPD func() uint32, o ImportOptions) (*Imported, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // nothing read, nothing registered
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultImportMax
	}
	if o.OpenFile == nil {
		o.OpenFile = func(name string) (*os.File, error) { return os.OpenFile(name, os.O_RDWR, 0) }
	}
	br := bufio.NewReaderSize(rd, 64<<10)
	rec := make([]byte, 0, 512)
	next := func(want byte) ([]byte, error) {
		var prefix [recPrefix]byte
		if _, err := io.ReadFull(br, prefix[:]); err != nil {
			return nil, truncated(err)
		}
		n, _ := RecordLen(prefix[:])
		rec = append(append(rec[:0], prefix[:]...), make([]byte, n-recPrefix)...)
		if _, err := io.ReadFull(br, rec[recPrefix:]); err != nil {
			return nil, truncated(err)
		}
		kind, body, _, err := ParseRecord(rec)
		if err != nil {
			return nil, err
		}
		if kind != want {
			return nil, fmt.Errorf("%w: record %q where %q was due", ErrBadExport, kind, want)
		}
		return body, nil
	}
	body, err := next(recHeader)
	if err != nil {
		return nil, err
	}
	h, err := ParseExportHeader(body)
	if err != nil {
		return nil, err
	}
	imp := &Imported{Header: h}
	ok := false
	defer func() {
		if !ok {
			for _, r := range imp.Regions {
				if r.file != nil {
					r.file.unmap()
				}
			}
		}
	}()
	seen := map[uint32]bool{}
	for range h.Regions {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		body, err := next(recRegion)
		if err != nil {
			return nil, err
		}
		e, err := ParseExportRegion(body)
		if err != nil {
			return nil, err
		}
		if e.PD >= h.PDs {
			return nil, fmt.Errorf("%w: region %v in PD %d of %d", ErrBadExport, e.STag, e.PD, h.PDs)
		}
		if seen[e.STag.Index()] {
			return nil, fmt.Errorf("%w: STag index %#x twice", ErrBadExport, e.STag.Index())
		}
		seen[e.STag.Index()] = true
		r := &Region{stag: e.STag, pd: e.PD, access: e.Access, table: t, sem: e.Semantics, base: e.Base, length: e.Length}
		r.placed.Store(e.Placed)
		if len(e.Keys) > 0 {
			ks := &keySet{}
			for _, k := range e.Keys {
				ks.has[k.Key>>6] |= 1 << (k.Key & 63)
				ks.sem[k.Key] = k.Semantics
				if k.Semantics == Detached {
					r.makeSink()
				}
			}
			r.keys.Store(ks)
		}
		var buf []byte
		if e.File != "" {
			if e.Access&RemoteAtomic != 0 {
				return nil, fmt.Errorf("%w: atomics on file region %v", ErrBadExport, e.STag)
			}
			if r.file, err = importFile(e, o.OpenFile); err != nil {
				return nil, err
			}
			buf = r.file.data
		} else {
			if e.Length > uint64(o.MaxBytes) {
				return nil, fmt.Errorf("%w: region %v of %d bytes, at most %d", ErrImportSize, e.STag, e.Length, o.MaxBytes)
			}
			if buf, err = readContent(ctx, br, e.Length); err != nil {
				return nil, fmt.Errorf("region %v: %w", e.STag, err)
			}
			imp.Bytes += int64(e.Length)
		}
		r.bufs, r.starts = [][]byte{buf}, []uint64{0}
		imp.Regions = append(imp.Regions, r)
	}
	body, err = next(recEnd)
	if err != nil {
		return nil, err
	}
	end, err := ParseExportEnd(body)
	if err != nil {
		return nil, err
	}
	if end.Regions != h.Regions || end.Bytes != uint64(imp.Bytes) {
		return nil, fmt.Errorf("%w: end record says %d regions and %d bytes, the stream held %d and %d",
			ErrBadExport, end.Regions, end.Bytes, h.Regions, imp.Bytes)
	}
	imp.PDs = make([]uint32, h.PDs)
	for i := range imp.PDs {
		imp.PDs[i] = newPD()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.frozen.Load() {
		return nil, ErrFrozen
	}
	for _, r := range imp.Regions {
		if t.regions[r.stag.Index()] != nil {
			return nil, fmt.Errorf("%w: %v", ErrIndexInUse, r.stag)
		}
	}
	for _, r := range imp.Regions {
		r.pd = imp.PDs[r.pd]
		r.id = regionIDs.Add(1)
		t.regions[r.stag.Index()] = r
		r.valid.Store(true)
	}
	ok = true
	return imp, nil
}

// truncated says that the stream ended before a record did.
func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: the stream ends early", ErrBadExport)
	}
	return fmt.Errorf("gowarp: import: %w", err)
}

// readContent reads n bytes of content and their CRC into new memory.
func readContent(ctx context.Context, r io.Reader, n uint64) ([]byte, error) {
	buf := make([]byte, n)
	var crc uint32
	for b := buf; len(b) > 0; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c := b[:min(len(b), exportChunk)]
		if _, err := io.ReadFull(r, c); err != nil {
			return nil, truncated(err)
		}
		crc = crc32.Update(crc, castagnoli, c)
		b = b[len(c):]
	}
	var tail [4]byte
	if _, err := io.ReadFull(r, tail[:]); err != nil {
		return nil, truncated(err)
	}
	if want := uint32(tail[0])<<24 | uint32(tail[1])<<16 | uint32(tail[2])<<8 | uint32(tail[3]); crc != want {
		return nil, fmt.Errorf("%w: content CRC %#08x, expected %#08x", ErrBadExport, crc, want)
	}
	return buf, nil
}

// importFile maps the file range a file region of the stream names.
func importFile(e ExportRegion, open func(string) (*os.File, error)) (*fileMap, error) {
	f, err := open(e.File)
	if err != nil {
		return nil, fmt.Errorf("gowarp: import of file region %v: %w", e.STag, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("gowarp: import of file region %v: %w", e.STag, err)
	}
	if !st.Mode().IsRegular() || e.Length > uint64(st.Size()) || e.FileOff > st.Size()-int64(e.Length) {
		return nil, fmt.Errorf("%w: file region %v: %d bytes at offset %d of %s, %d bytes long",
			ErrFileRange, e.STag, e.Length, e.FileOff, e.File, st.Size())
	}
	return mapFile(f, e.FileOff, int64(e.Length))
}

// PDRegion returns the STag of the valid region of protection domain pd
// with the lowest index, false if pd has none: what an importer finds
// the protection domain by (a session hand-off names its listener's so).
func (t *Table) PDRegion(pd uint32) (STag, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var best *Region
	for _, r := range t.regions {
		if r.pd == pd && r.valid.Load() && (best == nil || r.stag.Index() < best.stag.Index()) {
			best = r
		}
	}
	if best == nil {
		return 0, false
	}
	return best.stag, true
}
