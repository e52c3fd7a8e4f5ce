//go:build !linux

package engine

import (
	"sync"
	"time"
)

// fineClock has no timerfd here: fineTimers are the runtime's timers.
type fineClock struct {
	mu    sync.Mutex
	h     fineHeap
	armed time.Duration
}

func (c *fineClock) start() bool       { return false }
func (c *fineClock) arm(time.Duration) {}
