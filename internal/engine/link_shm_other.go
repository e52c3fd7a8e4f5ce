//go:build !linux

package engine

import (
	"net"
	"time"

	"github.com/gowarp/gowarp/internal/cm"
)

// shmLink is Linux's only: connection setup takes no shared memory
// elsewhere.
type shmLink struct{ streamLink }

func newShmLink(c net.Conn, _ *cm.SharedMemory, _ time.Duration) Link { return NewLink(c) }
