//go:build !unix

// Package cputime reads the CPU time the process has used, for
// benchmarks that report CPU per operation on a host other work shares.
package cputime

import "time"

// Self reports zero: not measured here.
func Self() time.Duration { return 0 }
