package mem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Copy-on-write sharing of a region's pages (capability C11).
//
// A snapshot shares the region's pages with the live region until one of
// them is written: the first write to a shared page, a peer's placement or
// a local WriteAt alike, copies the page to the snapshots' side before a
// byte of it changes, so the snapshot keeps the old content and the write
// then goes on in place. Taking a snapshot copies nothing: it bumps the
// region's epoch, which makes every page shared at once.
//
// Every write to a region's memory (an FPDU's placement, from its header
// to its trailer, or one WriteAt) holds the region for writing (Region.wuse).
// A snapshot is taken only with no write held: it closes a gate that new
// writes wait at, waits for those in progress to end, and opens the gate
// again with the snapshot in place. So a snapshot holds every FPDU placed
// in the region wholly or not at all; what a write placed straight from
// the socket into region memory (the receive path's scatter read) is in
// place before the snapshot is taken, or lands on a page already copied.
//
// The write hold is one atomic add, as the hold it replaced, and while no
// snapshot exists the placement does nothing else: the hot path's cost is
// unchanged.

// PageSize is the unit of copy-on-write sharing: a region's offsets
// [k*PageSize, (k+1)*PageSize) are its page k.
const PageSize = 4096

// Errors of snapshots and local writes.
var (
	ErrSnapshotClosed = errors.New("gowarp: snapshot is closed")
	ErrBounds         = errors.New("gowarp: range is outside the region")
)

// snapshotWait bounds how long Snapshot waits for writes in progress: a
// peer that stops in the middle of an FPDU holds its placement.
var snapshotWait = time.Second

// The fields of Region.wuse: the write holds and the flags a writer must
// look at.
const (
	wClosed  = 1 << 63     // Deregister has begun: no write hold is granted
	wGate    = 1 << 62     // a snapshot is being taken: new writes wait
	wCOW     = 1 << 61     // snapshots exist: a write copies shared pages first
	wFrozen  = 1 << 60     // the table is frozen for an export: no write hold is granted
	wDetach  = 1 << 59     // detached: peers' accesses reach the sink, not the memory (detach.go)
	wWriters = wDetach - 1 // the count of write holds
	wDec     = ^uint64(0)  // adds -1
)

type page [PageSize]byte

// lostPage stands in a snapshot for a page of a file region that the
// file's truncation took away before it could be copied.
var lostPage = new(page)

// cowState is a region's copy-on-write bookkeeping, made by its first
// snapshot.
type cowState struct {
	taking sync.Mutex // one snapshot is taken at a time

	mu sync.Mutex
	// epoch is the number of snapshots taken. It changes only while no
	// write is held, so a writer reads it without mu.
	epoch atomic.Uint64
	// priv[p] is the epoch in which page p was last copied for the
	// snapshots: it may be written in place while priv[p] == epoch. For
	// every open snapshot s, either s.pages[p] is set or priv[p] < s.epoch
	// (the page has not been written since s was taken).
	priv  []atomic.Uint64
	snaps []*Snapshot   // the open snapshots, under mu
	gate  chan struct{} // closed when the snapshot being taken is done, under mu
}

// Snapshot is a copy-on-write view of a region's content at one moment:
// it reads the region's own pages until they are written, and its copies
// of them after.
type Snapshot struct {
	r     *Region
	c     *cowState
	epoch uint64
	n     uint64  // the region's length
	pages []*page // under c.mu; nil: the page is still the region's
	done  bool    // closed, under c.mu
}

// TryHoldWrite marks a write to the region's memory in progress (an
// FPDU's placement, a WriteAt) unless Deregister has begun. Deregister
// waits for write holds to end, and a snapshot is taken only while none
// is held: a write that begins while one is being taken waits here until
// it is. The memory written must come from WriteSlices.
func (r *Region) TryHoldWrite() bool {
	v := r.wuse.Add(1)
	if v&(wClosed|wGate|wFrozen) == 0 {
		return true
	}
	return r.holdWriteSlow(v)
}

// holdWriteSlow is TryHoldWrite when the region is closing or a snapshot
// is being taken; v is wuse with this write counted.
func (r *Region) holdWriteSlow(v uint64) bool {
	for {
		switch {
		case v&(wClosed|wFrozen) != 0:
			r.wuse.Add(wDec)
			return false
		case v&wGate == 0:
			return true
		}
		// Not a writer while waiting: the snapshot waits for the writes
		// in progress only.
		r.wuse.Add(wDec)
		c := r.cow.Load()
		c.mu.Lock()
		g := c.gate
		c.mu.Unlock()
		<-g
		v = r.wuse.Add(1)
	}
}

