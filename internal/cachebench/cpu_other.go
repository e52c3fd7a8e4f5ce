//go:build !linux

package cachebench

import (
	"time"

	"github.com/gowarp/gowarp/internal/cputime"
)

// cpuTime is this process's CPU time (pid 0); another's is not read here
// (zero).
func cpuTime(pid int) time.Duration {
	if pid == 0 {
		return cputime.Self()
	}
	return 0
}
