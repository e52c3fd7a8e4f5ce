//go:build unix && !linux

package guest

import (
	"errors"
	"os"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func lockFile(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }

// tapUsable: tap networks are made on Linux only.
func tapUsable() error { return errors.New("tap devices: Linux only") }
