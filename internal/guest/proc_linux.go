package guest

import "syscall"

// sysProcAttr ends QEMU with the process that started it (a test killed
// by its timeout must not leave a guest running).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
