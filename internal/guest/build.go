// Package guest is gowarp's siw guest harness: a Debian guest whose Linux
// kernel runs the software iWARP driver (siw) beside rdma-core's tools,
// booted under QEMU for the interop suite (internal/siwtest).
//
// Build makes the guest's disk from Debian packages with debootstrap and
// caches it outside the repository (/var/tmp/gowarp-siwvm-<recipe hash>),
// so only the first run pays for it. Debian's kernel is built without
// siw, so Build compiles siw.ko from the same kernel's Debian source
// package. Boot starts QEMU (KVM where it can run a stock kernel, TCG
// otherwise) with user networking confined to loopback: host ports
// forwarded to guest servers, and a guest address that reaches host
// servers. Commands run in the guest as jobs handed over a 9p share
// (init.sh is the guest's side).
//
// Both need root on a Debian-like host with apt-get: Build installs what
// is missing (debootstrap, QEMU, mkfs.ext4) and runs debootstrap.
package guest

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Suite is the Debian release the guest is made of. Its kernel (6.1) is
// the siw the suite's findings in docs/interop.md were made with.
const Suite = "bookworm"

// Packages are what the guest holds besides Debian's minimal base: the
// kernel, rdma-core with the siw provider, the rdma_cm example programs
// (rping, rdma_server, rdma_client, ucmatose), ibverbs-utils and perftest.
var Packages = []string{
	"linux-image-amd64", "rdma-core", "ibverbs-providers", "ibverbs-utils",
	"rdmacm-utils", "perftest", "iproute2", "kmod", "procps",
}

// buildPackages are installed in the guest's tree only to compile siw.ko
// (the source package is purged afterwards). linux-headers-amd64 and the
// kernel's source come from the same source package as linux-image-amd64,
// so debootstrap picks matching versions.
var buildPackages = []string{"linux-headers-amd64", "linux-source-6.1", "make", "xz-utils"}

// recipeVersion changes whenever Build's steps change what the disk holds.
const recipeVersion = 1

//go:embed init.sh
var initScript []byte

// siwBuild compiles siw.ko out of tree for kernel $1 inside the guest's
// tree and installs it where modprobe finds it.
const siwBuild = `set -e
kver=$1
if grep -q '^CONFIG_RDMA_SIW=' /boot/config-$kver; then exit 0; fi
[ -d /usr/src/linux-headers-$kver ] || { echo "no headers for $kver (linux-headers-amd64 and linux-image-amd64 differ)"; exit 1; }
rm -rf /root/siw && mkdir /root/siw && cd /root/siw
tar -xf /usr/src/linux-source-*.tar.xz --wildcards '*/drivers/infiniband/sw/siw'
d=$(echo $PWD/linux-source-*/drivers/infiniband/sw/siw)
make -C /usr/src/linux-headers-$kver M=$d CONFIG_RDMA_SIW=m modules
install -D -m 0644 $d/siw.ko /lib/modules/$kver/updates/siw.ko
depmod -a $kver
cd / && rm -rf /root/siw
`

func hash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// recipe names the guest's tree: what debootstrap installs and how siw is
// built. The init script is not part of it: changing it remakes only the
// disk image (seconds), not the tree (minutes).
func recipe() string {
	return hash(strconv.Itoa(recipeVersion), Suite, strings.Join(Packages, ","),
		strings.Join(buildPackages, ","), siwBuild)
}

// CacheDir is where the guest of this recipe is built and kept:
// $GOWARP_SIWVM_CACHE (default /var/tmp)/gowarp-siwvm-<recipe hash>.
func CacheDir() string {
	base := os.Getenv("GOWARP_SIWVM_CACHE")
	if base == "" {
		base = "/var/tmp"
	}
	return filepath.Join(base, "gowarp-siwvm-"+recipe())
}

// Image is a built guest.
type Image struct {
	Dir      string // the cache directory
	Kernel   string // vmlinuz, booted directly
	Initrd   string
	Disk     string // ext4 image of the root file system, never written (QEMU's snapshot=on)
	Versions string // kernel and package versions in the guest
}

// Logf receives progress lines.
type Logf func(format string, args ...any)

func (l Logf) printf(format string, args ...any) {
	if l != nil {
		l(format, args...)
	}
}

