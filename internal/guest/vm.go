package guest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The guest's address, and the one at which guest programs reach the
// host's servers (on either network, see Net).
const (
	Addr     = "10.0.2.15"
	HostAddr = "10.0.2.100"
)

// The guest's networks (Config.Net).
const (
	// NetUser is QEMU's user network (slirp): the host reaches the guest
	// through HostFwd and the guest the host through GuestFwd, both TCP
	// proxies on 127.0.0.1, so the host's TCP peer is QEMU, which
	// re-segments the stream. Needs no privilege.
	NetUser = "user"
	// NetTap is a tap device that QEMU makes (and removes when it ends)
	// with HostAddr/24 on the host side: the host's and the guest's TCP
	// talk to each other directly, segments as sent, and no forward
	// stands between them. Needs the right to make a tap device and no
	// host address already in HostAddr's /24 (PickNet). Nothing routes
	// beyond the link: the guest's default route is taken away at boot.
	NetTap = "tap"
)

// Forward pairs a host port on 127.0.0.1 with a guest port.
type Forward struct{ Host, Guest int }

// Config says how to boot the guest.
type Config struct {
	// Net is NetUser or NetTap; "" is PickNet's choice.
	Net string
	// HostFwd forwards 127.0.0.1:Host on the host to the guest's port
	// Guest (for host clients of guest servers). On NetTap the host
	// reaches Addr:Guest directly; VM.Dial gives the address either way.
	HostFwd []Forward
	// GuestFwd forwards HostAddr:Guest in the guest to 127.0.0.1:Host
	// (for guest clients of host servers); each guest connection is a
	// new host connection. On NetTap the guest reaches HostAddr:Guest
	// directly; VM.Listen gives where the host server listens either way.
	GuestFwd []Forward
	// Debug turns siw's dynamic debug on (MPA and QP events in dmesg).
	Debug bool
	// Limit ends the guest after this long whatever happens (0: 30 min).
	Limit time.Duration
	// Logf receives progress lines.
	Logf Logf
}

// VM is a running guest.
type VM struct {
	Dir   string // run directory: console.log, qemu.cmd, share/
	Accel string // "kvm" or "tcg"
	Net   string // NetUser or NetTap

	cfg Config

	mu       sync.Mutex
	next     int
	cmd      *exec.Cmd
	exited   chan struct{}
	attached bool
}

// Accel returns the accelerator to use and why: $GOWARP_SIWVM_ACCEL
// (kvm or tcg) if set; TCG where /dev/kvm is missing or not ours to open,
// or is PVM's (kvm_pvm, a paravirtual KVM inside a VM, runs only kernels
// built for it: Debian's hangs at boot); KVM otherwise.
func Accel() (accel, why string) {
	switch a := os.Getenv("GOWARP_SIWVM_ACCEL"); a {
	case "kvm", "tcg":
		return a, "GOWARP_SIWVM_ACCEL"
	}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return "tcg", "/dev/kvm is kvm_pvm, which cannot run a stock kernel"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", "no usable /dev/kvm: " + err.Error()
	}
	f.Close()
	return "kvm", "/dev/kvm"
}

// PickNet returns the network to use and why: $GOWARP_SIWVM_NET (user or
// tap) if set; NetTap where the process can make a tap device (it tries:
// CAP_NET_ADMIN, /dev/net/tun, ip(8)) and no host interface has an
// address in HostAddr's /24 (another guest's tap, or a real network: the
// routes would clash); NetUser otherwise.
func PickNet() (netw, why string) {
	switch n := os.Getenv("GOWARP_SIWVM_NET"); n {
	case NetUser, NetTap:
		return n, "GOWARP_SIWVM_NET"
	}
	if err := tapUsable(); err != nil {
		return NetUser, "no tap device here: " + err.Error()
	}
	_, subnet, _ := net.ParseCIDR(HostAddr + "/24")
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return NetUser, "cannot list the host's addresses: " + err.Error()
	}
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && subnet.Contains(ip.IP) {
			return NetUser, fmt.Sprintf("the host already has %v in %v", ip, subnet)
		}
	}
	return NetTap, "a tap device can be made here"
}

// Dial returns the address at which host programs reach the guest's TCP
// port guestPort: 127.0.0.1 and its HostFwd port on NetUser, Addr on
// NetTap.
func (v *VM) Dial(guestPort int) string { return v.hostAddr(Addr, v.cfg.HostFwd, guestPort) }

