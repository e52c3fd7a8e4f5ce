//go:build linux

package cm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gowarp/gowarp/wire"
)

func shmLeft(t testing.TB) []string {
	t.Helper()
	m, _ := filepath.Glob(fmt.Sprintf("%s/%s%08x*", shmDir, shmNamePrefix, os.Getpid()))
	return m
}

// negotiate runs both sides of the exchange on a loopback connection.
func negotiate(t *testing.T, ini, rsp Options) (Result, accepted, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := tcpPair(t)
	done := acceptAsync(ctx, b, rsp)
	res, err := Initiate(ctx, a, ini)
	o := <-done
	t.Cleanup(func() { res.Shm.Unmap(); o.res.Shm.Unmap() })
	return res, o, err
}

// TestAdapterSharedMemoryNegotiation: the link is taken only when both
// sides ask, with the extensions' block beside it or not; neither
// application sees a block; the file is gone from /dev/shm either way,
// and both sides map the same memory.
func TestAdapterSharedMemoryNegotiation(t *testing.T) {
	for _, tt := range []struct {
		name          string
		ini, rsp, ext bool
		rev           int
	}{
		{"both", true, true, false, 2}, {"both with extensions", true, true, true, 2}, {"both rev 1", true, true, false, 1},
		{"initiator only", true, false, true, 2}, {"responder only", false, true, false, 2}, {"neither", false, false, false, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, o, err := negotiate(t,
				Options{Revision: tt.rev, Shm: tt.ini, Ext: tt.ext, PrivateData: []byte("request")},
				Options{Shm: tt.rsp, Ext: tt.ext, PrivateData: []byte("reply")})
			if err != nil || o.err != nil {
				t.Fatal(err, o.err)
			}
			want := tt.ini && tt.rsp
			if (res.Shm != nil) != want || (o.res.Shm != nil) != want || o.req.OffersShm() != tt.ini {
				t.Fatalf("initiator shm %v, responder %v, offered %v; want %v (%v, %v)", res.Shm != nil, o.res.Shm != nil, o.req.OffersShm(), want, res.ShmErr, o.res.ShmErr)
			}
			if res.Ext != tt.ext || o.res.Ext != tt.ext {
				t.Errorf("extensions %v/%v, want %v", res.Ext, o.res.Ext, tt.ext)
			}
			if string(res.PrivateData) != "reply" || string(o.req.PrivateData()) != "request" || string(o.res.PrivateData) != "request" {
				t.Errorf("private data %q / %q / %q", res.PrivateData, o.req.PrivateData(), o.res.PrivateData)
			}
			if f := shmLeft(t); len(f) != 0 {
				t.Errorf("left in /dev/shm: %v", f)
			}
			if want {
				if !res.Shm.Initiator || o.res.Shm.Initiator || res.Shm.Ring != ShmDefaultRing || o.res.Shm.Ring != ShmDefaultRing {
					t.Fatalf("mappings %+v / %+v", res.Shm.Ring, o.res.Shm.Ring)
				}
				res.Shm.Data(0)[5] = 42
				res.Shm.Data(1)[len(res.Shm.Data(1))-1] = 43
				if o.res.Shm.Data(0)[5] != 42 || o.res.Shm.Data(1)[o.res.Shm.Ring-1] != 43 {
					t.Fatal("the two sides do not share the memory")
				}
			}
		})
	}
}

// TestAdapterSharedMemoryLongPrivateData: an offer makes room for itself:
// private data that leaves no room for the block is refused, as for the
// extensions' block.
func TestAdapterSharedMemoryLongPrivateData(t *testing.T) {
	a, _ := tcpPair(t)
	pd := make([]byte, wire.MaxMPAPrivateData-4-shmBlockLen+1)
	_, err := Initiate(context.Background(), a, Options{Shm: true, PrivateData: pd})
	if !errors.Is(err, ErrPrivateDataLong) {
		t.Fatalf("got %v, want ErrPrivateDataLong", err)
	}
	if f := shmLeft(t); len(f) != 0 {
		t.Errorf("left in /dev/shm: %v", f)
	}
}

