//go:build !linux

package cachebench

import "time"

// cpuTime reports zero: not measured here.
func cpuTime(pid int) time.Duration { return 0 }
