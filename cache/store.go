package cache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// The store keeps values in fixed-size blocks, one file per block under
// the data directory, and its index in a bbolt database there. A value is
// one or more pieces; a piece is a block header (HeaderLen bytes) and then
// the piece's bytes, at a 64-byte aligned offset of a block. Blocks fill
// by bumping a pointer; a block whose values are all deleted or replaced
// is reused whole, under a new STag key, so that an old address into it
// fails as an invalid STag.
//
// A block is resident when its file is mapped and registered for RDMA;
// at most Budget/BlockSize are. The rest are only files, which the server
// reads and writes with pread and pwrite (the page cache is shared with
// the mappings). Clients that read a block one-sided need it resident: a
// lookup pages it in, evicting the least recently used block that no
// write in progress pins.

// HeaderLen is the length of the block header before each piece.
const HeaderLen = 32

const (
	headerMagic = 0x47574342 // "GWCB"
	hdrPending  = 1          // header flag: the piece is being written
	pieceAlign  = 64
)

// header is the self-verifying header of a piece: a reader checks that
// it names the generation it was given and that the bytes match the CRC.
type header struct {
	Gen   uint64
	Len   uint32
	CRC   uint32
	Flags uint16
	Piece uint16
}

func (h header) put(b []byte) {
	binary.BigEndian.PutUint32(b[0:], headerMagic)
	binary.BigEndian.PutUint32(b[4:], h.Len)
	binary.BigEndian.PutUint64(b[8:], h.Gen)
	binary.BigEndian.PutUint32(b[16:], h.CRC)
	binary.BigEndian.PutUint16(b[20:], h.Flags)
	binary.BigEndian.PutUint16(b[22:], h.Piece)
	clear(b[24:HeaderLen])
}

func parseHeader(b []byte) (header, bool) {
	if len(b) < HeaderLen || binary.BigEndian.Uint32(b) != headerMagic {
		return header{}, false
	}
	return header{Len: binary.BigEndian.Uint32(b[4:]), Gen: binary.BigEndian.Uint64(b[8:]),
		CRC: binary.BigEndian.Uint32(b[16:]), Flags: binary.BigEndian.Uint16(b[20:]), Piece: binary.BigEndian.Uint16(b[22:])}, true
}

// verifyPiece checks a piece read with its header: the generation, the
// length and the CRC of data.
func verifyPiece(hdr []byte, gen uint64, data []byte) bool {
	h, ok := parseHeader(hdr)
	return ok && h.Flags&hdrPending == 0 && h.Gen == gen && int(h.Len) == len(data) &&
		crc32Of(data) == h.CRC
}

// extent is a piece of a value: block, offset of its header, length.
type extent struct {
	block uint32
	off   uint32
	n     uint32
}

func (e extent) span() int64 { return alignUp(HeaderLen + int64(e.n)) }

func alignUp(n int64) int64 { return (n + pieceAlign - 1) &^ (pieceAlign - 1) }

// record is a value's index entry.
type record struct {
	gen  uint64
	size uint64
	ext  []extent
	// sum is the CRC32c of the whole value, when known (hasSum): what a
	// lookup reports so that two servers' copies can be compared without
	// fetching either. Values of a server before it have none.
	sum    uint32
	hasSum bool
}

func (r *record) encode() []byte {
	b := make([]byte, 0, 18+12*len(r.ext))
	b = binary.BigEndian.AppendUint64(b, r.gen)
	b = binary.BigEndian.AppendUint64(b, r.size)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.ext)))
	for _, e := range r.ext {
		b = binary.BigEndian.AppendUint32(b, e.block)
		b = binary.BigEndian.AppendUint32(b, e.off)
		b = binary.BigEndian.AppendUint32(b, e.n)
	}
	return b
}

func decodeRecord(b []byte) (*record, error) {
	if len(b) < 18 {
		return nil, fmt.Errorf("%w: index record of %d bytes", ErrMalformed, len(b))
	}
	r := &record{gen: binary.BigEndian.Uint64(b), size: binary.BigEndian.Uint64(b[8:])}
	n := int(binary.BigEndian.Uint16(b[16:]))
	if len(b) != 18+12*n {
		return nil, fmt.Errorf("%w: index record of %d bytes for %d pieces", ErrMalformed, len(b), n)
	}
	var sum uint64
	for i := range n {
		p := b[18+12*i:]
		e := extent{binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:]), binary.BigEndian.Uint32(p[8:])}
		r.ext = append(r.ext, e)
		sum += uint64(e.n)
	}
	if sum != r.size {
		return nil, fmt.Errorf("%w: index record of %d bytes in pieces of %d", ErrMalformed, r.size, sum)
	}
	return r, nil
}