// rawOffer sends an MPA request whose private data ends with block and
// returns the responder's Accept outcome and the reply it sent.
func rawOffer(t *testing.T, block []byte) (accepted, wire.MPAFrame) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := tcpPair(t)
	done := acceptAsync(ctx, b, Options{Shm: true, PrivateData: []byte("reply")})
	req := wire.MPAFrame{Revision: 2, Enhanced: true, IRD: 1, ORD: 1, PrivateData: append([]byte("app"), block...)}
	if err := writeFrame(a, &req); err != nil {
		t.Fatal(err)
	}
	rep, err := readFrame(a)
	if err != nil {
		t.Fatal(err)
	}
	o := <-done
	t.Cleanup(func() { o.res.Shm.Unmap() })
	return o, rep
}

// TestAdapterSharedMemoryHostileOffer: a responder refuses an offer that
// is malformed or names anything but a file the initiator made for it
// (a bad token, sizes that do not match, a path outside /dev/shm, a
// symbolic link, another user's file), cleanly: the connection goes on
// over TCP, the reply carries no block, the application sees its private
// data without the block, and the reason is reported.
func TestAdapterSharedMemoryHostileOffer(t *testing.T) {
	good, err := createShm(ShmMinRing)
	if err != nil {
		t.Fatal(err)
	}
	defer good.discard()
	link := shmDir + "/" + shmNamePrefix + "feed"
	if err := os.Symlink(good.path, link); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(link)
	small := shmDir + "/" + shmNamePrefix + "beef"
	if err := os.WriteFile(small, make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(small)
	// A file of the right size and contents that another user owns.
	other := shmDir + "/" + shmNamePrefix + "0dd"
	if err := os.WriteFile(other, good.m.Mem, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(other)
	ownedByOther := os.Geteuid() == 0 && os.Chown(other, 65534, 65534) == nil
	enc := func(b shmBlock) []byte { return appendShm(nil, &b) }
	raw := func(f func(p []byte)) []byte {
		p := enc(good.blk)
		f(p)
		return p
	}
	badTok := good.blk
	badTok.Token[0] ^= 1
	zeroTok := good.blk
	zeroTok.Token = [16]byte{}
	bigger := good.blk
	bigger.Ring *= 2
	for _, tt := range []struct {
		name  string
		block []byte
	}{
		{"bad token", enc(badTok)},
		{"zero token", enc(zeroTok)},
		{"ring larger than the file", enc(bigger)},
		{"ring not a power of two", raw(func(p []byte) { p[6] = 1; p[7] = 1 })},
		{"ring too large", raw(func(p []byte) { p[4] = 0x40 })},
		{"ring too small", raw(func(p []byte) { p[4], p[5], p[6], p[7] = 0, 0, 0x10, 0 })},
		{"version 1 (a ring of bare bytes)", raw(func(p []byte) { p[0] = 1 })},
		{"version 3", raw(func(p []byte) { p[0] = 3 })},
		{"reserved", raw(func(p []byte) { p[3] = 1 })},
		{"name too long", raw(func(p []byte) { p[2] = shmNameMax + 1 })},
		{"name not padded", raw(func(p []byte) { p[2] = 11; p[24+30] = 'x' })},
		{"path outside /dev/shm", raw(func(p []byte) {
			n := copy(p[24:24+shmNameMax], "../../etc/passwd")
			clear(p[24+n : 24+shmNameMax])
			p[2] = byte(n)
		})},
		{"absolute path", raw(func(p []byte) {
			n := copy(p[24:24+shmNameMax], "/tmp/gowarp-shm-00")
			clear(p[24+n : 24+shmNameMax])
			p[2] = byte(n)
		})},
		{"no name", raw(func(p []byte) { clear(p[24 : 24+shmNameMax]); p[2] = 0 })},
		{"no such file", enc(shmBlock{Ring: good.blk.Ring, Token: good.blk.Token, Name: shmNamePrefix + "0123"})},
		{"symbolic link", enc(shmBlock{Ring: good.blk.Ring, Token: good.blk.Token, Name: shmNamePrefix + "feed"})},
		{"file of the wrong size", enc(shmBlock{Ring: good.blk.Ring, Token: good.blk.Token, Name: shmNamePrefix + "beef"})},
		{"another user's file", enc(shmBlock{Ring: good.blk.Ring, Token: good.blk.Token, Name: shmNamePrefix + "0dd"})},
	} {
		if tt.name == "another user's file" && !ownedByOther {
			// Not root: the file is ours, and taking it is right.
			continue
		}
		t.Run(tt.name, func(t *testing.T) {
			o, rep := rawOffer(t, tt.block)
			if o.err != nil {
				t.Fatal(o.err)
			}
			if o.res.Shm != nil || o.res.ShmErr == nil {
				t.Fatalf("offer taken (%v)", o.res.ShmErr)
			}
			if !o.req.OffersShm() || string(o.req.PrivateData()) != "app" {
				t.Fatalf("offered %v, private data %q", o.req.OffersShm(), o.req.PrivateData())
			}
			if string(rep.PrivateData) != "reply" {
				t.Fatalf("reply's private data %q", rep.PrivateData)
			}
			t.Log(o.res.ShmErr)
		})
	}
	// The good offer was not spent by the bad ones: taken, it is gone.
	o, rep := rawOffer(t, enc(good.blk))
	if o.res.Shm == nil || o.res.ShmErr != nil {
		t.Fatalf("good offer refused: %v", o.res.ShmErr)
	}
	_, ans, present, err := cutShm(rep.PrivateData)
	if !present || err != nil || !good.taken(&ans) {
		t.Fatalf("answer %+v %v %v", ans, present, err)
	}
	if _, err := os.Stat(good.path); !os.IsNotExist(err) {
		t.Fatalf("file still there after both mapped it: %v", err)
	}
}

// TestAdapterSharedMemoryForeignAnswer: an initiator takes the link only
// from an answer whose token the responder wrote into its file; a peer
// that echoes the offer, or makes one up, leaves it on TCP with its
// private data untouched.
func TestAdapterSharedMemoryForeignAnswer(t *testing.T) {
	for _, tt := range []struct {
		name string
		ans  func(offer []byte) []byte
	}{
		{"echo", func(offer []byte) []byte { return offer }},
		{"made up", func([]byte) []byte {
			return appendShm([]byte("x"), &shmBlock{Ring: ShmDefaultRing, Token: [16]byte{1}})
		}},
		{"none", func([]byte) []byte { return []byte("plain") }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, b := tcpPair(t)
			var pd []byte
			go func() {
				f, err := readFrame(b)
				if err != nil {
					return
				}
				pd = tt.ans(f.PrivateData)
				writeFrame(b, &wire.MPAFrame{Reply: true, Revision: 2, Enhanced: true, PrivateData: pd})
			}()
			res, err := Initiate(ctx, a, Options{Shm: true, PrivateData: []byte("req")})
			if err != nil {
				t.Fatal(err)
			}
			if res.Shm != nil || res.ShmErr == nil {
				t.Fatalf("link taken (%v)", res.ShmErr)
			}
			if !bytes.Equal(res.PrivateData, pd) {
				t.Fatalf("private data %q, sent %q", res.PrivateData, pd)
			}
			if f := shmLeft(t); len(f) != 0 {
				t.Errorf("left in /dev/shm: %v", f)
			}
		})
	}
}

// TestAdapterSharedMemoryNotLocal: no offer toward a stream that is not
// a TCP connection to this host (net.Pipe here), and the request is the
// plain one, byte for byte.
func TestAdapterSharedMemoryNotLocal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	got := make(chan []byte, 1)
	go func() {
		f, err := readFrame(b)
		if err != nil {
			got <- nil
			return
		}
		got <- f.PrivateData
		writeFrame(b, &wire.MPAFrame{Reply: true, Revision: 2, Enhanced: true})
	}()
	res, err := Initiate(ctx, a, Options{Shm: true, PrivateData: []byte("req")})
	if err != nil {
		t.Fatal(err)
	}
	if pd := <-got; string(pd) != "req" {
		t.Fatalf("request's private data %q", pd)
	}
	if res.Shm != nil || !errors.Is(res.ShmErr, errShmNotLocal) {
		t.Fatalf("shm %v, %v", res.Shm != nil, res.ShmErr)
	}
}