// Listen returns the address at which a host server must listen for guest
// clients that dial HostAddr:guestPort: 127.0.0.1 and its GuestFwd port
// on NetUser, HostAddr on NetTap.
func (v *VM) Listen(guestPort int) string { return v.hostAddr(HostAddr, v.cfg.GuestFwd, guestPort) }

// hostAddr is tapIP:guestPort on a tap network, and on the user network
// 127.0.0.1 with the host port of guestPort's forward in fwds (port 0,
// where nothing answers, if it has none).
func (v *VM) hostAddr(tapIP string, fwds []Forward, guestPort int) string {
	if v.Net == NetTap {
		return net.JoinHostPort(tapIP, strconv.Itoa(guestPort))
	}
	host := 0
	for _, f := range fwds {
		if f.Guest == guestPort {
			host = f.Host
		}
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(host))
}

// Boot starts the guest and returns once it is ready to run jobs. Where
// KVM was chosen but the guest does not come up in a minute, it boots
// again under TCG; where PickNet chose a tap network and that boot
// failed, it boots again on the user network.
func Boot(ctx context.Context, im *Image, cfg Config) (*VM, error) {
	picked := cfg.Net == ""
	if picked {
		var why string
		cfg.Net, why = PickNet()
		cfg.Logf.printf("guest: %s network (%s)", cfg.Net, why)
	}
	v, err := bootAccel(ctx, im, cfg)
	if err != nil && picked && cfg.Net == NetTap && ctx.Err() == nil {
		// PickNet made a tap, but QEMU could not (or its script failed):
		// the user network needs nothing of the host.
		cfg.Logf.printf("guest: boot on a tap network failed (%v); booting on the user network", err)
		cfg.Net = NetUser
		v, err = bootAccel(ctx, im, cfg)
	}
	return v, err
}

// bootAccel boots under the accelerator Accel picks, and under TCG where
// KVM was picked and failed.
func bootAccel(ctx context.Context, im *Image, cfg Config) (*VM, error) {
	accel, why := Accel()
	cfg.Logf.printf("guest: booting under %s (%s)", strings.ToUpper(accel), why)
	v, err := boot(ctx, im, cfg, accel, bootWait(accel))
	if err != nil && accel == "kvm" && os.Getenv("GOWARP_SIWVM_ACCEL") == "" && ctx.Err() == nil {
		cfg.Logf.printf("guest: KVM boot failed (%v); booting under TCG", err)
		v, err = boot(ctx, im, cfg, "tcg", bootWait("tcg"))
	}
	return v, err
}

func bootWait(accel string) time.Duration {
	if accel == "kvm" {
		return time.Minute
	}
	return 5 * time.Minute // TCG on a busy machine
}

