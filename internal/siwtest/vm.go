// Package siwtest is gowarp's interoperability suite against the Linux
// kernel's software iWARP driver (siw) and rdma-core's tools (rping,
// perftest), run in the QEMU guest of ../shared/tools/siwvm.
//
// The suite is a Go test that runs only when asked:
//
//	GOWARP_SIWVM=1 go test -v -timeout 15m ./internal/siwtest
//
// It builds the guest if needed (siwvm's build.sh, cached), boots it once
// with agent.sh as its command, and drives everything from the host: the
// agent runs one guest job at a time (a server that the host's gowarp
// connects to, or a client that connects to a gowarp server on the host)
// and reports each job's output and exit status through the 9p share.
// Without QEMU the test skips and says so.
//
// Environment: GOWARP_SIWVM=1 runs the suite; GOWARP_SIWVM_REPORT=FILE
// writes its summary table there; GOWARP_SIWVM_DEBUG=1 turns siw's
// dynamic debug on (MPA and QP events in the guest's dmesg; slower);
// SIWVM_DIR and SIWVM_BUILD locate the siwvm tool and its image;
// GOWARP_SIWVM_RUNDIR=DIR with GOWARP_SIWVM_PORTS=rping,perftest,serve
// attaches to a guest already running agent.sh instead of booting one.
package siwtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Guest ports: the host reaches guest servers through QEMU's hostfwd, and
// guest clients reach host servers at 10.0.2.100:guestServePort.
const (
	guestRpingPort    = 7174
	guestPerftestPort = 18515
	guestServePort    = 7175
	guestAddr         = "10.0.2.15"
	hostFromGuest     = "10.0.2.100"
)

// vm is a running guest with the agent.
type vm struct {
	dir      string // run.sh's run directory
	siwvm    string // the siwvm tool directory
	rping    int    // host port forwarded to the guest's rping port
	perftest int    // host port forwarded to the guest's perftest port
	serve    int    // host port guest clients reach
	next     int    // next job number
	attached bool   // an existing guest: leave it running
}

// siwvmDir finds ../shared/tools/siwvm from the module root, or SIWVM_DIR.
func siwvmDir() (string, error) {
	if d := os.Getenv("SIWVM_DIR"); d != "" {
		return d, nil
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	d := filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), "..", "shared", "tools", "siwvm")
	if _, err := os.Stat(filepath.Join(d, "run.sh")); err != nil {
		return "", fmt.Errorf("siwvm not found at %s (set SIWVM_DIR): %w", d, err)
	}
	return filepath.Clean(d), nil
}

// freePorts returns n TCP ports free on 127.0.0.1 right now.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// needGuest skips unless the suite was asked for and QEMU is there, and
// returns the siwvm directory.
func needGuest(t *testing.T) string {
	if os.Getenv("GOWARP_SIWVM") == "" {
		t.Skip("the siw interop suite runs only with GOWARP_SIWVM=1 (it boots a QEMU guest; see README)")
	}
	if !haveQEMU() && !canInstall() {
		t.Skip("SKIP: qemu-system-x86_64 not found and not installable here (siwvm/build.sh installs it with apt-get as root); the siw interop suite needs QEMU (with or without /dev/kvm)")
	}
	d, err := siwvmDir()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func haveQEMU() bool {
	_, err := exec.LookPath("qemu-system-x86_64")
	return err == nil
}

// canInstall reports whether siwvm/build.sh can install QEMU here.
func canInstall() bool {
	_, err := exec.LookPath("apt-get")
	return err == nil && os.Geteuid() == 0
}

// startVM boots the guest (building it first if needed), or attaches to
// one named by GOWARP_SIWVM_RUNDIR and GOWARP_SIWVM_PORTS=rping,perftest,serve.
func startVM(t *testing.T, siwvm string) *vm {
	if dir := os.Getenv("GOWARP_SIWVM_RUNDIR"); dir != "" {
		p := strings.Split(os.Getenv("GOWARP_SIWVM_PORTS"), ",")
		if len(p) != 3 {
			t.Fatal("GOWARP_SIWVM_PORTS must be rping,perftest,serve host ports")
		}
		v := &vm{dir: dir, siwvm: siwvm, attached: true}
		v.rping, _ = strconv.Atoi(p[0])
		v.perftest, _ = strconv.Atoi(p[1])
		v.serve, _ = strconv.Atoi(p[2])
		for v.next = 1; fileExists(v.job(v.next)); v.next++ {
		}
		return v
	}
	build := os.Getenv("SIWVM_BUILD")
	if build == "" {
		build = "/var/tmp/gowarp-siwvm"
	}
	if !haveQEMU() || !fileExists(filepath.Join(build, "rootfs.ext4")) || !fileExists(filepath.Join(build, "vmlinuz")) {
		t.Logf("building the siw guest (siwvm/build.sh, about 2 minutes, cached in %s)", build)
		cmd := exec.Command(filepath.Join(siwvm, "build.sh"))
		cmd.Dir = siwvm
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("siwvm build.sh: %v\n%s", err, tail(out, 3000))
		}
	}
	ports, err := freePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "gowarp-siwtest-")
	if err != nil {
		t.Fatal(err)
	}
	v := &vm{dir: dir, siwvm: siwvm, rping: ports[0], perftest: ports[1], serve: ports[2], next: 1}
	agent, err := filepath.Abs("agent.sh")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--bg", "-t", "900", "-d", dir,
		"-f", fmt.Sprintf("%d:%d", v.rping, guestRpingPort),
		"-f", fmt.Sprintf("%d:%d", v.perftest, guestPerftestPort),
		"-g", fmt.Sprintf("%d:%d", guestServePort, v.serve),
		"-S", agent}
	if os.Getenv("GOWARP_SIWVM_DEBUG") != "" {
		// siw's dynamic debug: MPA and QP events in dmesg (slows the guest).
		args = append([]string{"--debug"}, args...)
	}
	t0 := time.Now()
	cmd := exec.Command(filepath.Join(siwvm, "run.sh"), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		v.stop()
		t.Fatalf("siwvm run.sh: %v\n%s", err, out)
	}
	t.Logf("guest up in %v (run directory %s)", time.Since(t0).Round(100*time.Millisecond), dir)
	return v
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (v *vm) jobs() string     { return filepath.Join(v.dir, "share", "jobs") }
func (v *vm) job(n int) string { return filepath.Join(v.jobs(), strconv.Itoa(n)+".sh") }
func (v *vm) file(n int, ext string) string {
	return filepath.Join(v.jobs(), strconv.Itoa(n)+"."+ext)
}