// FuzzShmBlock: the block decoder never panics, and a block it accepts
// encodes back to the same bytes.
func FuzzShmBlock(f *testing.F) {
	f.Add(appendShm(nil, &shmBlock{Ring: ShmDefaultRing, Token: [16]byte{1, 2, 3}, Name: shmNamePrefix + "0123456789abcdef01234567"}))
	f.Add(appendShm([]byte("app data"), &shmBlock{Ring: ShmMinRing, Token: [16]byte{9}}))
	f.Add(appendShm(appendExt([]byte("x")), &shmBlock{Ring: ShmMaxRing, Name: shmNamePrefix + "a"}))
	f.Add([]byte("gwS1"))
	f.Add(make([]byte, shmBlockLen))
	f.Fuzz(func(t *testing.T, pd []byte) {
		rest, b, present, err := cutShm(pd)
		if !present {
			if err != nil || !bytes.Equal(rest, pd) {
				t.Fatalf("absent block: %v, rest %d of %d bytes", err, len(rest), len(pd))
			}
			return
		}
		if len(rest) != len(pd)-shmBlockLen {
			t.Fatalf("cut %d of %d bytes", len(pd)-len(rest), len(pd))
		}
		if err != nil {
			if !errors.Is(err, ErrShmOffer) {
				t.Fatalf("error %v does not match ErrShmOffer", err)
			}
			return
		}
		if b.Name != "" && !validShmName(b.Name) {
			t.Fatalf("accepted name %q", b.Name)
		}
		if again := appendShm(rest, &b); !bytes.Equal(again, pd) {
			t.Fatalf("re-encoded %x, got %x", again, pd)
		}
	})
}