// HoldWrite adds a write hold. The caller holds one on the region already
// (a Send's second piece of one region), so no snapshot can be taken and
// the hold must not wait for one.
func (r *Region) HoldWrite() { r.wuse.Add(1) }

// UnholdWrite ends a write hold.
func (r *Region) UnholdWrite() { r.wuse.Add(wDec) }

// WriteSlices is Slices for memory about to be written, under a write
// hold: it copies the range's shared pages for the snapshots first.
func (r *Region) WriteSlices(dst [][]byte, off, n uint64) [][]byte {
	if r.wuse.Load()&wCOW != 0 && n > 0 {
		r.unshare(off, n)
	}
	return r.Slices(dst, off, n)
}

// unshare copies the pages of [off, off+n) that open snapshots still
// share, so that they can be written in place.
func (r *Region) unshare(off, n uint64) {
	c := r.cow.Load()
	e := c.epoch.Load()
	for p := off / PageSize; p <= (off+n-1)/PageSize; p++ {
		if c.priv[p].Load() != e {
			c.copyPage(r, p, e)
		}
	}
}

// copyPage gives the snapshots that share page p a copy of it. A writer
// to the page waits here (on mu) while another copies it.
func (c *cowState) copyPage(r *Region, p, e uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.priv[p].Load()
	if w == e {
		return // copied meanwhile
	}
	var cp *page
	for _, s := range c.snaps {
		if s.epoch > w && s.pages[p] == nil {
			if cp == nil {
				cp = new(page)
				n := min(PageSize, r.length-p*PageSize)
				if !r.CheckFile(p*PageSize, n) {
					// A file truncated under the region: the page is gone
					// (touching it would raise SIGBUS), for the snapshots too.
					cp = lostPage
				} else {
					r.copyOut(cp[:n], p*PageSize)
				}
			}
			s.pages[p] = cp
		}
	}
	c.priv[p].Store(e)
}

// copyOut copies the region's bytes at [off, off+len(b)) to b.
func (r *Region) copyOut(b []byte, off uint64) {
	i := r.find(off)
	for len(b) > 0 {
		c := copy(b, r.bufs[i][off-r.starts[i]:])
		b = b[c:]
		off += uint64(c)
		i++
	}
}

// copyIn copies b to the region's bytes at [off, off+len(b)).
func (r *Region) copyIn(b []byte, off uint64) {
	i := r.find(off)
	for len(b) > 0 {
		c := copy(r.bufs[i][off-r.starts[i]:], b)
		b = b[c:]
		off += uint64(c)
		i++
	}
}

// WriteAt writes b to the region at offset off (counted from its start)
// for a local writer while snapshots may exist: it copies the pages
// snapshots share first, waiting while another writer copies them, and a
// snapshot holds all of it or none. It fails with ErrBounds for a range
// outside the region and ErrInvalid once the region is deregistered.
func (r *Region) WriteAt(b []byte, off int64) (int, error) {
	if off < 0 || !r.Contains(uint64(off), uint64(len(b))) {
		return 0, fmt.Errorf("%w: %d bytes at offset %d of a %d-byte region", ErrBounds, len(b), off, r.length)
	}
	if !r.TryHoldWrite() {
		if r.wuse.Load()&wFrozen != 0 {
			return 0, ErrFrozen
		}
		return 0, ErrInvalid
	}
	defer r.UnholdWrite()
	if len(b) == 0 {
		return 0, nil
	}
	if !r.CheckFile(uint64(off), uint64(len(b))) {
		return 0, fmt.Errorf("%w: %d bytes at offset %d: the file was truncated under the region", ErrFileRange, len(b), off)
	}
	if r.wuse.Load()&wCOW != 0 {
		r.unshare(uint64(off), uint64(len(b)))
	}
	r.copyIn(b, uint64(off))
	return len(b), nil
}

// cowInit returns the region's copy-on-write state, made on first use.
func (r *Region) cowInit() *cowState {
	if c := r.cow.Load(); c != nil {
		return c
	}
	c := &cowState{priv: make([]atomic.Uint64, (r.length+PageSize-1)/PageSize)}
	if !r.cow.CompareAndSwap(nil, c) {
		return r.cow.Load()
	}
	return c
}