// stop ends the agent (and with it the guest), or kills the guest.
func (v *vm) stop() {
	if v.attached {
		return
	}
	os.MkdirAll(v.jobs(), 0o755)
	os.WriteFile(filepath.Join(v.jobs(), "stop"), nil, 0o644)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && !fileExists(filepath.Join(v.dir, "share", "rc")) {
		time.Sleep(200 * time.Millisecond)
	}
	// Kill what is left: run.sh --stop ends qemu by its pid file.
	time.Sleep(2 * time.Second)
	exec.Command(filepath.Join(v.siwvm, "run.sh"), "--stop", v.dir).Run()
}

// guestJob is one job in the guest.
type guestJob struct {
	v *vm
	n int
}

// submit drops a job (a bash script) for the agent; timeout bounds it in
// the guest.
func (v *vm) submit(script string, timeout time.Duration) (*guestJob, error) {
	if err := os.MkdirAll(v.jobs(), 0o755); err != nil {
		return nil, err
	}
	n := v.next
	v.next++
	body := fmt.Sprintf("# timeout %d\n%s\n", int(timeout.Seconds()), script)
	tmp := filepath.Join(v.jobs(), ".tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		return nil, err
	}
	return &guestJob{v: v, n: n}, os.Rename(tmp, v.job(n))
}

// stderr redirects a guest command's standard error to the job's own file:
// a tool's unbuffered stderr would otherwise land inside the 4 KiB blocks
// of its buffered stdout and cut its lines.
const stderr = `2>"$J/$N.err"`

// server submits a guest server job listening on port and waits until it
// listens.
func (v *vm) server(ctx context.Context, port int, cmd string, timeout time.Duration) (*guestJob, error) {
	j, err := v.submit(fmt.Sprintf("listen_then_wait $N %d %s %s", port, cmd, stderr), timeout)
	if err != nil {
		return nil, err
	}
	for {
		if fileExists(j.v.file(j.n, "listening")) {
			return j, nil
		}
		if fileExists(j.v.file(j.n, "rc")) {
			out, _ := os.ReadFile(j.v.file(j.n, "out"))
			return j, fmt.Errorf("guest server %q ended before it listened:\n%s", cmd, out)
		}
		select {
		case <-ctx.Done():
			return j, fmt.Errorf("guest server %q not listening: %w", cmd, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// wait waits for the job to end and returns its exit status and output:
// standard output, then what the job sent to $ERR (see stderr).
func (j *guestJob) wait(ctx context.Context) (int, string, error) {
	for {
		if b, err := os.ReadFile(j.v.file(j.n, "rc")); err == nil {
			rc, err := strconv.Atoi(strings.TrimSpace(string(b)))
			out, _ := os.ReadFile(j.v.file(j.n, "out"))
			if e, _ := os.ReadFile(j.v.file(j.n, "err")); len(e) > 0 {
				out = append(append(out, "\n-- stderr --\n"...), e...)
			}
			return rc, string(out), err
		}
		select {
		case <-ctx.Done():
			out, _ := os.ReadFile(j.v.file(j.n, "out"))
			return -1, string(out), fmt.Errorf("guest job %d: %w", j.n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// run submits a job and waits for it.
func (v *vm) run(ctx context.Context, script string, timeout time.Duration) (int, string, error) {
	j, err := v.submit(script, timeout)
	if err != nil {
		return -1, "", err
	}
	return j.wait(ctx)
}

// dmesgSince returns the guest's kernel log lines that mention pattern.
func (v *vm) dmesg(ctx context.Context, pattern string) string {
	_, out, _ := v.run(ctx, fmt.Sprintf("dmesg | grep -E %q | tail -20", pattern), 30*time.Second)
	return out
}

// hostCmd runs a host command (the gowarp binary), with its output.
type hostCmd struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	err  error
	done chan struct{}
}

func startHost(ctx context.Context, name string, args ...string) (*hostCmd, error) {
	h := &hostCmd{cmd: exec.CommandContext(ctx, name, args...), done: make(chan struct{})}
	h.cmd.Stdout, h.cmd.Stderr = &h.out, &h.out
	if err := h.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { h.err = h.cmd.Wait(); close(h.done) }()
	return h, nil
}

func (h *hostCmd) wait(ctx context.Context) (string, error) {
	select {
	case <-h.done:
		return h.out.String(), h.err
	case <-ctx.Done():
		h.cmd.Process.Kill()
		<-h.done
		return h.out.String(), errors.Join(ctx.Err(), h.err)
	}
}