// TestAdapterSharedMemorySweep: the sweep removes a gowarp file whose
// process is gone and that is older than shmStaleAge, the leak of a
// process killed during the MPA exchange, and keeps a fresh one of a
// process that is gone, an old one of a live process (this one), another
// user's, a symbolic link, and files that are not gowarp's; createShm
// sweeps.
func TestAdapterSharedMemorySweep(t *testing.T) {
	dir := t.TempDir()
	defer func(d string) { shmDir = d }(shmDir)
	shmDir = dir
	// The ID of a process that is gone: a child, reaped.
	child := exec.Command("true")
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	gone, live := child.Process.Pid, os.Getpid()
	old := time.Now().Add(-2 * shmStaleAge)
	file := func(name string, mtime time.Time) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return p
	}
	name := func(pid int) string { return fmt.Sprintf("%s%08x%016x", shmNamePrefix, pid, 0xfeed) }
	stale := file(name(gone), old)
	kept := []string{
		file(name(gone)[:len(name(gone))-1]+"1", time.Now()), // gone, but fresh
		file(name(live)[:len(name(live))-1]+"2", old),        // alive
		file("gowarp-other", old),                            // not a link's file
		file(shmNamePrefix+"zz", old),                        // not hex
	}
	other := file(name(gone)[:len(name(gone))-1]+"3", old)
	if os.Geteuid() == 0 && os.Chown(other, 65534, 65534) == nil {
		kept = append(kept, other) // another user's
	} else {
		os.Remove(other)
	}
	link := filepath.Join(dir, name(gone)[:len(name(gone))-1]+"4")
	if err := os.Symlink(kept[0], link); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, link)
	if n := sweepShm(time.Now()); n != 1 {
		t.Errorf("swept %d files, want 1", n)
	}
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale file still there: %v", err)
	}
	for _, p := range kept {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v, want it kept", filepath.Base(p), err)
		}
	}
	// createShm sweeps (once every shmSweepEvery: the clock is set back).
	stale = file(name(gone), old)
	shmSwept.Store(0)
	o, err := createShm(ShmMinRing)
	if err != nil {
		t.Fatal(err)
	}
	o.discard()
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("createShm left the stale file: %v", err)
	}
}
