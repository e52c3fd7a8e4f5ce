// Package mem is gowarp's memory registry: regions of registered memory,
// the STags that name them, and the checks every access goes through.
//
// An STag is a 24-bit index and an 8-bit consumer key (RFC 5040 §2.1). A
// Table maps indexes to regions. A region is one or more buffers presented
// as one contiguous range of tagged offsets (TOs) starting at its base
// address, so a region made of several buffers is reached with one STag.
package mem

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Access is a set of rights on a region.
type Access uint8

const (
	// LocalWrite lets local work requests write the region: receive
	// buffers and the sink of an RDMA Read.
	LocalWrite Access = 1 << iota
	// RemoteRead lets peers read the region with RDMA Read.
	RemoteRead
	// RemoteWrite lets peers write the region with RDMA Write.
	RemoteWrite
	// RemoteInvalidate lets a peer invalidate the region's STag with a
	// Send with Invalidate.
	RemoteInvalidate
	// RemoteAtomic lets peers run RFC 7306 atomic operations on it.
	RemoteAtomic
)

func (a Access) String() string {
	if a == 0 {
		return "none"
	}
	s := ""
	for i, n := range []string{"local-write", "remote-read", "remote-write", "remote-invalidate", "remote-atomic"} {
		if a&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	return s
}

// STag is a steering tag: index<<8 | key.
type STag uint32

// Index returns the 24-bit index.
func (s STag) Index() uint32 { return uint32(s) >> 8 }

// Key returns the 8-bit consumer key.
func (s STag) Key() uint8 { return uint8(s) }

func (s STag) String() string { return fmt.Sprintf("%#08x", uint32(s)) }

// Reason says why an access was refused. The engine turns it into the
// Terminate code the RFCs name for the operation at hand.
type Reason uint8

const (
	OK            Reason = iota
	InvalidSTag          // no region at this index, wrong key, or invalidated
	BaseBounds           // the range is not inside the region
	AccessRights         // the region does not grant the right
	NotAssociated        // the region belongs to another protection domain
	TOWrap               // TO + length overflows 64 bits
)

func (r Reason) String() string {
	return [...]string{"ok", "invalid STag", "base or bounds violation", "access rights violation",
		"STag not associated with this connection", "tagged offset wrap"}[r]
}

// Errors of registration and deregistration.
var (
	ErrBusy       = errors.New("gowarp: region is in use by outstanding work")
	ErrEmpty      = errors.New("gowarp: cannot register an empty buffer")
	ErrTableFull  = errors.New("gowarp: STag table is full")
	ErrNotInTable = errors.New("gowarp: region is not registered in this table")
	ErrBadAccess  = errors.New("gowarp: invalid access flags")
	ErrAddrWrap   = errors.New("gowarp: region wraps the address space")
	ErrInvalid    = errors.New("gowarp: region is no longer valid")
	ErrIndexInUse = errors.New("gowarp: the STag index is in use")
)

// Region is registered memory: one or more buffers seen as one range of
// tagged offsets [Addr, Addr+Len).
type Region struct {
	stag   STag
	pd     uint32
	access Access
	base   uint64
	length uint64
	// bufs are the region's buffers in TO order; starts[i] is the offset of
	// bufs[i] from the base. One buffer is the common case and the fast path.
	bufs   [][]byte
	starts []uint64
	table  *Table

	// file is the mapping of a file-backed region (RegisterFile), nil for
	// memory. sem is the semantics of the STag's own key; keys, if set,
	// holds the region's further keys (Expose), replaced whole on change
	// so that Lookup reads it without a lock.
	file *fileMap
	// shared is the memory of a region made by RegisterShared or
	// RegisterAnon (FD -1), nil for others: in the struct already, so
	// the second costs the region no field.
	shared *Shared
	sem    Semantics
	keys   atomic.Pointer[keySet]

	// id names the region in the process, never another (ID).
	id uint64

	valid atomic.Bool
	// use counts the region's users (see the use* constants): pins of
	// posted work requests and Prepared handles, which make Deregister
	// refuse, and holds of accesses in progress (a placement, a Read
	// Response or a batch being written), which Deregister waits for. Its
	// top bit is set once Deregister has begun: no pin or hold is granted
	// after that, so when the holds drain nothing can touch the memory.
	use    atomic.Uint64
	placed atomic.Uint64 // bytes placed into the region by peers
	reads  atomic.Uint64 // Read Requests of peers served from the region
	// wuse counts the writes to the region's memory in progress (placements,
	// WriteAt) and carries the flags they look at (see cow.go).
	wuse atomic.Uint64
	cow  atomic.Pointer[cowState] // made by the first Snapshot
	// sink is what peers reach once the region is detached (detach.go):
	// set before wDetach, never changed after.
	sink []byte

	// WaitPlaced's waiters; nwait counts them so that AddPlaced, on the
	// receive path, takes no lock while nobody waits.
	nwait   atomic.Int32
	wmu     sync.Mutex
	waiters []*placedWaiter
}

// placedWaiter is one WaitPlaced call: ch is closed once placed reaches n
// or the region becomes invalid.
type placedWaiter struct {
	n  uint64
	ch chan struct{}
}

// The fields of Region.use.
const (
	useClosed = 1 << 63            // Deregister has begun
	usePin    = 1 << 32            // one pin
	usePins   = useClosed - usePin // the pin count's bits
	useHolds  = usePin - 1         // the hold count's bits
)

// regionIDs numbers the regions made in the process (Region.ID).
var regionIDs atomic.Uint64

// ID returns a number that names the region and will never name another
// in this process: a cache of work-request shapes keeps it rather than
// the *Region, which would keep a deregistered region's memory alive.
func (r *Region) ID() uint64 { return r.id }

// STag returns the region's steering tag (the rkey/lkey of libibverbs).
func (r *Region) STag() STag { return r.stag }

// Addr returns the tagged offset of the region's first byte.
func (r *Region) Addr() uint64 { return r.base }

// Len returns the region's length in bytes.
func (r *Region) Len() int { return int(r.length) }

// Access returns the region's rights.
func (r *Region) Access() Access { return r.access }

// PD returns the protection domain the region belongs to.
func (r *Region) PD() uint32 { return r.pd }

// Buffers returns the region's buffers in TO order.
func (r *Region) Buffers() [][]byte { return r.bufs }

// Bytes returns the region's memory when it is a single buffer, else nil.
func (r *Region) Bytes() []byte {
	if len(r.bufs) == 1 {
		return r.bufs[0]
	}
	return nil
}

// Valid reports whether the region's STag is still valid.
func (r *Region) Valid() bool { return r.valid.Load() }

// Placed returns the number of bytes peers have placed into the region
// (RDMA Writes and Read Responses). It is updated atomically after the
// bytes are in memory, so a goroutine that sees it change may read them:
// the way to wait for a one-sided write without a completion.
func (r *Region) Placed() uint64 { return r.placed.Load() }

// Reads returns the number of peers' RDMA Read Requests that passed
// their checks against the region (and so are answered from it).
func (r *Region) Reads() uint64 { return r.reads.Load() }

// AddRead records one Read Request served from the region.
func (r *Region) AddRead() { r.reads.Add(1) }

// AddPlaced records n bytes placed by a peer.
func (r *Region) AddPlaced(n int) {
	v := r.placed.Add(uint64(n))
	// Sequentially consistent with WaitPlaced's nwait.Add then placed.Load:
	// either this sees the waiter, or the waiter sees v.
	if r.nwait.Load() > 0 {
		r.wake(v, r.valid.Load())
	}
}

// WaitPlaced blocks until peers have placed at least n bytes into the
// region in all (Placed() >= n), or ctx is done. Placed counts from
// registration on, so to wait for the next k bytes pass Placed()+k, read
// before the peer is told to write. It returns nil once the bytes are in
// memory and may be read; ctx.Err() when ctx ends first; ErrInvalid
// (gowarp.ErrRegionInvalid) when the region is deregistered or invalidated before, since nothing
// more can be placed then.
//
// The goroutine that places the bytes wakes the waiter: no goroutine is
// started and nothing polls. A wait that cannot return at once costs one
// small allocation; any number of goroutines may wait.
func (r *Region) WaitPlaced(ctx context.Context, n uint64) error {
	if r.placed.Load() >= n {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	w := &placedWaiter{n: n, ch: make(chan struct{})}
	r.wmu.Lock()
	r.waiters = append(r.waiters, w)
	r.nwait.Add(1)
	r.wmu.Unlock()
	// Placements (or an invalidation) between the first look and the
	// registration woke nobody: look again.
	if v := r.placed.Load(); v >= n || !r.valid.Load() {
		r.wake(v, r.valid.Load())
	}
	select {
	case <-w.ch:
	case <-ctx.Done():
		r.wmu.Lock()
		if i := slices.Index(r.waiters, w); i >= 0 {
			r.waiters = slices.Delete(r.waiters, i, i+1)
			r.nwait.Add(-1)
		}
		r.wmu.Unlock()
	}
	switch {
	case r.placed.Load() >= n:
		return nil
	case !r.valid.Load():
		return ErrInvalid
	}
	return ctx.Err()
}

// wake releases the waiters whose count v reaches, or all of them when the
// region is no longer valid.
func (r *Region) wake(v uint64, valid bool) {
	r.wmu.Lock()
	ws := r.waiters[:0]
	for _, w := range r.waiters {
		if w.n <= v || !valid {
			close(w.ch)
		} else {
			ws = append(ws, w)
		}
	}
	clear(r.waiters[len(ws):])
	r.waiters = ws
	r.nwait.Store(int32(len(ws)))
	r.wmu.Unlock()
}

// TryAcquire pins the region for a local work request (a posted SGE, a
// Prepared handle) unless Deregister has begun; Deregister refuses while
// pins are held. The pin is taken before the region is judged valid, so
// a Deregister either sees it or is seen by it.
func (r *Region) TryAcquire() bool {
	for {
		u := r.use.Load()
		if u&useClosed != 0 {
			return false
		}
		if r.use.CompareAndSwap(u, u+usePin) {
			return true
		}
	}
}

// Acquire pins the region once more. The caller must hold a pin on it
// already (TryAcquire): only then is the region certain not to be
// deregistered.
func (r *Region) Acquire() { r.use.Add(usePin) }

// Release undoes Acquire or TryAcquire.
func (r *Region) Release() { r.use.Add(^uint64(usePin - 1)) }

// TryHold marks a read of the region's memory in progress (a Read
// Request being answered, a batch being written) unless Deregister has
// begun; writes take TryHoldWrite. Deregister waits for holds to end. It is
// one atomic add: the data path's cost of Deregister's guarantee.
func (r *Region) TryHold() bool {
	if r.use.Add(1)&useClosed != 0 {
		r.use.Add(^uint64(0))
		return false
	}
	return true
}

// Hold adds a hold. The caller must hold a pin or a hold on the region
// already, which keeps Deregister from finishing.
func (r *Region) Hold() { r.use.Add(1) }

// Unhold ends a hold.
func (r *Region) Unhold() { r.use.Add(^uint64(0)) }

// InUse reports whether work is outstanding on the region.
func (r *Region) InUse() bool {
	return r.use.Load()&(usePins|useHolds) != 0 || r.wuse.Load()&wWriters != 0
}

// Contains reports whether [off, off+n) lies inside the region, offsets
// counted from the region's start.
func (r *Region) Contains(off, n uint64) bool {
	return off <= r.length && n <= r.length-off
}

// Slices appends to dst the pieces of the region's memory covering
// [off, off+n), offsets counted from the region's start. The range must be
// inside the region (see Contains).
func (r *Region) Slices(dst [][]byte, off, n uint64) [][]byte {
	if len(r.bufs) == 1 {
		return append(dst, r.bufs[0][off:off+n:off+n])
	}
	i := r.find(off)
	for n > 0 {
		b := r.bufs[i][off-r.starts[i]:]
		if uint64(len(b)) > n {
			b = b[:n:n]
		}
		dst = append(dst, b)
		n -= uint64(len(b))
		off += uint64(len(b))
		i++
	}
	return dst
}

// SlicesFit returns how many of the n bytes from off Slices covers in at
// most max pieces (n where they take no more), and in how many. A caller
// whose vectors are bounded frames no more than that, so that Slices
// never grows them. Every piece holds a byte at least (insert drops empty
// buffers).
func (r *Region) SlicesFit(off, n uint64, max int) (uint64, int) {
	if n == 0 || max <= 0 {
		return 0, 0
	}
	if len(r.bufs) == 1 {
		return n, 1
	}
	got, k := uint64(0), 0
	for i := r.find(off); n > 0 && k < max; i, k = i+1, k+1 { // as Slices walks them
		c := min(n, uint64(len(r.bufs[i]))-(off-r.starts[i]))
		got, n, off = got+c, n-c, off+c
	}
	return got, k
}

// find returns the index of the buffer holding offset off.
func (r *Region) find(off uint64) int {
	lo, hi := 0, len(r.starts)-1
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if r.starts[mid] <= off {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// CheckRemote checks a peer's access to [to, to+n) with the given right
// through a connection of protection domain pd.
func (r *Region) CheckRemote(pd uint32, want Access, to uint64, n uint64) Reason {
	switch {
	case !r.valid.Load():
		return InvalidSTag
	case r.pd != pd:
		return NotAssociated
	case r.access&want != want:
		return AccessRights
	case to+n < to:
		return TOWrap
	case to < r.base || !r.Contains(to-r.base, n):
		return BaseBounds
	}
	return OK
}

// Options tune a registration.
type Options struct {
	// Addr is the tagged offset of the region's first byte. Zero means
	// the address of the first buffer in this process, the convention of
	// libibverbs and siw, which peers expect.
	Addr uint64
	// Key is the consumer key, the STag's low 8 bits. Zero, unless
	// KeyFixed is set, means a random key.
	Key uint8
	// KeyFixed keeps Key even when it is zero.
	KeyFixed bool
	// Index, if not zero, is the STag index the region must have (a
	// server re-registering its regions under the STags its clients know,
	// after a restart): ErrIndexInUse if another region has it.
	Index uint32
}

// Table is an STag table: the regions reachable through a set of
// connections. A node may keep several, one per network identity.
//
// A peer that holds one STag must not be able to name another: in a server
// whose clients share a protection domain the STag is the only wall
// between them. So, as hardware does, each registration draws its index
// (and its key, unless the caller picks one) at random, from a generator
// seeded by crypto/rand.
type Table struct {
	mu      sync.RWMutex
	regions map[uint32]*Region
	rng     *rand.ChaCha8 // under mu
	// frozen: an export holds the table still (see migrate.go). Set and
	// cleared under mu; Invalidate reads it without.
	frozen atomic.Bool
	// Owner is the API's value for the table (the root package's Table),
	// set once before the table is used.
	Owner any
}

// NewTable returns an empty table.
func NewTable() *Table {
	var seed [32]byte
	crand.Read(seed[:]) // never fails (crypto/rand, Go 1.24)
	return &Table{regions: make(map[uint32]*Region), rng: rand.NewChaCha8(seed)}
}

// indexDraws is how many random indexes Register tries before it scans:
// with the table a quarter full, all fail once in 2^128 registrations.
const indexDraws = 64

// Register makes bufs a region of protection domain pd.
func (t *Table) Register(pd uint32, bufs [][]byte, access Access, o Options) (*Region, error) {
	if access&^(LocalWrite|RemoteRead|RemoteWrite|RemoteInvalidate|RemoteAtomic) != 0 {
		return nil, fmt.Errorf("%w: %#x", ErrBadAccess, uint8(access))
	}
	r := &Region{pd: pd, access: access, table: t}
	if err := t.insert(r, bufs, o); err != nil {
		return nil, err
	}
	return r, nil
}

// insert gives r the buffers and an STag in the table, and makes it valid.
func (t *Table) insert(r *Region, bufs [][]byte, o Options) error {
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		r.starts = append(r.starts, r.length)
		r.bufs = append(r.bufs, b[:len(b):len(b)])
		r.length += uint64(len(b))
	}
	if r.length == 0 {
		return ErrEmpty
	}
	r.base = o.Addr
	if r.base == 0 {
		r.base = uint64(uintptr(unsafe.Pointer(&r.bufs[0][0])))
	}
	if r.base+r.length < r.base {
		return fmt.Errorf("%w: %#x + %d bytes", ErrAddrWrap, r.base, r.length)
	}
	if o.Index > 0xffffff {
		return fmt.Errorf("%w: %#x is more than 24 bits", ErrIndexInUse, o.Index)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.frozen.Load() {
		return ErrFrozen
	}
	x := t.rng.Uint64()
	key := uint8(x >> 32)
	if o.Key != 0 || o.KeyFixed {
		key = o.Key
	}
	if o.Index != 0 {
		if t.regions[o.Index] != nil {
			return fmt.Errorf("%w: %#x", ErrIndexInUse, o.Index)
		}
		x = uint64(o.Index)
	}
	// Index 0 is never used, so that STag 0 (and siw's RTR STag 1) are
	// always invalid.
	idx := uint32(x) & 0xffffff
	for i := 0; idx == 0 || t.regions[idx] != nil; i++ {
		switch {
		case i < indexDraws:
			idx = uint32(t.rng.Uint64()) & 0xffffff
		case len(t.regions) >= 1<<24-1:
			return ErrTableFull
		default: // nearly full: the next free index from the last draw
			idx = (idx + 1) & 0xffffff
		}
	}
	r.stag = STag(idx<<8 | uint32(key))
	r.id = regionIDs.Add(1)
	t.regions[idx] = r
	r.valid.Store(true)
	return nil
}

// deregisterWait bounds how long Deregister waits for accesses in
// progress: a peer that stops in the middle of an FPDU written into the
// region, or does not read the Read Response it asked for, holds it.
var deregisterWait = time.Second

// Deregister removes r from the table. It fails with ErrBusy, changing
// nothing, while work requests or Prepared handles pin the region.
// Otherwise it invalidates the STag at once, so that no new access
// begins, and waits for accesses in progress to end: once it returns nil,
// neither a peer nor the engine touches the memory again. If they have
// not ended within deregisterWait it fails with ErrBusy; the STag stays
// invalid and Deregister may be called again.
func (t *Table) Deregister(r *Region) error {
	idx := r.stag.Index()
	t.mu.Lock()
	if t.regions[idx] != r {
		t.mu.Unlock()
		return ErrNotInTable
	}
	if t.frozen.Load() {
		t.mu.Unlock()
		return ErrFrozen
	}
	for {
		u := r.use.Load()
		if pins := u & usePins; pins != 0 {
			t.mu.Unlock()
			return fmt.Errorf("%w: %d work requests pin it", ErrBusy, pins/usePin)
		}
		if r.use.CompareAndSwap(u, u|useClosed) {
			break
		}
	}
	r.wuse.Or(wClosed)
	r.valid.Store(false)
	r.wake(r.placed.Load(), false) // nothing more can be waited for
	t.mu.Unlock()
	if !r.drain(context.Background(), deregisterWait) {
		return fmt.Errorf("%w: accesses by peers still in progress after %v; the STag is invalid, deregister again", ErrBusy, deregisterWait)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.regions[idx] != r {
		return ErrNotInTable // a concurrent Deregister finished first
	}
	delete(t.regions, idx)
	if r.file != nil {
		return r.file.unmap()
	}
	if r.shared != nil {
		return r.shared.free()
	}
	return nil
}

// drain waits until no hold is left on r, or ctx is done or limit has
// passed. Holds last as long as one FPDU takes to arrive or one batch to
// be written, so it yields first and sleeps only if that was not enough.
func (r *Region) drain(ctx context.Context, limit time.Duration) bool {
	var deadline time.Time
	sleep := 10 * time.Microsecond
	for i := 0; r.use.Load()&useHolds != 0 || r.wuse.Load()&wWriters != 0; i++ {
		if i < 64 {
			runtime.Gosched()
			continue
		}
		if ctx.Err() != nil {
			return false
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(limit)
		} else if now.After(deadline) {
			return false
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, time.Millisecond)
	}
	return true
}

// Lookup finds the region an STag names. A wrong key or an invalidated
// region is InvalidSTag, as siw does (full 32-bit match). The region may
// be deregistered at any moment after: take a hold (TryHold) before
// touching its memory, and judge it (CheckRemote) after.
func (t *Table) Lookup(s STag) (*Region, Reason) {
	t.mu.RLock()
	r := t.regions[s.Index()]
	t.mu.RUnlock()
	if r == nil || (r.stag != s && !r.hasKey(s.Key())) || !r.valid.Load() {
		return nil, InvalidSTag
	}
	return r, OK
}

// LookupHold finds the region an STag names, as Lookup does, and takes a
// hold on it (TryHold). The caller checks the access (CheckRemote) and
// ends the hold (Unhold) when it is done with the memory.
func (t *Table) LookupHold(s STag) (*Region, Reason) {
	r, why := t.Lookup(s)
	if why != OK {
		return nil, why
	}
	if !r.TryHold() {
		return nil, InvalidSTag // deregistered meanwhile
	}
	return r, OK
}

// LookupHoldWrite is LookupHold for a write to the region's memory (a
// peer's Write being placed): it takes a write hold (TryHoldWrite), ended
// with UnholdWrite.
func (t *Table) LookupHoldWrite(s STag) (*Region, Reason) {
	r, why := t.Lookup(s)
	if why != OK {
		return nil, why
	}
	if !r.TryHoldWrite() {
		return nil, InvalidSTag // deregistered meanwhile
	}
	return r, OK
}

// Invalidate invalidates the region an STag names, as a peer's Send with
// Invalidate asks. It fails unless the region allows remote invalidation
// and belongs to pd.
func (t *Table) Invalidate(pd uint32, s STag) Reason {
	r, why := t.Lookup(s)
	if why != OK {
		return why
	}
	if t.frozen.Load() {
		return InvalidSTag // the table is being exported: its state stays as copied
	}
	if r.pd != pd {
		return NotAssociated
	}
	if r.access&RemoteInvalidate == 0 {
		return AccessRights
	}
	r.valid.Store(false)
	r.wake(r.placed.Load(), false)
	return OK
}

// Len returns the number of registered regions.
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.regions)
}
