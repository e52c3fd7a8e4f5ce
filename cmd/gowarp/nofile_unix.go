//go:build unix

package main

import (
	"fmt"
	"syscall"
)

// raiseNoFile raises the soft limit on descriptors to the hard one, and
// fails if that leaves fewer than need.
func raiseNoFile(need int) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("reading the descriptor limit: %w", err)
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return fmt.Errorf("raising the descriptor limit: %w", err)
		}
	}
	if uint64(l.Cur) < uint64(need) { // Cur is int64 on the BSDs
		return fmt.Errorf("%d queue pairs need about %d descriptors; the limit is %d (ulimit -Hn)", need-64, need, l.Cur)
	}
	return nil
}