// block is one block file.
type block struct {
	id    uint32
	f     *os.File
	index uint32 // its STag index, kept across restarts
	key   uint8  // the key clients get: changes when the block is reused
	used  int64  // bump pointer
	live  int64  // bytes of committed pieces
	pins  int    // writes in progress (allocations not yet committed)
	mr    *gowarp.MR
	use   uint64 // the store's clock at its last lookup
	hot   bool   // resident: counted against the budget
	open  bool   // the block small values are bumped into
	// rekeyed: free, and its old key revoked already (newBlock).
	rekeyed bool
}

func (b *block) stag() uint32 { return b.index<<8 | uint32(b.key) }

// ownKey is the key a block region is registered with: never given to a
// client, so no client's address names it. Clients get the block's key
// (1-255) through ExposeKey.
const ownKey = 0

var (
	bucketValues = []byte("values")
	bucketBlocks = []byte("blocks")
	bucketMeta   = []byte("meta")
	// bucketSums holds each value's generation and sum (a separate bucket
	// so that the records stay as they were: a server before sums reads
	// the directory, and a sum whose generation is not the record's, left
	// by such a server's put, is not believed).
	bucketSums   = []byte("sums")
	keyGen       = []byte("gen")
	keyBlockSize = []byte("blocksize")
)

// store is the server's data: blocks, index, residency. Its methods are
// safe for concurrent use (one mutex: the control path is not the hot
// path, the one-sided Reads are).
type store struct {
	dir      string
	bs       int64
	maxRes   int
	maxValue int64
	pd       *gowarp.PD
	db       *bolt.DB

	mu       sync.Mutex
	idx      *index // the client-readable index, nil if not served
	vals     map[string]*record
	blocks   []*block
	free     []*block
	openBlk  *block
	resident int
	clock    uint64
	gen      uint64
	bytes    uint64
	pageIns  uint64
	pageOuts uint64

	// Page-outs are finished by the pager, off the lock: the write-back
	// of a block's dirty pages (an fsync) would stall every control
	// operation meanwhile.
	outs      []pageOut // for the pager
	pagerWake chan struct{}
	pagerQuit chan struct{}
	pagerDone chan struct{}
}

// pageOut is a block paged out whose memory the pager gives back.
type pageOut struct {
	mem []byte
	f   *os.File
}

