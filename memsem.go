package gowarp

import (
	"os"

	"github.com/gowarp/gowarp/internal/engine"
	"github.com/gowarp/gowarp/internal/mem"
	"github.com/gowarp/gowarp/wire"
)

// Semantics is what an access through one key of a region means: the
// 8-bit key of an STag names it, so one region can be exposed to peers
// under several keys at once, each with its own (MR.Expose). See
// docs/memsem.md for what holds toward which peer.
type Semantics uint8

const (
	// Plain is ordinary memory: Writes are placed, Reads served.
	Plain = Semantics(mem.Plain)
	// Durable: a Write through the key is on the stable storage of the
	// region's file (msync of the pages it touched) before anything that
	// follows it on that queue pair is processed. File regions only.
	Durable = Semantics(mem.Durable)
	// ReadThrough: a Read through the key asks the kernel for all the
	// pages it serves at once (MADV_WILLNEED) before the response is
	// sent; pages not in the page cache are read from the file by the
	// goroutine serving that queue pair, never another's. For a shared
	// mapping, a page is "resident" when it is in the page cache, which
	// the mapping shares with every reader and writer of the file, so a
	// Read through any key sees the file's current contents; the key
	// changes when and by whom the file is read, not what is served.
	// File regions only.
	ReadThrough = Semantics(mem.ReadThrough)
	// Detached: the key stays valid but no longer reaches the region's
	// memory: a peer's Write through it is dropped, its Reads and atomics
	// read and change a small sink of the region's own. Retire gives a key
	// these semantics (Expose cannot); MR.Detach does it to every key.
	Detached = Semantics(mem.Detached)
)

func (s Semantics) String() string { return mem.Semantics(s).String() }

// Errors of file regions and keys.
var (
	// ErrFileRange: RegisterFile of a range past the file's end; MR.WriteAt
	// or Snapshot.ReadAt of pages a file region's file lost to truncation.
	ErrFileRange = mem.ErrFileRange
	// ErrNotFile: Durable or ReadThrough asked of a memory region.
	ErrNotFile = mem.ErrNotFile
	// ErrBadSemantics: a Semantics value that is none of the constants.
	ErrBadSemantics = mem.ErrBadSemantics
	// ErrNoKeys: Expose on a region that uses all 256 keys.
	ErrNoKeys = mem.ErrNoKeys
	// ErrKeyInUse: Expose of a key the region has already.
	ErrKeyInUse = mem.ErrKeyInUse
)

// FileOptions tune RegisterFile.
type FileOptions struct {
	// Semantics of the STag's own key (MR.STag); Plain by default.
	Semantics Semantics
	// Addr, Key, KeyFixed and Index are as in RegisterOptions.
	Addr     uint64
	Key      uint8
	KeyFixed bool
	Index    uint32
}

// RegisterFile maps length bytes of f from offset off (shared, read and
// write: f must be open read-write) and registers the mapping as a
// region: a peer's Writes land in the file's pages, its Reads are served
// from them, and MR.Bytes is the mapping. A length of 0 means up to the
// end of the file. The range must be inside the file (ErrFileRange).
// Deregister unmaps it, after the accesses under way, as for any region;
// f may be closed once RegisterFile returns.
//
// A file truncated under a live region does not kill the process: an
// access to the part cut off fails the queue pair with the Terminate it
// calls for (a Write: DDP base or bounds violation; a Read: RDMAP base
// or bounds violation). Only the application's own use of MR.Bytes past
// the file's end would still raise SIGBUS. Placement into a file region
// goes through the receive staging buffer (one copy more than memory),
// so that a fault is caught.
func (pd *PD) RegisterFile(f *os.File, off, length int64, access Access, o FileOptions) (*MR, error) {
	r, err := pd.tbl.t.RegisterFile(pd.id, f, off, length, mem.Access(access), mem.Semantics(o.Semantics),
		mem.Options{Addr: o.Addr, Key: o.Key, KeyFixed: o.KeyFixed, Index: o.Index})
	if err != nil {
		return nil, err
	}
	return pubMR(r), nil
}

