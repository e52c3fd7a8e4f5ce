package cm

import "fmt"

// blocks are gowarp's blocks at the end of one side's MPA private data,
// each appended only where asked and only toward a gowarp peer: the
// tenant's name (tenant.go), then the RFC 7306 offer (ext.go), then the
// shared-memory offer or answer (shm.go). Each block ends with or holds a
// magic of its own, so each side strips them last first, and only those
// it looks for; neither application sees them. One type builds, sizes
// and cuts all three, so their order is written down once.
type blocks struct {
	tenant string    // "" for none
	ext    bool      // the RFC 7306 offer
	shm    *shmBlock // nil for none
}

// len is the bytes the blocks take.
func (b *blocks) len() int {
	n := tenantBlockLen(b.tenant)
	if b.ext {
		n += extBlockLen
	}
	if b.shm != nil {
		n += shmBlockLen
	}
	return n
}

// appendTo returns pd followed by the blocks, in one copy (the caller's
// slice is not written); pd itself when there are none.
func (b *blocks) appendTo(pd []byte) []byte {
	n := b.len()
	if n == 0 {
		return pd
	}
	out := append(make([]byte, 0, len(pd)+n), pd...)
	if b.tenant != "" {
		out = appendTenant(out, b.tenant)
	}
	if b.ext {
		out = appendExt(out)
	}
	if b.shm != nil {
		out = appendShm(out, b.shm)
	}
	return out
}

// cut is what cutBlocks found.
type cut struct {
	blocks
	// shmErr: a shared-memory block was there but malformed; it is cut
	// all the same (it was meant for gowarp) and refused.
	shmErr error
}

// cutBlocks strips from pd's end the blocks it is told to look for, last
// first, and returns pd without them and what they said. A responder
// looks for all; an initiator for those it sent, since only those are
// answered (anything else at the end is the application's bytes). A
// tenant block that is there but malformed is an error (ErrBadTenant).
func cutBlocks(pd []byte, tenant, ext, shm bool) ([]byte, cut, error) {
	var c cut
	if shm {
		rest, b, present, err := cutShm(pd)
		if present {
			pd, c.shm, c.shmErr = rest, &b, err
		}
	}
	if ext {
		pd, c.ext = cutExt(pd)
	}
	if tenant {
		var err error
		if pd, c.tenant, err = CutTenant(pd); err != nil {
			return pd, c, fmt.Errorf("%w: %w", ErrProtocol, err)
		}
	}
	return pd, c, nil
}
