package mem

import (
	"context"
	"fmt"
)

// Detaching a region ends its peers' reach into its memory but not its
// STag. A region lent to a peer for one request (an RPC's argument or
// result buffer) must be out of the peer's reach when its owner gives up
// waiting; but the peer may have a Write or a Read of it on the wire
// already, and deregistering at once makes that access an invalid STag,
// which RFC 5040 answers with a Terminate: the whole connection dies for
// one request's deadline. A detached region stays valid, and what peers
// write to it lands in a small sink of its own, what they read of it is
// read from there: so no access fails and none touches the memory. The
// owner deregisters it once the peer says it is done (or the connection
// ends); local work requests still reach the memory.
//
// A key can be detached alone (Retire): the region's other keys still
// reach the memory. The data path pays a compare with the key's
// semantics, which a Write looks up already (Durable), and a load of the
// flags in wuse, which WriteSlices loads already. Peers' bytes meet in
// the sink and mean nothing: two connections writing one sink at once
// race, harmlessly, over garbage.

// sinkMax bounds a detached region's sink: peers' accesses wrap around
// it. Sinks are made only when a region is detached.
const sinkMax = 4096

// Detach makes peers' accesses to the region reach a sink instead of its
// memory, and waits for those in progress to end, until ctx is done or as
// long as Deregister would. Once it returns nil no peer access touches the
// memory again, while the STag stays valid (Deregister ends it).
// Detaching twice is detaching once.
func (r *Region) Detach(ctx context.Context) error {
	if !r.valid.Load() {
		return ErrInvalid
	}
	r.makeSink()
	r.wuse.Or(wDetach) // after the sink is made: who sees the flag sees the sink
	// An access that looked at the flags before it was set took its hold
	// before it looked (TryHold, TryHoldWrite), so it is still counted.
	if !r.drain(ctx, deregisterWait) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: accesses by peers still in progress: %w", ErrBusy, err)
		}
		return fmt.Errorf("%w: accesses by peers still in progress after %v", ErrBusy, deregisterWait)
	}
	return nil
}

// makeSink gives the region its sink, once.
func (r *Region) makeSink() {
	r.wmu.Lock()
	if r.sink == nil {
		r.sink = make([]byte, min((r.length+7)&^7, sinkMax))
	}
	r.wmu.Unlock()
}

// Detached reports whether the region is detached.
func (r *Region) Detached() bool { return r.wuse.Load()&wDetach != 0 }

// RemoteWriteSlices is WriteSlices for a peer's tagged Write through a
// key of semantics sem: the sink's pieces once the region is detached or
// the key retired, and then true (the bytes are not the region's: they do
// not count as placed).
func (r *Region) RemoteWriteSlices(dst [][]byte, sem Semantics, off, n uint64) ([][]byte, bool) {
	v := r.wuse.Load() // once: the flags WriteSlices looks at too
	if sem == Detached || v&wDetach != 0 {
		return r.sinkSlices(dst, off, n), true
	}
	if v&wCOW != 0 && n > 0 {
		r.unshare(off, n)
	}
	return r.Slices(dst, off, n), false
}

// RemoteSlices is Slices for a peer's Read through a key of semantics
// sem, under a hold: the sink's pieces once the region is detached or the
// key retired.
func (r *Region) RemoteSlices(dst [][]byte, sem Semantics, off, n uint64) [][]byte {
	if sem == Detached || r.wuse.Load()&wDetach != 0 {
		return r.sinkSlices(dst, off, n)
	}
	return r.Slices(dst, off, n)
}

// RemoteSlicesFit is SlicesFit for RemoteSlices.
func (r *Region) RemoteSlicesFit(sem Semantics, off, n uint64, max int) (uint64, int) {
	if sem != Detached && r.wuse.Load()&wDetach == 0 {
		return r.SlicesFit(off, n, max)
	}
	m, got, k := uint64(len(r.sink)), uint64(0), 0
	for ; n > 0 && k < max; k++ { // as sinkSlices walks it
		c := min(n, m-off%m)
		got, n, off = got+c, n-c, off+c
	}
	return got, k
}

// RemoteWord is WriteWord for a peer's atomic through a key of semantics
// sem, under a write hold: a word of the sink once the region is detached
// or the key retired. The word must pass Word's checks.
func (r *Region) RemoteWord(sem Semantics, off uint64) *uint64 {
	if sem == Detached || r.wuse.Load()&wDetach != 0 {
		var one [1][]byte
		return wordOf(r.sinkSlices(one[:0], off&^7, 8)[0])
	}
	return r.WriteWord(off)
}

// sinkSlices covers [off, off+n) with pieces of the sink, wrapping around
// it.
func (r *Region) sinkSlices(dst [][]byte, off, n uint64) [][]byte {
	m := uint64(len(r.sink))
	for n > 0 {
		at := off % m
		k := min(n, m-at)
		dst = append(dst, r.sink[at:at+k:at+k])
		off += k
		n -= k
	}
	return dst
}