func openStore(dir string, bs, budget, maxValue int64, idxBuckets int, pd *gowarp.PD) (*store, error) {
	if err := os.MkdirAll(filepath.Join(dir, "blocks"), 0o700); err != nil {
		return nil, fmt.Errorf("cache: data directory: %w", err)
	}
	// NoSync: a put that asks for durability syncs the database itself
	// (db.Sync); the others are safe against a killed process (the page
	// cache keeps what was written), not against a machine that fails.
	db, err := bolt.Open(filepath.Join(dir, "index.db"), 0o600, &bolt.Options{Timeout: time.Second, NoSync: true})
	if errors.Is(err, bolterrors.ErrTimeout) {
		// bbolt holds an exclusive lock on the file while it is open.
		return nil, fmt.Errorf("%w: %s is in use by another cache server (its index stayed locked for 1 s)", ErrServer, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("cache: index: %w", err)
	}
	s := &store{dir: dir, bs: bs, maxValue: maxValue, pd: pd, db: db, vals: make(map[string]*record),
		pagerWake: make(chan struct{}, 1), pagerQuit: make(chan struct{}), pagerDone: make(chan struct{})}
	go s.pager()
	s.maxRes = int(max(1, budget/bs))
	err = s.load()
	for _, b := range s.blocks {
		if err == nil {
			err = s.register(b)
		}
	}
	if err == nil && idxBuckets > 0 {
		s.idx, err = newIndex(pd, idxBuckets)
		for k, r := range s.vals {
			if err == nil {
				s.index(k, r)
			}
		}
	}
	if err != nil {
		s.close()
		return nil, err
	}
	// As many blocks as the budget holds are resident from the start.
	for _, b := range s.blocks {
		if s.resident < s.maxRes && b.live > 0 {
			s.pageIn(b)
		}
	}
	return s, nil
}

// load reads the index: blocks first, then values, from which each
// block's fill and live bytes are rebuilt.
func (s *store) load() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, n := range [][]byte{bucketValues, bucketBlocks, bucketMeta, bucketSums} {
			if _, err := tx.CreateBucketIfNotExists(n); err != nil {
				return fmt.Errorf("cache: index: %w", err)
			}
		}
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(keyBlockSize); v != nil {
			if len(v) != 8 || int64(binary.BigEndian.Uint64(v)) != s.bs {
				return fmt.Errorf("cache: %s holds blocks of %d bytes, not %d", s.dir, binary.BigEndian.Uint64(v), s.bs)
			}
		} else if err := meta.Put(keyBlockSize, binary.BigEndian.AppendUint64(nil, uint64(s.bs))); err != nil {
			return err
		}
		if v := meta.Get(keyGen); len(v) == 8 {
			s.gen = binary.BigEndian.Uint64(v)
		}
		err := tx.Bucket(bucketBlocks).ForEach(func(k, v []byte) error {
			if len(k) != 4 || len(v) != 5 {
				return fmt.Errorf("%w: block entry", ErrMalformed)
			}
			id := binary.BigEndian.Uint32(k)
			if int(id) != len(s.blocks) {
				return fmt.Errorf("%w: block %d after %d blocks", ErrMalformed, id, len(s.blocks))
			}
			f, err := os.OpenFile(s.blockPath(id), os.O_RDWR, 0)
			if err != nil {
				return fmt.Errorf("cache: block %d: %w", id, err)
			}
			s.blocks = append(s.blocks, &block{id: id, f: f, index: binary.BigEndian.Uint32(v), key: v[4]})
			return nil
		})
		if err != nil {
			return err
		}
		sums := tx.Bucket(bucketSums)
		err = tx.Bucket(bucketValues).ForEach(func(k, v []byte) error {
			r, err := decodeRecord(v)
			if err != nil {
				return fmt.Errorf("key %q: %w", k, err)
			}
			for _, e := range r.ext {
				if int(e.block) >= len(s.blocks) || int64(e.off)+e.span() > s.bs {
					return fmt.Errorf("%w: key %q names block %d offset %d", ErrMalformed, k, e.block, e.off)
				}
				b := s.blocks[e.block]
				b.used = max(b.used, int64(e.off)+e.span())
				b.live += e.span()
			}
			s.gen = max(s.gen, r.gen)
			if v := sums.Get(k); len(v) == 12 && binary.BigEndian.Uint64(v) == r.gen {
				r.sum, r.hasSum = binary.BigEndian.Uint32(v[8:]), true
			}
			s.vals[string(k)] = r
			s.bytes += r.size
			return nil
		})
		if err != nil {
			return err
		}
		for _, b := range s.blocks {
			if b.live == 0 {
				s.free = append(s.free, b)
			}
		}
		return nil
	})
}

func (s *store) blockPath(id uint32) string {
	return filepath.Join(s.dir, "blocks", fmt.Sprintf("b%08d", id))
}

func (s *store) closeFiles() {
	for _, b := range s.blocks {
		b.f.Close()
	}
}

// close deregisters the resident blocks and closes the files and index.
func (s *store) close() error {
	// The pager first, which uses the mappings and files.
	close(s.pagerQuit)
	<-s.pagerDone
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, b := range s.blocks {
		if b.mr != nil {
			if err := b.mr.Deregister(); err != nil {
				errs = append(errs, err)
			}
			b.mr = nil
		}
	}
	if s.idx != nil {
		errs = append(errs, s.idx.close())
		s.idx = nil
	}
	s.closeFiles()
	errs = append(errs, s.db.Close())
	return errors.Join(errs...)
}

