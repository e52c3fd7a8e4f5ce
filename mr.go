package gowarp

import (
	"context"
	"sync/atomic"
	"unsafe"

	"github.com/gowarp/gowarp/internal/mem"
)

// MR is a registered memory region. Its STag is both the local key in
// SGEs (through the *MR itself) and the remote key peers use.
type MR struct {
	// r is the region itself, by value, so that an *MR and the engine's
	// *mem.Region are one address and SGEs pass to the engine uncopied.
	r mem.Region
}

// pubMR returns the *MR of an engine region (nil for nil).
func pubMR(r *mem.Region) *MR { return (*MR)(unsafe.Pointer(r)) }

// STag returns the region's steering tag: the remote key a peer names in
// an RDMA Write or Read.
func (mr *MR) STag() STag { return STag(mr.r.STag()) }

// Addr returns the tagged offset of the region's first byte: the remote
// address a peer names.
func (mr *MR) Addr() uint64 { return mr.r.Addr() }

// Len returns the region's length in bytes.
func (mr *MR) Len() int { return mr.r.Len() }

// Access returns the region's rights.
func (mr *MR) Access() Access { return Access(mr.r.Access()) }

// Bytes returns the region's memory when it is a single buffer, else nil.
func (mr *MR) Bytes() []byte { return mr.r.Bytes() }

// Buffers returns the region's buffers in tagged-offset order.
func (mr *MR) Buffers() [][]byte { return mr.r.Buffers() }

// Valid reports whether the region's STag is still valid: false once it
// is deregistered or invalidated by a peer's Send with Invalidate.
func (mr *MR) Valid() bool { return mr.r.Valid() }

// InUse reports whether outstanding work requests (or a Prepared) pin the
// region, so that Deregister would fail with ErrRegionBusy.
func (mr *MR) InUse() bool { return mr.r.InUse() }

// Placed returns the number of bytes peers have placed into the region
// (RDMA Writes and Read Responses) since registration. It is updated
// after the bytes are in memory, so a goroutine that sees it change may
// read them: the way to receive a one-sided Write without a completion.
func (mr *MR) Placed() uint64 { return mr.r.Placed() }

// Reads returns the number of peers' RDMA Read Requests served from the
// region since registration (those that passed their checks): how often
// one-sided readers used it, which its owner's CPU does not otherwise see.
func (mr *MR) Reads() uint64 { return mr.r.Reads() }

// WaitPlaced waits, without polling, until Placed reaches n: to wait for
// the next k bytes pass Placed()+k, read before the peer is told to
// write. It returns nil once the bytes are in memory, ctx.Err() when ctx
// ends first and ErrRegionInvalid when the region is deregistered or
// invalidated meanwhile. A wait that cannot return at once costs one
// small allocation. A region belongs to no one queue pair, so a peer that
// goes does not end the wait: cancel ctx when QP.Done closes for that.
func (mr *MR) WaitPlaced(ctx context.Context, n uint64) error { return mr.r.WaitPlaced(ctx, n) }

// Deregister removes the region: it fails with ErrRegionBusy while work
// requests pin it (and ErrNotRegistered the second time), and once it
// returns nil no peer or local access touches the memory again.
func (mr *MR) Deregister() error { return mr.r.Deregister() }

// Detach ends peers' reach into the region's memory but not its STag:
// from its return on, peers' RDMA Writes to the region land in a small
// sink of the region's own and are dropped, their Reads and atomics read
// and change that sink, and none of them fails. Use it for a region lent
// to a peer for one request when the request is given up (a deadline, a
// cancellation) while the peer may still be using it: deregistering then
// would make the peer's next access an invalid STag, and RFC 5040 answers
// that with a Terminate that ends the connection and all its other work.
// Deregister the region once the peer has said it is done, or the
// connection has ended. Local work requests still reach the memory.
//
// Detach waits for peers' accesses in progress to end (one FPDU, or one
// Read Response being sent), until ctx is done; it fails with
// ErrRegionBusy if they have not, and ErrRegionInvalid on a deregistered
// region. Detaching twice is detaching once.
func (mr *MR) Detach(ctx context.Context) error { return mr.r.Detach(ctx) }

// Detached reports whether Detach was called on the region.
func (mr *MR) Detached() bool { return mr.r.Detached() }

// STag is a steering tag: a 24-bit index and an 8-bit key.
type STag uint32

// Index returns the 24-bit STag index.
func (s STag) Index() uint32 { return mem.STag(s).Index() }

// Key returns the 8-bit consumer key.
func (s STag) Key() uint8 { return mem.STag(s).Key() }

func (s STag) String() string { return mem.STag(s).String() }

// Access is a set of rights on a memory region.
type Access uint8

// Access rights.
const (
	LocalWrite       Access = 1 << iota // receives and Read sinks may write it
	RemoteRead                          // peers may RDMA Read it
	RemoteWrite                         // peers may RDMA Write it
	RemoteInvalidate                    // a peer's Send with Invalidate may kill its STag
	RemoteAtomic                        // peers may run atomic operations on it (RFC 7306)
)

func (a Access) String() string { return mem.Access(a).String() }

// AtomicAdd adds delta to the 8-byte word at offset off of the region (a
// uint64 in the machine's byte order, 8-byte aligned in memory) and
// returns its original value. It is atomic against peers' atomic
// operations on the same word (OpFetchAdd, OpCmpSwap, OpAtomicWrite) and
// other local ones; not against RDMA Writes.
func (mr *MR) AtomicAdd(off int, delta uint64) (uint64, error) {
	w, err := mr.holdWord(off)
	if err != nil {
		return 0, err
	}
	defer mr.r.UnholdWrite()
	return atomic.AddUint64(w, delta) - delta, nil
}

// CompareAndSwap replaces the 8-byte word at offset off by new if it
// equals old, atomically as AtomicAdd, and returns its original value.
func (mr *MR) CompareAndSwap(off int, old, new uint64) (uint64, error) {
	w, err := mr.holdWord(off)
	if err != nil {
		return 0, err
	}
	defer mr.r.UnholdWrite()
	for {
		cur := atomic.LoadUint64(w)
		if cur != old || atomic.CompareAndSwapUint64(w, old, new) {
			return cur, nil
		}
	}
}

// AtomicLoad returns the 8-byte word at offset off, read atomically.
func (mr *MR) AtomicLoad(off int) (uint64, error) {
	w, err := mr.word(off)
	if err != nil {
		return 0, err
	}
	return atomic.LoadUint64(w), nil
}

// holdWord is word for an operation that may change it: under a write
// hold, ended with UnholdWrite, its page copied first for the snapshots
// that share it, so that a snapshot sees the operation wholly or not at
// all, as it does a WriteAt.
func (mr *MR) holdWord(off int) (*uint64, error) {
	if _, err := mr.word(off); err != nil {
		return nil, err
	}
	if !mr.r.TryHoldWrite() {
		return nil, ErrRegionInvalid
	}
	return mr.r.WriteWord(uint64(off)), nil
}

func (mr *MR) word(off int) (*uint64, error) {
	if off < 0 {
		return nil, ErrBadAtomic
	}
	w := mr.r.Word(uint64(off))
	if w == nil {
		return nil, ErrBadAtomic
	}
	return w, nil
}