func boot(ctx context.Context, im *Image, cfg Config, accel string, wait time.Duration) (*VM, error) {
	dir, err := os.MkdirTemp("", "gowarp-siwvm-run-")
	if err != nil {
		return nil, err
	}
	share := filepath.Join(dir, "share")
	if err := os.MkdirAll(filepath.Join(share, "jobs"), 0o755); err != nil {
		return nil, err
	}
	var netdev, tap string
	switch {
	case cfg.Net == NetTap:
		// QEMU makes the device, runs the script on it, and removes it
		// when it ends (killed too: the device is its open file).
		tap = nextTap()
		up := filepath.Join(dir, "tap-up")
		script := fmt.Sprintf("#!/bin/sh\nip addr add %s/24 dev \"$1\" && ip link set \"$1\" up\n", HostAddr)
		if err := os.WriteFile(up, []byte(script), 0o755); err != nil {
			return nil, err
		}
		netdev = fmt.Sprintf("tap,id=n0,ifname=%s,script=%s,downscript=no", tap, up)
	case cfg.Net != NetUser:
		return nil, fmt.Errorf("guest: unknown network %q", cfg.Net)
	default:
		netdev = "user,id=n0,restrict=on" // nothing leaves the machine
		for _, f := range cfg.HostFwd {
			netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", f.Host, f.Guest)
		}
		if len(cfg.GuestFwd) > 0 {
			// A tcp: chardev would carry one connection for QEMU's lifetime;
			// cmd: starts a fresh forwarder per guest connection, one that
			// passes both sides' half-closes on (see guestfwd).
			fwd := filepath.Join(dir, "guestfwd")
			if out, err := exec.CommandContext(ctx, "go", "build", "-o", fwd, "github.com/gowarp/gowarp/internal/guest/guestfwd").CombinedOutput(); err != nil {
				return nil, fmt.Errorf("guest: building guestfwd: %v\n%s", err, out)
			}
			for _, f := range cfg.GuestFwd {
				netdev += fmt.Sprintf(",guestfwd=tcp:%s:%d-cmd:%s %d", HostAddr, f.Guest, fwd, f.Host)
			}
		}
	}
	appendArgs := "console=ttyS0 root=/dev/vda rw init=/sbin/gowarp-init net.ifnames=0 panic=1 quiet"
	if cfg.Debug {
		appendArgs += " gowarp.debug=1"
	}
	args := []string{"-nographic", "-m", "1024", "-smp", "1",
		"-kernel", im.Kernel, "-initrd", im.Initrd, "-append", appendArgs,
		"-drive", "file=" + im.Disk + ",format=raw,if=virtio,snapshot=on",
		"-netdev", netdev, "-device", "virtio-net-pci,netdev=n0",
		"-virtfs", "local,path=" + share + ",mount_tag=share,security_model=none,id=fs0",
		"-serial", "file:" + filepath.Join(dir, "console.log"), "-monitor", "none", "-no-reboot"}
	if accel == "kvm" {
		args = append([]string{"-enable-kvm", "-cpu", "host"}, args...)
	} else {
		args = append([]string{"-accel", "tcg", "-cpu", "max"}, args...)
	}
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.SysProcAttr = sysProcAttr()
	out, err := os.Create(filepath.Join(dir, "qemu.out"))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	os.WriteFile(filepath.Join(dir, "qemu.cmd"), []byte(strings.Join(cmd.Args, " ")+"\n"), 0o644)
	t0 := time.Now()
	v := &VM{Dir: dir, Accel: accel, Net: cfg.Net, cfg: cfg, next: 1, cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the thread that started QEMU ends, not
		// the process: this goroutine keeps its thread until QEMU is gone.
		runtime.LockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			cmd.Wait()
		}
		close(v.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("guest: starting QEMU: %w", err)
	}
	limit := cfg.Limit
	if limit == 0 {
		limit = 30 * time.Minute
	}
	time.AfterFunc(limit, v.kill)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !exists(filepath.Join(share, "ready")) {
		select {
		case <-ctx.Done():
			v.kill()
			return nil, ctx.Err()
		case <-deadline.C:
			v.kill()
			return nil, fmt.Errorf("guest: not ready after %v under %s; console:\n%s", wait, accel, v.console(2000))
		case <-v.exited:
			q, _ := os.ReadFile(out.Name())
			return nil, fmt.Errorf("guest: QEMU exited before the guest was ready: %s\nconsole:\n%s", q, v.console(2000))
		case <-tick.C:
		}
	}
	if cfg.Net == NetTap {
		// The link is the host's and the guest's only: no gateway.
		if rc, out, err := v.Run(ctx, "ip route del default", time.Minute); err != nil || rc != 0 {
			v.kill()
			return nil, fmt.Errorf("guest: taking the default route away: rc %d, %v: %s", rc, err, out)
		}
	}
	where := cfg.Net + " network"
	if tap != "" {
		where += " " + tap
	}
	cfg.Logf.printf("guest: ready under %s on %s in %v (run directory %s)", strings.ToUpper(accel), where, time.Since(t0).Round(100*time.Millisecond), dir)
	return v, nil
}

var taps atomic.Int32

// nextTap names a tap device for this process's next guest (at most 15
// bytes, as the kernel's names are).
func nextTap() string {
	return fmt.Sprintf("gwsiw%d.%d", os.Getpid()%1000000, taps.Add(1)%100)
}

// Attach returns a VM for a guest already running with run directory dir
// (its jobs continue after the highest number there). Stop leaves it
// running.
func Attach(dir string) *VM {
	v := &VM{Dir: dir, attached: true}
	for v.next = 1; exists(v.file(v.next, "sh")); v.next++ {
	}
	return v
}

func (v *VM) console(n int) string {
	b, _ := os.ReadFile(filepath.Join(v.Dir, "console.log"))
	return string(tail(b, n))
}