// Snapshot takes a copy-on-write snapshot of the region: it copies
// nothing now, and each page later when it is first written. It waits
// for writes in progress (FPDUs being placed, WriteAts) to end, holding
// new ones back meanwhile, so the snapshot holds each of them wholly or
// not at all; if they have not ended when ctx is done or after a second
// (a peer stopped in the middle of an FPDU) it fails with ErrBusy.
//
// The snapshot pins the region: Deregister fails with ErrBusy until it is
// closed. Snapshot fails with ErrInvalid once Deregister has begun.
func (r *Region) Snapshot(ctx context.Context) (*Snapshot, error) {
	if !r.TryAcquire() {
		return nil, ErrInvalid
	}
	c := r.cowInit()
	c.taking.Lock()
	defer c.taking.Unlock()
	gate := make(chan struct{})
	c.mu.Lock()
	c.gate = gate
	c.mu.Unlock()
	r.wuse.Or(wGate)
	err := r.drainWrites(ctx, snapshotWait)
	var s *Snapshot
	c.mu.Lock()
	if err == nil {
		s = &Snapshot{r: r, c: c, epoch: c.epoch.Add(1), n: r.length, pages: make([]*page, len(c.priv))}
		c.snaps = append(c.snaps, s)
		r.wuse.Or(wCOW) // before the gate opens: a writer that passes it copies
	}
	r.wuse.And(^uint64(wGate))
	close(gate)
	c.mu.Unlock()
	if err != nil {
		r.Release()
		return nil, err
	}
	return s, nil
}

// drainWrites waits until no write hold is left, ctx is done or limit has
// passed. Holds last as long as one FPDU takes to arrive, so it yields
// first and sleeps only if that was not enough.
func (r *Region) drainWrites(ctx context.Context, limit time.Duration) error {
	var deadline time.Time
	sleep := 10 * time.Microsecond
	for i := 0; r.wuse.Load()&wWriters != 0; i++ {
		if i < 64 {
			runtime.Gosched()
			continue
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: writes still in progress: %w", ErrBusy, err)
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(limit)
		} else if now.After(deadline) {
			return fmt.Errorf("%w: writes still in progress after %v", ErrBusy, limit)
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, time.Millisecond)
	}
	return nil
}

// Len returns the snapshot's length: its region's.
func (s *Snapshot) Len() int { return int(s.n) }

// ReadAt reads the snapshot's bytes at [off, off+len(b)) into b, as
// io.ReaderAt does: fewer than len(b) only at the end, with io.EOF. It
// fails with ErrSnapshotClosed once the snapshot is closed. A writer of a
// page the snapshot still shares waits while ReadAt reads that page.
func (s *Snapshot) ReadAt(b []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: offset %d", ErrBounds, off)
	}
	want := len(b)
	if uint64(off) >= s.n {
		if want == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := min(uint64(want), s.n-uint64(off))
	b = b[:n]
	o := uint64(off)
	for len(b) > 0 {
		p := o / PageSize
		k := min(uint64(len(b)), (p+1)*PageSize-o)
		s.c.mu.Lock()
		if s.done {
			s.c.mu.Unlock()
			return int(o - uint64(off)), ErrSnapshotClosed
		}
		cp := s.pages[p]
		if cp == lostPage || cp == nil && !s.r.CheckFile(o, k) {
			s.c.mu.Unlock()
			return int(o - uint64(off)), fmt.Errorf("%w: page %d: the file was truncated under the region", ErrFileRange, p)
		}
		if cp != nil {
			copy(b[:k], cp[o-p*PageSize:])
		} else {
			s.r.copyOut(b[:k], o)
		}
		s.c.mu.Unlock()
		b = b[k:]
		o += k
	}
	if int(n) < want {
		return int(n), io.EOF
	}
	return int(n), nil
}

// Bytes returns a copy of the whole snapshot.
func (s *Snapshot) Bytes() ([]byte, error) {
	b := make([]byte, s.n)
	if _, err := s.ReadAt(b, 0); err != nil {
		return nil, err
	}
	return b, nil
}

// Close drops the snapshot and its copies, and unpins the region. A
// second Close fails with ErrSnapshotClosed.
func (s *Snapshot) Close() error {
	c := s.c
	c.mu.Lock()
	if s.done {
		c.mu.Unlock()
		return ErrSnapshotClosed
	}
	s.done = true
	s.pages = nil
	for i, o := range c.snaps {
		if o == s {
			c.snaps = append(c.snaps[:i], c.snaps[i+1:]...)
			break
		}
	}
	if len(c.snaps) == 0 {
		// No page is shared now: writes go on without looking.
		s.r.wuse.And(^uint64(wCOW))
	}
	c.mu.Unlock()
	s.r.Release()
	return nil
}
