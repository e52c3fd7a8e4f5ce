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

// tapUsable: tap networks are made on Linux only.
func tapUsable() error { return errors.New("tap devices: Linux only") }
