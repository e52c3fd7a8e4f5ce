//go:build unix

// Package cputime reads the CPU time the process has used, for
// benchmarks that report CPU per operation on a host other work shares.
package cputime

import (
	"syscall"
	"time"
)

// Self returns the user and system CPU time the process has used; zero
// when it cannot be read.
func Self() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