// newBlock returns a block with room for a piece of n bytes: a free one,
// or a new file.
func (s *store) newBlock() (*block, error) {
	for i := len(s.free) - 1; i >= 0; i-- {
		b := s.free[i]
		if !b.rekeyed {
			if err := s.reuse(b); err != nil {
				return nil, err
			}
			b.rekeyed = true
		}
		// A Read through the old key that the responder took before the
		// revoke may still be copying the block out (to a peer slow to
		// read, for as long as its link lives): bytes written now would
		// reach it under the old value's header, which a read of part of
		// a piece takes as proof. The block waits on the list, under its
		// new key, until no access is under way.
		if b.mr.InUse() {
			continue
		}
		s.free = append(s.free[:i], s.free[i+1:]...)
		b.rekeyed = false
		return b, nil
	}
	if len(s.blocks) >= 1<<20 {
		return nil, fmt.Errorf("%w: %d blocks", ErrFull, len(s.blocks))
	}
	id := uint32(len(s.blocks))
	f, err := os.OpenFile(s.blockPath(id), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrServer, err)
	}
	if err := f.Truncate(s.bs); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %w", ErrServer, err)
	}
	b := &block{id: id, f: f, key: 1}
	// The first registration draws the block's STag index; it is kept
	// from then on, across restarts.
	if err := s.register(b); err != nil {
		f.Close()
		return nil, err
	}
	s.blocks = append(s.blocks, b)
	return b, nil
}

// reuse starts a free block afresh under a new key. Clients' addresses
// into its old contents keep a valid STag that no longer reaches the
// block (the key is retired): a Read through one completes, from the
// block's sink, and fails its header check (ErrStale), so only that call
// goes back to the control path. Revoked, the key made such a Read an
// invalid STag, whose Terminate ended the client's connection and every
// other call on it. A retired key is revoked when the key comes round
// again, 254 reuses on; a restart forgets them (an address from before
// it into a block reused since is an invalid STag again).
func (s *store) reuse(b *block) error {
	old := b.stag()
	b.key++
	if b.key == ownKey {
		b.key++
	}
	b.used, b.live = 0, 0
	if err := b.mr.Retire(gowarp.STag(old)); err != nil {
		return fmt.Errorf("%w: retire: %w", ErrServer, err)
	}
	if sem, ok := b.mr.Semantics(gowarp.STag(b.stag())); ok && sem == gowarp.Detached {
		if err := b.mr.Revoke(gowarp.STag(b.stag())); err != nil {
			return fmt.Errorf("%w: revoke: %w", ErrServer, err)
		}
	}
	if _, err := b.mr.ExposeKey(gowarp.Plain, b.key); err != nil {
		return fmt.Errorf("%w: expose: %w", ErrServer, err)
	}
	return s.saveBlock(b)
}

func (s *store) saveBlock(b *block) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		v := binary.BigEndian.AppendUint32(nil, b.index)
		return tx.Bucket(bucketBlocks).Put(binary.BigEndian.AppendUint32(nil, b.id), append(v, b.key))
	})
	if err != nil {
		return fmt.Errorf("%w: index: %w", ErrServer, err)
	}
	return nil
}

// register maps b's file and registers it under its STag: the index it
// had (a new one the first time), the key clients know, and tagged
// offsets of the block's own, not the mapping's address, so that a
// restart gives clients the same addresses.
func (s *store) register(b *block) error {
	acc := gowarp.LocalWrite | gowarp.RemoteRead | gowarp.RemoteWrite
	fo := gowarp.FileOptions{Index: b.index, Key: ownKey, KeyFixed: true, Addr: blockAddr(b.id)}
	mr, err := s.pd.RegisterFile(b.f, 0, s.bs, acc, fo)
	if errors.Is(err, gowarp.ErrIndexInUse) {
		// Another region of the device has the index: clients' addresses
		// into the block fail and are looked up again.
		fo.Index = 0
		mr, err = s.pd.RegisterFile(b.f, 0, s.bs, acc, fo)
	}
	if err != nil {
		return fmt.Errorf("%w: register block %d: %w", ErrServer, b.id, err)
	}
	if _, err := mr.ExposeKey(gowarp.Plain, b.key); err != nil {
		mr.Deregister()
		return fmt.Errorf("%w: expose block %d: %w", ErrServer, b.id, err)
	}
	b.mr = mr
	if idx := mr.STag().Index(); idx != b.index {
		b.index = idx
		if err := s.saveBlock(b); err != nil {
			mr.Deregister()
			b.mr = nil
			return err
		}
	}
	return nil
}

// pageIn makes b resident, paging the least recently used block out if
// the budget is reached, and asks the kernel for its pages. Called with
// s.mu held.
func (s *store) pageIn(b *block) {
	s.clock++
	b.use = s.clock
	if b.hot {
		return
	}
	// Blocks being written stay: a value larger than the budget holds
	// memory over it for as long as its put lasts.
	for s.resident >= s.maxRes && s.evict() {
	}
	b.hot = true
	s.resident++
	s.pageIns++
	willNeed(b.mr.Bytes())
}