// image is the Image in dir, whether or not it is built yet.
func image(dir string) *Image {
	return &Image{
		Dir:    dir,
		Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"),
		Disk:   filepath.Join(dir, "disk-"+hash(string(initScript))+".ext4"),
	}
}

func (im *Image) built() bool {
	for _, p := range []string{im.Kernel, im.Initrd, im.Disk} {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	b, err := os.ReadFile(filepath.Join(im.Dir, "versions.txt"))
	im.Versions = string(b)
	return err == nil
}

// Build returns the guest image, building what the cache lacks: the host
// tools, the guest's tree (debootstrap and siw.ko, a few minutes), the
// disk image (seconds). Concurrent builds of one recipe wait for each
// other.
func Build(ctx context.Context, logf Logf) (*Image, error) {
	dir := CacheDir()
	im := image(dir)
	if im.built() && HostToolsMissing() == nil {
		return im, nil
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("guest: building the siw guest in %s needs root (apt-get, debootstrap, chroot)", dir)
	}
	if err := InstallHostTools(ctx, logf); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := lockFile(lock); err != nil {
		return nil, fmt.Errorf("guest: locking %s: %w", lock.Name(), err)
	}
	if im.built() {
		return im, nil
	}
	b := &builder{dir: dir, root: filepath.Join(dir, "rootfs"), logf: logf}
	if b.log, err = os.OpenFile(filepath.Join(dir, "build.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return nil, err
	}
	defer b.log.Close()
	if err := b.tree(ctx); err != nil {
		return nil, err
	}
	if err := b.disk(ctx, im); err != nil {
		return nil, err
	}
	if !im.built() {
		return nil, fmt.Errorf("guest: build finished but %s is incomplete", dir)
	}
	return im, nil
}

// hostTools maps each command the harness runs on the host to its Debian
// package.
var hostTools = [][2]string{
	{"debootstrap", "debootstrap"},
	{"qemu-system-x86_64", "qemu-system-x86"},
	{"mkfs.ext4", "e2fsprogs"},
}

// HostToolsMissing returns an error naming the host tools not installed.
func HostToolsMissing() error {
	var miss []string
	for _, t := range hostTools {
		if _, err := exec.LookPath(t[0]); err != nil {
			miss = append(miss, t[0])
		}
	}
	if len(miss) > 0 {
		return fmt.Errorf("guest: not installed: %s", strings.Join(miss, ", "))
	}
	return nil
}

// CanInstall reports whether InstallHostTools can run here.
func CanInstall() bool {
	_, err := exec.LookPath("apt-get")
	return err == nil && os.Geteuid() == 0
}

// InstallHostTools installs the missing host tools with apt-get.
func InstallHostTools(ctx context.Context, logf Logf) error {
	var pkgs []string
	for _, t := range hostTools {
		if _, err := exec.LookPath(t[0]); err != nil {
			pkgs = append(pkgs, t[1])
		}
	}
	if len(pkgs) == 0 {
		return nil
	}
	if !CanInstall() {
		return fmt.Errorf("guest: %s missing and apt-get cannot run here (needs root)", strings.Join(pkgs, ", "))
	}
	logf.printf("guest: installing %s with apt-get", strings.Join(pkgs, " "))
	var out bytes.Buffer
	upd := exec.CommandContext(ctx, "apt-get", "update")
	upd.Stdout, upd.Stderr = &out, &out
	upd.Run() // a stale list may still do; install says if not
	inst := exec.CommandContext(ctx, "apt-get", append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)...)
	inst.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	inst.Stdout, inst.Stderr = &out, &out
	if err := inst.Run(); err != nil {
		return fmt.Errorf("guest: apt-get install %s: %w\n%s", strings.Join(pkgs, " "), err, tail(out.Bytes(), 2000))
	}
	return nil
}

type builder struct {
	dir, root string
	logf      Logf
	log       *os.File
	mirror    string // scrubbed from build.log
}

// run runs a host command with its output in build.log.
func (b *builder) run(ctx context.Context, name string, args ...string) error {
	fmt.Fprintf(b.log, "\n$ %s %s\n", name, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	cmd.Stdout, cmd.Stderr = b.log, b.log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("guest: %s %s: %w (see %s)", name, args[0], err, b.log.Name())
	}
	return nil
}

func (b *builder) chroot(ctx context.Context, args ...string) error {
	return b.run(ctx, "chroot", append([]string{b.root}, args...)...)
}

func (b *builder) output(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "chroot", append([]string{b.root}, args...)...).Output()
	return strings.TrimSpace(string(out)), err
}

