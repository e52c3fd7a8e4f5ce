package guest

import (
	"os"
	"syscall"
)

// sysProcAttr ends QEMU with the process that started it (a test killed
// by its timeout must not leave a guest running).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

// lockFile holds f's lock until f closes: one build of a guest at a time.
func lockFile(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }
