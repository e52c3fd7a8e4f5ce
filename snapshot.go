package gowarp

import (
	"context"

	"github.com/gowarp/gowarp/internal/mem"
)

// Snapshot is a copy-on-write view of a memory region's content at one
// moment, taken with MR.Snapshot while peers go on writing the region. It
// shares the region's pages until they are written: the first write to a
// shared page (a peer's placement or MR.WriteAt) copies that page for
// the snapshot first, then goes on in place.
//
// A snapshot holds each FPDU a peer placed in the region wholly or not at
// all, and for each queue pair a prefix of the FPDUs it placed: a Write
// that fits one FPDU is all in or all out; one of several FPDUs may be in
// by its first FPDUs (RDMA gives no atomicity beyond the FPDU, to a local
// reader either). Each MR.WriteAt is all in or all out.
type Snapshot struct{ s *mem.Snapshot }

// PageSize is the unit in which a Snapshot shares and copies a region.
const PageSize = mem.PageSize

// Snapshot takes a copy-on-write snapshot of the region: it copies
// nothing now, and each page later when it is first written. It waits
// for the FPDUs being placed in the region and the WriteAts in progress
// to end, holding new ones back meanwhile (they are not lost: they wait),
// and fails with ErrRegionBusy if they have not ended when ctx is done or
// after a second, as when a peer stops in the middle of an FPDU.
//
// While a snapshot is open the region is pinned: Deregister fails with
// ErrRegionBusy. Snapshot fails with ErrRegionInvalid once the region is
// deregistered. To write the region locally while snapshots may exist,
// use WriteAt: a store straight into its buffers would change them.
func (mr *MR) Snapshot(ctx context.Context) (*Snapshot, error) {
	s, err := mr.r.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return &Snapshot{s}, nil
}

// WriteAt writes b into the region at offset off (from the region's
// start, across its buffers), for a local writer while snapshots may
// exist: the pages snapshots share are copied first (a writer waits while
// another copies them), and a snapshot taken meanwhile holds all of the
// write or none of it. It fails with ErrOutOfBounds for a range outside
// the region, ErrRegionInvalid once the region is deregistered and
// ErrFileRange for pages of a file region whose file was truncated.
func (mr *MR) WriteAt(b []byte, off int64) (int, error) { return mr.r.WriteAt(b, off) }

// Len returns the snapshot's length, its region's.
func (s *Snapshot) Len() int { return s.s.Len() }

// ReadAt reads the snapshot's bytes at offset off into b, as io.ReaderAt
// does (fewer than len(b) only at the end, with io.EOF). It fails with
// ErrSnapshotClosed once the snapshot is closed, ErrFileRange for a page
// of a file region that its file lost to truncation before it was copied. A write to a page the
// snapshot still shares waits while ReadAt reads that page.
func (s *Snapshot) ReadAt(b []byte, off int64) (int, error) { return s.s.ReadAt(b, off) }

// Bytes returns a copy of the whole snapshot, or ErrSnapshotClosed.
func (s *Snapshot) Bytes() ([]byte, error) { return s.s.Bytes() }

// Close drops the snapshot and its copied pages, and unpins the region.
// A second Close fails with ErrSnapshotClosed.
func (s *Snapshot) Close() error { return s.s.Close() }