// blockAddr is the tagged offset of a block's first byte.
func blockAddr(id uint32) uint64 { return uint64(id+1) << 32 }

// evict pages out the least recently used resident block nobody is
// writing: it no longer counts against the budget, and the pager writes
// its dirty pages to its file, then drops its pages from the mapping and
// the page cache. It stays registered: a client's Read through an
// address it kept faults the pages back in from the file and is served
// the same bytes. False if there is no block to page out.
func (s *store) evict() bool {
	var v *block
	for _, b := range s.blocks {
		if b.hot && b.pins == 0 && (v == nil || b.use < v.use) {
			v = b
		}
	}
	if v == nil {
		return false
	}
	v.hot = false
	s.resident--
	s.pageOuts++
	s.outs = append(s.outs, pageOut{mem: v.mr.Bytes(), f: v.f})
	select {
	case s.pagerWake <- struct{}{}:
	default: // awake already
	}
	return true
}

// pager gives back the memory of paged-out blocks until the store
// closes. A block paged in again meanwhile loses nothing: its mapping is
// shared, so dropping pages only makes the next access fault them back
// in from the page cache or the file.
func (s *store) pager() {
	defer close(s.pagerDone)
	var batch []pageOut
	for {
		select {
		case <-s.pagerWake:
		case <-s.pagerQuit:
			return
		}
		s.mu.Lock()
		batch, s.outs = s.outs, batch[:0]
		s.mu.Unlock()
		for i, p := range batch {
			_ = p.f.Sync() // the pages must be clean for the kernel to drop them
			dropPages(p.mem, p.f, s.bs)
			batch[i] = pageOut{}
		}
	}
}

// alloc places a value of size n: its pieces, each in a block with room.
// Blocks of pieces for RDMA writes are paged in and pinned.
func (s *store) alloc(n int64, rdma bool) ([]extent, error) {
	if n > s.maxValue {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, n, s.maxValue)
	}
	var ext []extent
	undo := func() {
		for _, e := range ext {
			s.releaseSpan(e, rdma, false)
		}
	}
	payload := s.bs - HeaderLen
	for left := n; left > 0 || len(ext) == 0; {
		p := min(left, payload)
		b := s.openBlk
		if b == nil || b.used+alignUp(HeaderLen+p) > s.bs {
			if b != nil {
				b.open = false
				// Not if it holds this value's last piece, which is not
				// live yet (nor pinned, written inline): the next piece
				// would land in it again, over this one.
				if len(ext) == 0 || ext[len(ext)-1].block != b.id {
					s.maybeFree(b)
				}
			}
			nb, err := s.newBlock()
			if err != nil {
				s.openBlk = nil
				undo()
				return nil, err
			}
			b, s.openBlk = nb, nb
			b.open = true
		}
		if rdma {
			s.pageIn(b)
			b.pins++
		}
		e := extent{block: b.id, off: uint32(b.used), n: uint32(p)}
		b.used += e.span()
		ext = append(ext, e)
		left -= p
	}
	return ext, nil
}

// releaseSpan gives back an extent's bytes: committed (live) ones or a
// pinned allocation's.
func (s *store) releaseSpan(e extent, pinned, live bool) {
	b := s.blocks[e.block]
	if pinned {
		b.pins--
		// A value larger than the budget held blocks over it while it
		// was written; those no write pins may go now, or memory stays
		// over the budget until the next page-in.
		for s.resident > s.maxRes && s.evict() {
		}
	}
	if live {
		b.live -= e.span()
	}
	s.maybeFree(b)
}

// maybeFree puts a block that holds nothing live, and that nobody writes
// or fills, on the free list.
func (s *store) maybeFree(b *block) {
	if b.live == 0 && b.pins == 0 && !b.open && b.used > 0 {
		b.used = 0
		s.free = append(s.free, b)
	}
}

func (s *store) nextGen() uint64 {
	s.gen++
	return s.gen
}

// writePiece writes a piece's bytes, whose CRC is crc, and then its
// header with pwrite.
func (s *store) writePiece(e extent, gen uint64, piece int, data []byte, crc uint32) error {
	f := s.blocks[e.block].f
	if _, err := f.WriteAt(data, int64(e.off)+HeaderLen); err != nil {
		return fmt.Errorf("%w: %w", ErrServer, err)
	}
	return s.writeHeader(e, header{Gen: gen, Len: e.n, CRC: crc, Piece: uint16(piece)})
}