// tree makes rootfs/: debootstrap, then siw.ko. rootfs.done marks it whole.
func (b *builder) tree(ctx context.Context) error {
	done := filepath.Join(b.dir, "rootfs.done")
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	mirror, err := Mirror()
	if err != nil {
		return err
	}
	b.mirror = mirror
	defer b.scrubLog()
	if err := os.RemoveAll(b.root); err != nil {
		return err
	}
	t0 := time.Now()
	b.logf.printf("guest: debootstrap %s (minbase + %d packages) into %s; several minutes, log in %s",
		Suite, len(Packages)+len(buildPackages), b.root, b.log.Name())
	if err := b.run(ctx, "debootstrap", "--variant=minbase", "--components=main",
		"--include="+strings.Join(append(append([]string{}, Packages...), buildPackages...), ","),
		Suite, b.root, mirror); err != nil {
		return err
	}
	b.logf.printf("guest: debootstrap took %v", time.Since(t0).Round(time.Second))
	kver, err := b.kernel()
	if err != nil {
		return err
	}
	t1 := time.Now()
	if err := b.withProc(ctx, func() error { return b.chroot(ctx, "/bin/bash", "-c", siwBuild, "siw-build", kver) }); err != nil {
		return err
	}
	b.logf.printf("guest: siw.ko for %s built in %v", kver, time.Since(t1).Round(time.Second))
	if err := b.chroot(ctx, "dpkg", "--purge", "linux-source-6.1"); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(b.root, "boot", "initrd.img-"+kver)); err != nil {
		if err := b.chroot(ctx, "update-initramfs", "-c", "-k", kver); err != nil {
			return err
		}
	}
	// Nothing in the guest names the mirror or reaches out: it has no
	// route off this machine anyway.
	for _, p := range []string{"etc/apt/sources.list", "var/log/bootstrap.log"} {
		os.Remove(filepath.Join(b.root, p))
	}
	os.RemoveAll(filepath.Join(b.root, "var/lib/apt/lists"))
	os.MkdirAll(filepath.Join(b.root, "var/lib/apt/lists/partial"), 0o755)
	return os.WriteFile(done, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644)
}

// withProc runs f with /proc mounted in the tree (kbuild and dpkg want it).
func (b *builder) withProc(ctx context.Context, f func() error) error {
	p := filepath.Join(b.root, "proc")
	if err := b.run(ctx, "mount", "-t", "proc", "proc", p); err != nil {
		return err
	}
	defer exec.Command("umount", p).Run()
	return f()
}

// kernel returns the tree's kernel version (its one /lib/modules entry).
func (b *builder) kernel() (string, error) {
	ents, err := os.ReadDir(filepath.Join(b.root, "lib", "modules"))
	if err != nil || len(ents) != 1 {
		return "", fmt.Errorf("guest: want one kernel in %s/lib/modules, found %d (%v)", b.root, len(ents), err)
	}
	return ents[0].Name(), nil
}

