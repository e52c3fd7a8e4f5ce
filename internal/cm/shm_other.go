//go:build !linux

package cm

import "errors"

// Shared-memory links are Linux's only: elsewhere nothing is offered and
// offers are declined.

type shmOffer struct {
	blk shmBlock
	m   *SharedMemory
}

func createShm(int) (*shmOffer, error)                    { return nil, errors.ErrUnsupported }
func (o *shmOffer) unlink()                               {}
func (o *shmOffer) discard()                              {}
func (o *shmOffer) taken(*shmBlock) bool                  { return false }
func openShm(*shmBlock) (*SharedMemory, *shmBlock, error) { return nil, nil, errors.ErrUnsupported }
func unmapShm([]byte) error                               { return nil }
