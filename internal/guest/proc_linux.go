package guest

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr ends QEMU with the process that started it (a test killed
// by its timeout must not leave a guest running).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

// lockFile holds f's lock until f closes: one build of a guest at a time.
func lockFile(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }

// tapUsable makes a tap device and lets it go (it is gone with its file),
// to learn whether this process can: root alone is not enough in a
// container without CAP_NET_ADMIN. QEMU's script needs ip(8) too.
func tapUsable() error {
	if _, err := exec.LookPath("ip"); err != nil {
		return err
	}
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	ifr, err := unix.NewIfreq(fmt.Sprintf("gwsiwp%d", os.Getpid()%1000000))
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(int(f.Fd()), unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("making a tap device: %w", err)
	}
	return nil
}