func (v *VM) kill() {
	if v.cmd != nil && v.cmd.Process != nil {
		v.cmd.Process.Kill()
	}
}

// Stop powers the guest off (it writes its dmesg to share/dmesg.txt
// first), killing QEMU if that takes longer than 30 s.
func (v *VM) Stop() {
	if v.attached || v.cmd == nil {
		return
	}
	os.WriteFile(filepath.Join(v.jobs(), "stop"), nil, 0o644)
	select {
	case <-v.exited:
	case <-time.After(30 * time.Second):
		v.kill()
		<-v.exited
	}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func (v *VM) jobs() string { return filepath.Join(v.Dir, "share", "jobs") }
func (v *VM) file(n int, ext string) string {
	return filepath.Join(v.jobs(), strconv.Itoa(n)+"."+ext)
}

// Job is a command running in the guest.
type Job struct {
	v *VM
	N int // its number: share/jobs/N.{sh,out,err,rc}
}

// Stderr, appended to a job's command, sends its standard error to the
// job's own file, so that a tool's unbuffered standard error does not
// land inside the blocks of its buffered standard output. Wait returns
// it after the output.
const Stderr = `2>"$J/$N.err"`

// Submit hands the guest a bash script to run after the jobs before it;
// timeout bounds it in the guest.
func (v *VM) Submit(script string, timeout time.Duration) (*Job, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := v.next
	body := fmt.Sprintf("# timeout %d\n%s\n", int(timeout.Seconds()), script)
	tmp := filepath.Join(v.jobs(), ".tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, v.file(n, "sh")); err != nil {
		return nil, err
	}
	v.next++
	return &Job{v: v, N: n}, nil
}

// Run runs a script in the guest and returns its exit status and output.
func (v *VM) Run(ctx context.Context, script string, timeout time.Duration) (int, string, error) {
	j, err := v.Submit(script, timeout)
	if err != nil {
		return -1, "", err
	}
	return j.Wait(ctx)
}

// Server starts cmd, a server that listens on the guest's TCP port, and
// returns once it listens.
func (v *VM) Server(ctx context.Context, port int, cmd string, timeout time.Duration) (*Job, error) {
	j, err := v.Submit(fmt.Sprintf("listen_then_wait $N %d %s %s", port, cmd, Stderr), timeout)
	if err != nil {
		return nil, err
	}
	for !exists(v.file(j.N, "listening")) {
		if exists(v.file(j.N, "rc")) {
			_, out, _ := j.Wait(ctx)
			return j, fmt.Errorf("guest: server %q ended before it listened:\n%s", cmd, out)
		}
		if err := v.pause(ctx); err != nil {
			return j, fmt.Errorf("guest: server %q not listening: %w", cmd, err)
		}
	}
	return j, nil
}

// pause waits a little, or returns why it cannot wait longer.
func (v *VM) pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-v.exited:
		return fmt.Errorf("the guest is gone; console:\n%s", v.console(1500))
	case <-time.After(50 * time.Millisecond):
		return nil
	}
}

// Wait waits for the job to end and returns its exit status and output:
// standard output, then what went to Stderr. A job that ran into its
// limit returns an error that carries Stuck's report: the hangs met were
// rare, and each needs it to be explained.
func (j *Job) Wait(ctx context.Context) (int, string, error) {
	for {
		if b, err := os.ReadFile(j.v.file(j.N, "rc")); err == nil {
			rc, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if st := j.Stuck(); st != "" {
				err = errors.Join(err, fmt.Errorf("guest job %d ran into its limit; a little before it:\n%s", j.N, st))
			}
			return rc, j.output(), err
		}
		if err := j.v.pause(ctx); err != nil {
			return -1, j.output(), fmt.Errorf("guest job %d: %w", j.N, err)
		}
	}
}

func (j *Job) output() string {
	out, _ := os.ReadFile(j.v.file(j.N, "out"))
	if e, _ := os.ReadFile(j.v.file(j.N, "err")); len(e) > 0 {
		out = append(append(out, "\n-- stderr --\n"...), e...)
	}
	return string(out)
}

// Stuck returns what the job's processes were doing a little before
// its limit (init.sh's stuck_report), or "" for a job that ended in time.
func (j *Job) Stuck() string {
	b, _ := os.ReadFile(j.v.file(j.N, "stuck"))
	return string(b)
}
