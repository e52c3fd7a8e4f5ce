//go:build !unix

package gowarp_test

import "time"

func cpuTime() time.Duration { return 0 }
