package guest

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// lockFile fails: the guest is built with debootstrap and chroot, Linux's.
func lockFile(f *os.File) error {
	return fmt.Errorf("guest: building the guest needs Linux: %w", errors.ErrUnsupported)
}
