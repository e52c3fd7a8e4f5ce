package engine

import (
	"net"

	"github.com/gowarp/gowarp/internal/cm"
)

// newLink returns the link connection setup settled on over c: the
// shared-memory one if both sides took it (see link_shm.go), else the
// stream's.
func (q *QP) newLink(c net.Conn, r *cm.Result, o *ConnectOptions) Link {
	if r.ShmErr != nil {
		q.log.Info("gowarp: shared memory not used; the link is the stream", "peer", c.RemoteAddr(), "err", r.ShmErr)
	}
	if r.Shm != nil {
		return newShmLink(c, r.Shm, cm.LinkTimeout(o.LinkTimeout))
	}
	return NewLink(c)
}

// SharedMemory reports whether the queue pair runs over a same-host
// shared-memory link.
func (q *QP) SharedMemory() bool {
	q.mu.Lock()
	l := q.link
	q.mu.Unlock()
	_, ok := l.(*shmLink)
	return ok
}
