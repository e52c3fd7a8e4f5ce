//go:build linux

package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"testing"

	"github.com/gowarp/gowarp/internal/cm"
	"github.com/gowarp/gowarp/internal/mem"
	"golang.org/x/sys/unix"
)

// TestAdapterSharedMemoryLinkByReference: vectors from shared memory
// (mem.RegisterShared) cross by reference, the rest inline, mixed in
// random sizes and read in random pieces: the stream arrives intact and
// in order; a segment deregistered on the way is forgotten by the
// reader, and Unacked counts stream bytes, not ring bytes.
func TestAdapterSharedMemoryLinkByReference(t *testing.T) {
	ini, rsp := shmLinks(t, cm.ShmMinRing)
	tbl := mem.NewTable()
	const segSize = 1 << 20
	var segs [3]*mem.Region
	for i := range segs {
		r, err := tbl.RegisterShared(1, segSize, mem.LocalWrite, mem.Options{})
		if err != nil {
			t.Fatal(err)
		}
		segs[i] = r
		b := r.Bytes()
		for j := range b {
			b[j] = byte(i*31 + j*7 + j>>9)
		}
	}
	gone, _ := mem.FindShared(segs[0].Bytes())
	local := make([]byte, segSize)
	for j := range local {
		local[j] = byte(j * 13)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	var pieces [][]byte
	total := 0
	for total < 8<<20 {
		n := rng.IntN(200_000) + 1
		src := local
		if rng.IntN(3) > 0 {
			src = segs[rng.IntN(2)].Bytes() // segs[2] comes at the end
		}
		off := rng.IntN(segSize - n + 1)
		pieces = append(pieces, src[off:off+n])
		total += n
	}
	last := segs[2].Bytes()[100 : 100+300_000]
	var want []byte
	for _, p := range pieces {
		want = append(want, p...)
	}
	want = append(want, last...)
	done := make(chan error, 1)
	go func() {
		for i := 0; i < len(pieces); {
			k := min(len(pieces)-i, 1+rng.IntN(4))
			vec := append([][]byte(nil), pieces[i:i+k]...)
			for len(vec) > 0 {
				n, err := ini.Writev(vec, nil, true)
				if err != nil {
					done <- err
					return
				}
				for n > 0 {
					if n >= len(vec[0]) {
						n -= len(vec[0])
						vec = vec[1:]
					} else {
						vec[0] = vec[0][n:]
						n = 0
					}
				}
			}
			i += k
		}
		// A segment told to the peer goes: the next write tells it so.
		if err := segs[0].Deregister(); err != nil {
			done <- err
			return
		}
		for b := last; len(b) > 0; {
			n, err := ini.Writev([][]byte{b}, nil, true)
			if err != nil {
				done <- err
				return
			}
			b = b[n:]
		}
		done <- nil
	}()
	got := make([]byte, 0, len(want))
	buf := make([]byte, 150_000)
	rrng := rand.New(rand.NewPCG(9, 10))
	for len(got) < len(want) {
		k := rrng.IntN(len(buf)-1) + 1
		var n int
		var err error
		if rrng.IntN(2) == 0 {
			n, err = rsp.Readv([][]byte{buf[:k]})
		} else {
			n, err = rsp.Readv([][]byte{buf[:k/3], buf[k/3 : k]})
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		t.Fatalf("bytes differ from byte %d of %d", i, len(want))
	}
	if un, err := ini.Unacked(); un != 0 || err != nil {
		t.Fatalf("unacked %d, %v after all was read", un, err)
	}
	if _, ok := rsp.segs[gone.ID]; ok {
		t.Error("the reader still maps the deregistered segment")
	}
	if len(rsp.segs) != 2 {
		t.Errorf("the reader maps %d segments, want 2", len(rsp.segs))
	}
	for _, r := range segs[1:] {
		if err := r.Deregister(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdapterSharedMemoryLinkBadRecords: records no gowarp writer makes,
// put in the ring by a hostile peer, fail the read with a clear error:
// no panic, no fault, no hang.
func TestAdapterSharedMemoryLinkBadRecords(t *testing.T) {
	plain, err := unix.MemfdCreate("plain", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(plain)
	unix.Ftruncate(plain, 1<<16)
	var st unix.Stat_t
	unix.Fstat(plain, &st)
	_, sg := testShared(t, 1<<16)
	rec, seg := testRec, testSegRec
	good := seg(sg.ID, sg.PID, sg.FD, sg.Ino, sg.Size)
	for _, c := range []struct {
		name string
		ring []byte
	}{
		{"unknown kind", rec(9, 1, 0)},
		{"reserved header bytes", append([]byte{shmInline, 1, 0, 0, 1, 0, 0, 0}, 'x')},
		{"empty inline", rec(shmInline, 0)},
		{"segment with a length", rec(shmSeg, 5, 0, 0, 0, 0)},
		{"half a header", []byte{shmInline, 0, 0}},
		{"half a reference", rec(shmRef, 10)},
		{"reference to no segment", rec(shmRef, 10, 77, 0)},
		{"reference past the segment", append(append([]byte{}, good...), rec(shmRef, 100, uint64(sg.ID), uint64(sg.Size-99))...)},
		{"reference wrapping", append(append([]byte{}, good...), rec(shmRef, 100, uint64(sg.ID), ^uint64(0)-50)...)},
		{"segment told twice", append(append([]byte{}, good...), good...)},
		{"segment of no process", seg(1, 1<<30, 3, 1, 100)},
		{"segment of another inode", seg(1, os.Getpid(), sg.FD, sg.Ino+1, sg.Size)},
		{"segment of another size", seg(1, os.Getpid(), sg.FD, sg.Ino, sg.Size+4096)},
		{"segment not sealed", seg(1, os.Getpid(), plain, st.Ino, 1<<16)},
		{"segment of zero bytes", seg(1, os.Getpid(), sg.FD, sg.Ino, 0)},
	} {
		t.Run(c.name, func(t *testing.T) {
			ini, rsp := shmLinks(t, cm.ShmMinRing)
			ini.tx.set(0, c.ring)
			ini.tx.head.Store(uint64(len(c.ring)))
			buf := make([]byte, 4096)
			_, err := rsp.Readv([][]byte{buf})
			if err == nil {
				t.Fatal("read a bad record without an error")
			}
			if !errors.Is(err, errShmRecord) && !bytes.Contains([]byte(err.Error()), []byte("shared memory")) {
				t.Fatalf("error %v does not say what is wrong", err)
			}
		})
	}
}

// testShared registers n bytes of shared memory for a test and returns
// the region and its segment.
func testShared(t testing.TB, n int) (*mem.Region, *mem.Shared) {
	t.Helper()
	r, err := mem.NewTable().RegisterShared(1, n, mem.LocalWrite, mem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Deregister() })
	sg, _ := mem.FindShared(r.Bytes())
	return r, sg
}

// testRec is a ring record of kind for n stream bytes with a body of
// 64-bit words, as a hostile writer may make it.
func testRec(kind byte, n int, body ...uint64) []byte {
	b := make([]byte, 8)
	b[0] = kind
	binary.LittleEndian.PutUint32(b[4:], uint32(n))
	for _, v := range body {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

// testSegRec is a segment record.
func testSegRec(id uint32, pid, fd int, ino uint64, size int) []byte {
	return testRec(shmSeg, 0, uint64(id)|uint64(pid)<<32, uint64(fd), ino, uint64(size))
}

// FuzzShmRecords: whatever a peer puts in the ring, the reader's record
// decoder (take) returns bytes or an error: no panic, no read outside the
// ring or a segment, no loop without progress.
func FuzzShmRecords(f *testing.F) {
	sr, sg := testShared(f, 1<<16)
	// Seeds: what a real writer makes (inline and reference records, a
	// segment and its forget) and a few bad ones.
	{
		ini, _ := shmPipeLinks(f, cm.ShmMinRing)
		ini.put([][]byte{[]byte("header"), sr.Bytes()[100 : 100+shmRefMin], []byte("trailer")})
		f.Add(bytes.Clone(ini.tx.data[:ini.tx.head.Load()]), uint16(100))
		f.Add(bytes.Clone(ini.tx.data[:ini.tx.head.Load()]), uint16(4999))
	}
	good := testSegRec(sg.ID, sg.PID, sg.FD, sg.Ino, sg.Size)
	ref := testRec(shmRef, 0x10, uint64(sg.ID), 7)
	f.Add(append(append([]byte{}, good...), ref...), uint16(3))
	f.Add([]byte{shmInline, 0, 0, 0, 3, 0, 0, 0, 'a', 'b', 'c', shmForget, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, uint16(1))
	f.Add([]byte{9, 0, 0, 0, 1, 0, 0, 0, 'x'}, uint16(0))
	f.Fuzz(func(t *testing.T, ring []byte, rd uint16) {
		ini, rsp := shmPipeLinks(t, cm.ShmMinRing)
		ring = ring[:min(len(ring), cm.ShmMinRing)]
		ini.tx.set(0, ring)
		ini.tx.head.Store(uint64(len(ring)))
		buf := make([]byte, 1+int(rd)%5000)
		for rsp.ready() {
			rt, rleft := rsp.rt, rsp.rleft
			limit := -1
			if rd&1 == 0 {
				limit = shmStagedMax
			}
			n, err := rsp.take([][]byte{buf[:len(buf)/2], buf[len(buf)/2:]}, limit)
			if err != nil {
				return
			}
			if n == 0 && rsp.rt == rt && rsp.rleft == rleft {
				t.Fatalf("no progress at %d of %d ring bytes", rt, len(ring))
			}
		}
	})
}

// shmPipeLinks is shmLinks over net.Pipe: for tests that never sleep on
// the connection.
func shmPipeLinks(t testing.TB, ring int) (ini, rsp *shmLink) {
	t.Helper()
	a, b := net.Pipe()
	ini, rsp = newShmPair(t, a, b, ring)
	ini.answerProbe()
	rsp.answerProbe()
	return ini, rsp
}

// TestAdapterSharedMemoryLinkFreedBeforeRead: a region deregistered (its
// memfd closed, its mapping gone) after the writer passed its bytes by
// reference but before the reader came to them is still read whole: the
// writer keeps a duplicate of the memfd until the reader has mapped it.
func TestAdapterSharedMemoryLinkFreedBeforeRead(t *testing.T) {
	ini, rsp := shmLinks(t, cm.ShmMinRing)
	tbl := mem.NewTable()
	r, err := tbl.RegisterShared(1, 1<<20, mem.LocalWrite, mem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range r.Bytes() {
		r.Bytes()[i] = byte(i * 3)
	}
	want := bytes.Clone(r.Bytes()[4096 : 4096+200_000])
	if n, err := ini.Writev([][]byte{r.Bytes()[4096 : 4096+200_000]}, nil, true); n != len(want) || err != nil {
		t.Fatalf("wrote %d, %v", n, err)
	}
	// Unacked counts stream bytes, not the few bytes of records in the
	// ring: Acked completions depend on it.
	if un, err := ini.Unacked(); un != len(want) || err != nil {
		t.Fatalf("unacked %d, %v before the reader read, want %d", un, err, len(want))
	}
	if err := r.Deregister(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(want))
	buf := make([]byte, 64<<10)
	for len(got) < len(want) {
		n, err := rsp.Readv([][]byte{buf, buf[:0]})
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ")
	}
	// The duplicate goes once the reader has the segment.
	ini.Writev([][]byte{[]byte("x")}, nil, true)
	if len(ini.dups) != 0 {
		t.Errorf("%d duplicates kept after the reader mapped the segment", len(ini.dups))
	}
}

// TestAdapterSharedMemoryLinkProbe: a writer sends shared memory inline
// until the peer's reader has answered its probe, by reference after a
// yes, and inline for good after a no (a peer that cannot open this
// process's memory: another PID namespace, say), the bytes intact and no
// error either way.
func TestAdapterSharedMemoryLinkProbe(t *testing.T) {
	r, _ := testShared(t, 1<<20)
	for i := range r.Bytes() {
		r.Bytes()[i] = byte(i * 5)
	}
	src := r.Bytes()[:50_000]
	send := func(t *testing.T, ini, rsp *shmLink) {
		t.Helper()
		if n, err := ini.Writev([][]byte{src}, nil, true); n != len(src) || err != nil {
			t.Fatalf("wrote %d, %v", n, err)
		}
		got := make([]byte, 0, len(src))
		buf := make([]byte, 64<<10)
		for len(got) < len(src) {
			n, err := rsp.Readv([][]byte{buf, buf[:0]})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, buf[:n]...)
		}
		if !bytes.Equal(got, src) {
			t.Fatal("bytes differ")
		}
	}
	for _, c := range []struct {
		name   string
		spoil  bool // the probe names a process that is not there
		segs   int  // segments the reader maps after the second write
		byRef  bool
		answer uint32
	}{
		{"yes", false, 1, true, shmRefsOK},
		{"no", true, 0, false, shmRefsNo},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := net.Pipe()
			ini, rsp := newShmPair(t, a, b, cm.ShmMinRing) // probes unanswered
			if c.spoil {
				ini.tx.probe[1].Store(1<<30 | ini.tx.probe[1].Load()&^0xffffffff)
			}
			send(t, ini, rsp) // unanswered when written: inline
			if len(rsp.segs) != 0 {
				t.Fatalf("the first write went by reference before the probe was answered")
			}
			if v := ini.tx.verdict.Load(); v != c.answer {
				t.Fatalf("verdict %d after the reader's first read, want %d", v, c.answer)
			}
			send(t, ini, rsp)
			if len(rsp.segs) != c.segs || ini.byRef != c.byRef {
				t.Fatalf("after the answer: %d segments mapped, by reference %v; want %d, %v", len(rsp.segs), ini.byRef, c.segs, c.byRef)
			}
		})
	}
}