// File reports whether the region maps a file (RegisterFile).
func (mr *MR) File() bool { return mr.r.File() }

// Expose gives the region one more key, with semantics s, and returns
// the STag that carries it: the same index as STag(), another key. A
// peer's access through it has the rights of the region and semantics s;
// the region keeps its other keys. The key is random. Durable and
// ReadThrough need a file region (ErrNotFile).
func (mr *MR) Expose(s Semantics) (STag, error) {
	st, err := mr.r.Expose(mem.Semantics(s), 0, false)
	return STag(st), err
}

// ExposeKey is Expose with the key chosen by the caller (ErrKeyInUse if
// the region has it already).
func (mr *MR) ExposeKey(s Semantics, key uint8) (STag, error) {
	st, err := mr.r.Expose(mem.Semantics(s), key, true)
	return STag(st), err
}

// Revoke removes a key Expose gave: from then on an access through it is
// an invalid STag, told to the peer with a Terminate.
func (mr *MR) Revoke(s STag) error { return mr.r.Revoke(mem.STag(s)) }

// Retire makes a key Expose gave Detached: from then on an access
// through it succeeds but reaches the region's sink, not its memory. Use
// it, rather than Revoke, for a key peers may still hold when what it
// named has gone (a block reused under a new key): through a revoked key
// the peer's next access is an invalid STag, and the Terminate that
// answers it ends the peer's connection with all its other work; through
// a retired one the access completes, and the peer must learn from what
// it reads that its address is stale (a header of its own, say).
// Accesses under way finish in the memory (InUse reports them). Revoke
// the key to end it.
func (mr *MR) Retire(s STag) error { return mr.r.Retire(mem.STag(s)) }

// Semantics returns the semantics of an access to the region through s,
// and false if s is not one of its STags.
func (mr *MR) Semantics(s STag) (Semantics, bool) {
	if s.Index() != mr.STag().Index() {
		return 0, false
	}
	sem, ok := mr.r.Semantics(s.Key())
	return Semantics(sem), ok
}

// FlushType is a flush's placement type, as IBTA's FLUSH names them.
type FlushType = wire.FlushType

const (
	// FlushVisibility: the Writes before the flush are placed, visible to
	// every reader of the peer's memory (global visibility).
	FlushVisibility = wire.FlushVisibility
	// FlushPersistence: they are also on the stable storage of the file
	// behind the peer's region (persistence).
	FlushPersistence = wire.FlushPersistence
)

// FlushWR is a flush (remote completion, after IBTA's FLUSH): once it
// completes (CompFlush), every Write posted before it on the queue pair
// is placed at the peer and, with FlushPersistence, on stable storage.
type FlushWR struct {
	ID    uint64
	Flags WRFlags // Signaled and Fence; a failed flush always completes
	Type  FlushType
	// RKey and RemoteAddr name the peer's region (through any of its
	// keys) and the start of the range; Length is the range's length,
	// 0 for the whole region.
	RKey       STag
	RemoteAddr uint64
	Length     uint64
}

// PostFlush queues a flush. It travels as a zero-length RDMA Read
// Request (it takes one of the ORD slots), so toward a peer that does not
// know flushes (siw) it is still a placement fence: its completion means
// the peer processed every earlier Write. A gowarp peer checks it as an
// access (an unknown key, a range outside the region, a region without
// RemoteWrite, persistence of a memory region: a Terminate, and the
// flush completes with an error) and carries it out before it answers.
func (qp *QP) PostFlush(wr *FlushWR) error {
	return qp.q.PostFlush(wr.ID, engine.WRFlags(wr.Flags), wr.Type, uint32(wr.RKey), wr.RemoteAddr, wr.Length)
}
