package guest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestDebURI(t *testing.T) {
	for _, c := range []struct {
		text   string
		deb822 bool
		want   string
	}{
		{"deb http://m.example/debian bookworm main\n", false, "http://m.example/debian"},
		{"# deb http://x/ bookworm main\ndeb [signed-by=/k.gpg arch=amd64] http://m.example/debian bookworm main\n", false, "http://m.example/debian"},
		{"deb http://sec.example/debian-security bookworm-security main\ndeb http://m.example/d bookworm main\n", false, "http://m.example/d"},
		{"deb-src http://m.example/debian bookworm main\n", false, ""},
		{"Types: deb\nURIs: http://sec.example/ds\nSuites: bookworm-security\n\nTypes: deb deb-src\nURIs: http://m.example/debian http://n.example/\nSuites: bookworm bookworm-updates\nComponents: main\n", true, "http://m.example/debian"},
		{"Types: deb-src\nURIs: http://m.example/debian\nSuites: bookworm\n", true, ""},
	} {
		if got := debURI(c.text, c.deb822); got != c.want {
			t.Errorf("debURI(%q) = %q, want %q", c.text, got, c.want)
		}
	}
}

func TestRecipeNamesCache(t *testing.T) {
	a := CacheDir()
	Packages = append(Packages, "strace")
	defer func() { Packages = Packages[:len(Packages)-1] }()
	if b := CacheDir(); a == b {
		t.Errorf("adding a package kept the cache directory %s", a)
	}
}

// TestGuest builds (or reuses) the guest and boots it: siw0 is there, the
// tools the suite runs are installed, and both forwards carry bytes.
func TestGuest(t *testing.T) {
	if os.Getenv("GOWARP_SIWVM") == "" {
		t.Skip("boots a QEMU guest only with GOWARP_SIWVM=1 (see README)")
	}
	if err := HostToolsMissing(); err != nil && !CanInstall() {
		t.Skipf("SKIP: %v and not installable here (apt-get as root)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	im, err := Build(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image in %s:\n%s", im.Dir, im.Versions)
	for _, netw := range []string{NetUser, NetTap} {
		t.Run(netw, func(t *testing.T) {
			if n, why := PickNet(); netw == NetTap && n != NetTap {
				t.Skipf("no tap network here: %s", why)
			}
			testGuest(ctx, t, im, netw)
		})
	}
}

// testGuest boots the guest on network netw and checks it.
func testGuest(ctx context.Context, t *testing.T, im *Image, netw string) {
	ports := make([]int, 2)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	v, err := Boot(ctx, im, Config{
		Net:      netw,
		HostFwd:  []Forward{{Host: ports[0], Guest: 7000}},
		GuestFwd: []Forward{{Host: ports[1], Guest: 7001}},
		Logf:     t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		v.Stop()
		if !t.Failed() {
			os.RemoveAll(v.Dir)
		}
	}()
	hostLn, err := net.Listen("tcp", v.Listen(7001))
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	if netw == NetTap {
		// Nothing beyond the link: the guest has no default route.
		if rc, out, err := v.Run(ctx, "ip route; ! ip route get 192.0.2.1", time.Minute); err != nil || rc != 0 {
			t.Errorf("the tap guest routes beyond its link: rc %d, %v:\n%s", rc, err, out)
		}
	}

	rc, out, err := v.Run(ctx, "rdma link show; command -v rping rdma_server rdma_client ucmatose ib_write_bw ib_send_lat ibv_devinfo", time.Minute)
	if err != nil || rc != 0 || !strings.Contains(out, "siw0") || strings.Count(out, "/usr/bin/") != 7 {
		t.Fatalf("guest tools: rc %d, %v:\n%s", rc, err, out)
	}

	// Guest to host: bash's /dev/tcp through the guest forward.
	got := make(chan string, 1)
	go func() {
		c, err := hostLn.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	if rc, out, err := v.Run(ctx, fmt.Sprintf("echo from-guest >/dev/tcp/%s/7001", HostAddr), time.Minute); err != nil || rc != 0 {
		t.Fatalf("guest to host: rc %d, %v: %s", rc, err, out)
	}
	if s := <-got; s != "from-guest\n" {
		t.Errorf("host received %q", s)
	}

	// A host server that closes first: the guest client sees its FIN
	// (bash's cat ends) while its own side is still open.
	go func() {
		c, err := hostLn.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "bye\n")
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c) // until the guest closes
	}()
	rc, out, err = v.Run(ctx, fmt.Sprintf("exec 3<>/dev/tcp/%s/7001; timeout 20 cat <&3", HostAddr), time.Minute)
	if err != nil || rc != 0 || out != "bye\n" {
		t.Errorf("host server closing first: guest client rc %d (124: no FIN), %v: %q", rc, err, out)
	}

	// Host to guest: a perl server in the guest (perl-base is in every
	// Debian) answers through the host forward.
	j, err := v.Server(ctx, 7000, `perl -MIO::Socket::INET -e '$l=IO::Socket::INET->new(LocalPort=>7000,Listen=>1,ReuseAddr=>1) or die; $c=$l->accept; print $c "from-guest ".<$c>'`, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", v.Dial(7000))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "hello\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if line != "from-guest hello\n" {
		t.Errorf("host to guest: got %q, %v", line, err)
	}
	if rc, out, err := j.Wait(ctx); rc != 0 || err != nil {
		t.Errorf("guest server: rc %d, %v: %s", rc, err, out)
	}

	if netw == NetUser {
		testStuck(ctx, t, v)
	}
}

// testStuck: a job that runs into its limit leaves a report of what its
// processes were doing (init.sh's stuck_report); one that ends in time,
// however late, leaves none.
func testStuck(ctx context.Context, t *testing.T, v *VM) {
	j, err := v.Submit("sleep 6", 10*time.Second) // the report is written at 5 s
	if err != nil {
		t.Fatal(err)
	}
	if rc, out, err := j.Wait(ctx); rc != 0 || err != nil || j.Stuck() != "" {
		t.Errorf("a job that ended in time: rc %d, %v, %q; report:\n%s", rc, err, out, j.Stuck())
	}
	// The report begins at half the limit: under TCG, with the job
	// spinning, it takes seconds.
	j, err = v.Submit("bash -c 'while :; do :; done' & sleep 100", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rc, _, err := j.Wait(ctx)
	st := j.Stuck()
	for _, want := range []string{"== pid ", "sleep 100", "state R", "hrtimer_nanosleep", ", stopped", ": syscall 230 ", "pc /usr/bin/bash+0x", "== rdma res show qp", "== ss -tanoi"} {
		if !strings.Contains(st, want) {
			t.Errorf("a job stuck at its limit (rc %d, %v): its report lacks %q:\n%s", rc, err, want, st)
		}
	}
	if rc != 124 {
		t.Errorf("a job stuck at its limit: rc %d, want 124", rc)
	}
	if err == nil || !strings.Contains(err.Error(), "ran into its limit") || !strings.Contains(err.Error(), "sleep 100") {
		t.Errorf("a job stuck at its limit: Wait's error %v does not carry its report", err)
	}
}
