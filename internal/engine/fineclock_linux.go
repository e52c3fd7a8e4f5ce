package engine

import (
	"container/heap"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

type fineClock struct {
	mu      sync.Mutex
	h       fineHeap
	armed   time.Duration // the deadline the timerfd is set to; 0: none
	once    bool
	ok      bool
	fd      int
	f       *os.File
	expired [8]byte
}

// start makes the timerfd and its goroutine, once; it reports whether
// there is one. Under mu.
func (c *fineClock) start() bool {
	if c.once {
		return c.ok
	}
	c.once = true
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return false
	}
	c.fd, c.f, c.ok = fd, os.NewFile(uintptr(fd), "gowarp-timerfd"), true
	go c.run()
	return true
}

// arm sets the timerfd to expire at when (since fineEpoch). Under mu.
func (c *fineClock) arm(when time.Duration) {
	d := max(when-time.Since(fineEpoch), time.Microsecond)
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if unix.TimerfdSettime(c.fd, 0, &spec, nil) == nil {
		c.armed = when
	}
}

// run waits in the netpoller for the timerfd and fires what expired.
func (c *fineClock) run() {
	for {
		// An arming after an expiry may discard it (the poller waits out
		// the EAGAIN): the deadlines, not the count read, say what fires.
		if _, err := c.f.Read(c.expired[:]); err != nil {
			return // not expected: the timerfd is never closed
		}
		c.mu.Lock()
		c.armed = 0
		now := time.Since(fineEpoch)
		for len(c.h) > 0 && c.h[0].when <= now {
			heap.Pop(&c.h).(*fineTimer).fire()
		}
		if len(c.h) > 0 {
			c.arm(c.h[0].when)
		}
		c.mu.Unlock()
	}
}