// disk installs init.sh, copies the kernel and initrd out, writes
// versions.txt and makes the ext4 image.
func (b *builder) disk(ctx context.Context, im *Image) error {
	kver, err := b.kernel()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(b.root, "sbin", "gowarp-init"), initScript, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"etc/hostname": "gowarp-siw\n",
		"etc/hosts":    "127.0.0.1 localhost\n10.0.2.15 gowarp-siw\n",
		"etc/fstab":    "/dev/vda / ext4 rw,relatime 0 1\n",
	}
	for p, s := range files {
		if err := os.WriteFile(filepath.Join(b.root, p), []byte(s), 0o644); err != nil {
			return err
		}
	}
	for src, dst := range map[string]string{"vmlinuz-" + kver: im.Kernel, "initrd.img-" + kver: im.Initrd} {
		data, err := os.ReadFile(filepath.Join(b.root, "boot", src))
		if err != nil {
			return err
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return err
		}
	}
	vers, err := b.output(ctx, "dpkg-query", "-W", "-f=${Package} ${Version}\n", "linux-image-"+kver,
		"rdma-core", "ibverbs-providers", "ibverbs-utils", "rdmacm-utils", "perftest")
	if err != nil {
		return fmt.Errorf("guest: dpkg-query in the tree: %w", err)
	}
	vers = fmt.Sprintf("debian %s, kernel %s (siw.ko built from its source)\n%s\n", Suite, kver, vers)
	du, err := exec.CommandContext(ctx, "du", "-sm", b.root).Output()
	if err != nil {
		return err
	}
	mb, _ := strconv.Atoi(strings.Fields(string(du))[0])
	tmp := im.Disk + ".tmp"
	os.Remove(tmp)
	t0 := time.Now()
	if err := b.run(ctx, "mkfs.ext4", "-q", "-F", "-L", "gowarp", "-E", "root_owner=0:0",
		"-d", b.root, tmp, strconv.Itoa(mb+mb/2+256)+"M"); err != nil {
		return err
	}
	b.logf.printf("guest: disk image %s (%d MiB of files) in %v", filepath.Base(im.Disk), mb, time.Since(t0).Round(100*time.Millisecond))
	if err := os.WriteFile(filepath.Join(b.dir, "versions.txt"), []byte(vers), 0o644); err != nil {
		return err
	}
	// Disks of other init scripts go: a guest still running on one keeps
	// its open file.
	old, _ := filepath.Glob(filepath.Join(b.dir, "disk-*.ext4"))
	for _, p := range old {
		os.Remove(p)
	}
	return os.Rename(tmp, im.Disk)
}

// scrubLog keeps the mirror's address out of build.log.
func (b *builder) scrubLog() {
	host := b.mirror
	if i := strings.Index(host, "://"); i >= 0 {
		host = host[i+3:]
	}
	if i := strings.IndexByte(host, '/'); i >= 0 {
		host = host[:i]
	}
	if host == "" {
		return
	}
	data, err := os.ReadFile(b.log.Name())
	if err != nil {
		return
	}
	os.WriteFile(b.log.Name(), bytes.ReplaceAll(data, []byte(host), []byte("<mirror>")), 0o644)
}

// Mirror is the Debian mirror debootstrap uses: $GOWARP_SIWVM_MIRROR, or
// the first deb URI of the host's apt sources that is not a security
// archive (the host must reach a Debian mirror for apt-get anyway).
func Mirror() (string, error) {
	if m := os.Getenv("GOWARP_SIWVM_MIRROR"); m != "" {
		return m, nil
	}
	var files []string
	for _, g := range []string{"/etc/apt/sources.list.d/*.sources", "/etc/apt/sources.list", "/etc/apt/sources.list.d/*.list"} {
		m, _ := filepath.Glob(g)
		files = append(files, m...)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if u := debURI(string(data), strings.HasSuffix(f, ".sources")); u != "" {
			return u, nil
		}
	}
	return "", errors.New("guest: no Debian mirror in /etc/apt (set GOWARP_SIWVM_MIRROR)")
}

// debURI returns the first URI of a deb entry (deb822 or one-line) whose
// suites are not security updates.
func debURI(text string, deb822 bool) string {
	if !deb822 {
		for _, l := range strings.Split(text, "\n") {
			f := strings.Fields(l)
			if len(f) < 3 || f[0] != "deb" {
				continue
			}
			i := 1
			if strings.HasPrefix(f[i], "[") {
				for i < len(f) && !strings.HasSuffix(f[i], "]") {
					i++
				}
				i++
			}
			if i+1 < len(f) && !strings.Contains(f[i+1], "security") {
				return f[i]
			}
		}
		return ""
	}
	for _, stanza := range strings.Split(text, "\n\n") {
		fields := map[string]string{}
		for _, l := range strings.Split(stanza, "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && !strings.HasPrefix(strings.TrimSpace(l), "#") {
				fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
		if strings.Contains(" "+fields["types"]+" ", " deb ") && fields["uris"] != "" &&
			!strings.Contains(fields["suites"], "security") && fields["enabled"] != "no" {
			return strings.Fields(fields["uris"])[0]
		}
	}
	return ""
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