func (s *store) writeHeader(e extent, h header) error {
	var hb [HeaderLen]byte
	h.put(hb[:])
	if _, err := s.blocks[e.block].f.WriteAt(hb[:], int64(e.off)); err != nil {
		return fmt.Errorf("%w: %w", ErrServer, err)
	}
	return nil
}

// syncBlocks makes the blocks of ext durable.
func (s *store) syncBlocks(ext []extent) error {
	done := map[uint32]bool{}
	for _, e := range ext {
		if done[e.block] {
			continue
		}
		done[e.block] = true
		if err := s.blocks[e.block].f.Sync(); err != nil {
			return fmt.Errorf("%w: %w", ErrServer, err)
		}
	}
	return nil
}

// commit makes r the key's value in the index (durably if asked) and
// releases the value it replaces.
func (s *store) commit(key string, r *record, durable bool) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketMeta).Put(keyGen, binary.BigEndian.AppendUint64(nil, s.gen)); err != nil {
			return err
		}
		if r.hasSum {
			v := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(nil, r.gen), r.sum)
			if err := tx.Bucket(bucketSums).Put([]byte(key), v); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketValues).Put([]byte(key), r.encode())
	})
	if err == nil && durable {
		err = s.db.Sync()
	}
	if err != nil {
		return fmt.Errorf("%w: index: %w", ErrServer, err)
	}
	for _, e := range r.ext {
		s.blocks[e.block].live += e.span()
	}
	s.replace(key, r)
	return nil
}

func (s *store) replace(key string, r *record) {
	if old := s.vals[key]; old != nil {
		s.bytes -= old.size
		for _, e := range old.ext {
			s.releaseSpan(e, false, true)
		}
	}
	if r == nil {
		delete(s.vals, key)
		if s.idx != nil {
			s.idx.remove(key)
		}
		return
	}
	s.vals[key] = r
	s.bytes += r.size
	s.index(key, r)
}

// index puts key's entry in the client-readable index.
func (s *store) index(key string, r *record) {
	if s.idx == nil {
		return
	}
	var a Addr
	if len(r.ext) == 1 {
		e := r.ext[0]
		b := s.blocks[e.block]
		a = Addr{STag: b.stag(), Off: b.mr.Addr() + uint64(e.off), Len: e.n}
	}
	s.idx.set(key, r, a)
}

func (s *store) delete(key string) error {
	if s.vals[key] == nil {
		return ErrNotFound
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketSums).Delete([]byte(key)); err != nil {
			return err
		}
		return tx.Bucket(bucketValues).Delete([]byte(key))
	})
	if err != nil {
		return fmt.Errorf("%w: index: %w", ErrServer, err)
	}
	s.replace(key, nil)
	return nil
}

// readValue appends a whole value to dst, copied from the blocks'
// mappings (a paged-out block's pages fault in from its file), checking
// every piece's header.
func (s *store) readValue(r *record, dst []byte) ([]byte, error) {
	for _, e := range r.ext {
		m := s.blocks[e.block].mr.Bytes()
		p := m[e.off : int64(e.off)+HeaderLen+int64(e.n)]
		at := len(dst)
		dst = append(dst, p[HeaderLen:]...)
		if !verifyPiece(p[:HeaderLen], r.gen, dst[at:]) {
			return nil, fmt.Errorf("%w: block %d offset %d fails its header check", ErrServer, e.block, e.off)
		}
	}
	return dst, nil
}

// addrs pages in the blocks of r and returns its pieces' addresses.
func (s *store) addrs(r *record, dst []Addr) ([]Addr, error) {
	for _, e := range r.ext {
		b := s.blocks[e.block]
		s.pageIn(b)
		dst = append(dst, Addr{STag: b.stag(), Off: b.mr.Addr() + uint64(e.off), Len: e.n})
	}
	return dst, nil
}

// keys lists up to limit keys with the prefix after the key after.
func (s *store) keys(prefix, after string, limit int) []string {
	var ks []string
	for k := range s.vals {
		if len(k) >= len(prefix) && k[:len(prefix)] == prefix && k > after {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	if len(ks) > limit {
		ks = ks[:limit]
	}
	return ks
}

// crc32Of is the CRC32c of a piece; wire's is twice hash/crc32's speed on
// CPUs with VPCLMULQDQ.
func crc32Of(b []byte) uint32 { return wire.CRC32c(b) }
