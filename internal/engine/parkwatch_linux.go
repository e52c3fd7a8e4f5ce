package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// parked watches the process's busy-polling readers that went to the
// netpoller, for its spinning ones to wake. The Go scheduler polls the
// network only when a processor has nothing else to run (or every 10 ms,
// from sysmon): a reader that spins, yielding with runtime.Gosched, is
// always something to run, so while one spins on every processor, a
// reader that parked meanwhile is not woken when its bytes come. With the
// cache server on one processor and four client connections, the 4 KiB
// ReadAt's p99 was 3.3-4 ms against a p50 of 23 µs. So a spinning reader
// looks, every few spins, at an epoll set of the parked readers' sockets
// (each armed once per park) and rings those that are readable.
var parked parkWatch

type parkWatch struct {
	mu      sync.Mutex
	made    bool
	epfd    int // -1: no epoll
	links   map[int32]*fdLink
	n       atomic.Int32 // links armed and parked
	polling atomic.Bool  // one spinner polls at a time
	evs     [32]unix.EpollEvent
}

// parkEvery is how many spins a spinning reader makes between two looks
// at the parked readers.
const parkEvery = 8

// arm watches l's socket fd while its reader waits in the netpoller.
func (w *parkWatch) arm(l *fdLink, fd int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.made {
		w.made = true
		w.epfd = -1
		if fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC); err == nil {
			w.epfd = fd
		}
		w.links = make(map[int32]*fdLink)
	}
	if w.epfd < 0 || l.unwatched {
		return
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(fd)}
	op := unix.EPOLL_CTL_MOD
	if l.wfd < 0 {
		op = unix.EPOLL_CTL_ADD
	}
	if unix.EpollCtl(w.epfd, op, fd, &ev) != nil {
		return
	}
	l.wfd = fd
	w.links[int32(fd)] = l
	if !l.parked.Swap(true) {
		w.n.Add(1)
	}
}

// woke notes that l's reader runs again.
func (w *parkWatch) woke(l *fdLink) {
	if l.parked.Load() && l.parked.CompareAndSwap(true, false) {
		w.n.Add(-1)
	}
}

// forget stops watching l, before its socket closes.
func (w *parkWatch) forget(l *fdLink) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l.unwatched = true
	w.woke(l)
	if l.wfd >= 0 {
		unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, l.wfd, nil)
		if w.links[int32(l.wfd)] == l {
			delete(w.links, int32(l.wfd))
		}
		l.wfd = -1
	}
}

// poll rings the parked readers whose sockets are readable.
func (w *parkWatch) poll() {
	if w.n.Load() == 0 || !w.polling.CompareAndSwap(false, true) {
		return
	}
	defer w.polling.Store(false)
	n, err := unix.EpollWait(w.epfd, w.evs[:], 0)
	if err != nil {
		return
	}
	for i := range n {
		w.mu.Lock()
		l := w.links[w.evs[i].Fd]
		w.mu.Unlock()
		if l != nil && l.parked.CompareAndSwap(true, false) {
			w.n.Add(-1)
			if l.bell != nil {
				l.bell.Store(true)
			}
			l.c.SetReadDeadline(time.Unix(1, 0))
		}
	}
}
