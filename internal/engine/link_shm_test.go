//go:build linux

package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp/internal/cm"
	"golang.org/x/sys/unix"
)

// shmFile returns two mappings of a memfd sized for rings of ring bytes,
// as two processes have: each link unmaps its own.
func shmFile(t testing.TB, ring int) (mem [2][]byte) {
	t.Helper()
	size := cm.ShmDataOff + 2*ring
	fd, err := unix.MemfdCreate("gowarp-shm-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	for i := range mem {
		if mem[i], err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
			t.Fatal(err)
		}
	}
	return mem
}

// newShmPair returns the two ends of a link over a new shared file,
// with a and b as their connections; the probes are not answered.
func newShmPair(t testing.TB, a, b net.Conn, ring int) (ini, rsp *shmLink) {
	m := shmFile(t, ring)
	ini = newShmLink(a, &cm.SharedMemory{Mem: m[0], Ring: ring, Initiator: true}, 0).(*shmLink)
	rsp = newShmLink(b, &cm.SharedMemory{Mem: m[1], Ring: ring}, 0).(*shmLink)
	t.Cleanup(func() { ini.Close(); rsp.Close() })
	return ini, rsp
}

// shmLinks returns the two ends of a shared-memory link with rings of
// ring bytes over a memfd mapped twice, and a loopback TCP
// connection as its liveness channel.
func shmLinks(t *testing.T, ring int) (ini, rsp *shmLink) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	ini, rsp = newShmPair(t, a, b, ring)
	// Each reader answers its writer's probe now, not at its first read,
	// so that memory from RegisterShared goes by reference from the first
	// write (TestAdapterSharedMemoryLinkProbe tests the answer).
	ini.answerProbe()
	rsp.answerProbe()
	return ini, rsp
}

// TestAdapterSharedMemoryLinkStream: bytes written in pieces of random sizes, vectored,
// arrive intact and in order through a ring they wrap many times; calls
// with nothing to move return at once.
func TestAdapterSharedMemoryLinkStream(t *testing.T) {
	ini, rsp := shmLinks(t, cm.ShmMinRing)
	if n, err := rsp.Readv([][]byte{nil, {}}); n != 0 || err != nil {
		t.Fatalf("empty read: %d, %v", n, err)
	}
	if n, err := ini.Writev(nil, nil, true); n != 0 || err != nil {
		t.Fatalf("empty write: %d, %v", n, err)
	}
	src := make([]byte, 3<<20)
	for i := range src {
		src[i] = byte(i*7 + i>>11)
	}
	done := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(3, 4))
		for off := 0; off < len(src); {
			a := min(rng.IntN(40_000)+1, len(src)-off)
			b := min(rng.IntN(3000), len(src)-off-a)
			n, err := ini.Writev([][]byte{src[off : off+a], src[off+a : off+a+b]}, nil, true)
			if err != nil {
				done <- err
				return
			}
			off += n
		}
		done <- nil
	}()
	got := make([]byte, 0, len(src))
	buf := make([]byte, 70_000)
	rng := rand.New(rand.NewPCG(5, 6))
	for len(got) < len(src) {
		k := rng.IntN(len(buf)-1) + 1
		var n int
		var err error
		if rng.IntN(2) == 0 {
			n, err = rsp.Readv([][]byte{buf[:k]}) // the staging read, bounded
		} else {
			n, err = rsp.Readv([][]byte{buf[:k/2], buf[k/2 : k]})
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("bytes differ")
	}
	if un, err := ini.Unacked(); un != 0 || err != nil {
		t.Fatalf("unacked %d, %v after all was read", un, err)
	}
}

// TestAdapterSharedMemoryLinkWakes: a reader waiting on an empty ring, spinning or asleep,
// returns when a read deadline passes (the engine's doorbell), and then
// reads on; a writer blocked on a full ring returns when a write deadline
// passes and when the link closes; a reader whose peer closed gets the
// peer's last bytes, then the end.
func TestAdapterSharedMemoryLinkWakes(t *testing.T) {
	ini, rsp := shmLinks(t, cm.ShmMinRing)
	buf := make([]byte, 100)
	for _, after := range []time.Duration{0, 10 * time.Microsecond, 20 * time.Millisecond} {
		set := make(chan struct{})
		go func() {
			defer close(set)
			time.Sleep(after)
			rsp.Conn().SetReadDeadline(time.Unix(1, 0))
		}()
		if _, err := rsp.Readv([][]byte{buf}); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("after %v: read %v, want the deadline", after, err)
		}
		// The read can end on the link's deadline before the call has
		// set the connection's: clear both once it has.
		<-set
		rsp.Conn().SetReadDeadline(time.Time{})
	}
	if _, err := ini.Writev([][]byte{[]byte("hello")}, nil, true); err != nil {
		t.Fatal(err)
	}
	if n, err := rsp.Readv([][]byte{buf}); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	// Fill the ring (all but a record's header), then block.
	full := make([]byte, cm.ShmMinRing)
	wrote, err := ini.Writev([][]byte{full}, nil, false)
	if wrote != len(full)-shmHdr || err != nil {
		t.Fatalf("wrote %d, %v", wrote, err)
	}
	if _, err := ini.Writev([][]byte{full}, nil, false); !errors.Is(err, errWouldBlock) {
		t.Fatalf("non-blocking write to a full ring: %v", err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		ini.Conn().SetWriteDeadline(time.Unix(1, 0))
	}()
	if _, err := ini.Writev([][]byte{full}, nil, true); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("blocked write: %v, want the deadline", err)
	}
	ini.Conn().SetWriteDeadline(time.Time{})
	go func() {
		time.Sleep(20 * time.Millisecond)
		ini.Close()
	}()
	if _, err := ini.Writev([][]byte{full}, nil, true); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked write: %v, want closed", err)
	}
	// The peer closed with a full ring unread: all of it, then the end.
	read := 0
	for {
		n, err := rsp.Readv([][]byte{buf})
		read += n
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, unix.ECONNRESET) {
				t.Fatalf("after %d bytes: %v", read, err)
			}
			break
		}
	}
	if read != wrote {
		t.Fatalf("read %d of the %d bytes written before the close", read, wrote)
	}
	if _, err := ini.Readv([][]byte{buf}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on a closed link: %v", err)
	}
}

// TestAdapterSharedMemoryLinkNoLostWakeup: with spinning cut to its least,
// so that nearly every wait sleeps, a ping-pong of small messages and a
// stream through a ring far smaller than what is sent both finish: a
// reader that sets its waiting word as the writer publishes, or a writer
// that sleeps on a full ring as the reader frees it, is always woken (a
// wake-up lost there hangs the test, which the deadline below turns into
// a failure).
func TestAdapterSharedMemoryLinkNoLostWakeup(t *testing.T) {
	ini, rsp := shmLinks(t, cm.ShmMinRing)
	for _, l := range []*shmLink{ini, rsp} {
		l.rspin, l.spinMin, l.spinMax, l.wspin = 0, 0, 0, 0
	}
	// The peer gets the processor between a side's last look at the ring
	// and its waiting word, where a protocol that looked only before
	// setting the word would sleep through the peer's bytes.
	testHookShmSleep = runtime.Gosched
	defer func() { testHookShmSleep = nil }()
	done := make(chan error, 2)
	deadline := time.Now().Add(20 * time.Second)
	for _, l := range []*shmLink{ini, rsp} {
		l.Conn().SetDeadline(deadline)
	}
	// Ping-pong: each side echoes what it gets.
	const rounds = 3000
	go func() {
		buf := make([]byte, 8)
		for i := 0; i < rounds; i++ {
			n, err := rsp.Readv([][]byte{buf})
			if err == nil && n != 8 {
				err = io.ErrShortBuffer
			}
			if err == nil {
				_, err = rsp.Writev([][]byte{buf[:n]}, nil, true)
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	msg, buf := make([]byte, 8), make([]byte, 8)
	for i := 0; i < rounds; i++ {
		binary.LittleEndian.PutUint64(msg, uint64(i))
		if n, err := ini.Writev([][]byte{msg}, nil, true); err != nil || n != 8 {
			shmPingFail(t, done, ini, rsp, "round %d: wrote %d, %v", i, n, err)
		}
		if n, err := ini.Readv([][]byte{buf}); err != nil || n != 8 || !bytes.Equal(buf, msg) {
			shmPingFail(t, done, ini, rsp, "round %d: read %d %x, %v", i, n, buf[:n], err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A stream 64 times the ring: the writer sleeps on a full ring, the
	// reader on an empty one, over and over.
	src := make([]byte, 64*cm.ShmMinRing)
	for i := range src {
		src[i] = byte(i * 13)
	}
	go func() {
		for off := 0; off < len(src); {
			n, err := ini.Writev([][]byte{src[off:min(off+20_000, len(src))]}, nil, true)
			if err != nil {
				done <- err
				return
			}
			off += n
		}
		done <- nil
	}()
	got := make([]byte, 0, len(src))
	rbuf := make([]byte, 30_000)
	for reads := 0; len(got) < len(src); reads++ {
		if reads%2 == 1 {
			// The writer fills the ring while the reader is away, and
			// must sleep on it, however the goroutines are scheduled
			// (a reader that always kept up left it fewer than 10 sleeps
			// in 1 run of 15 under load).
			time.Sleep(200 * time.Microsecond)
		}
		n, err := rsp.Readv([][]byte{rbuf[:7000], rbuf[7000:]})
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		got = append(got, rbuf[:n]...)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("bytes differ")
	}
	// The waits did sleep: the test looked at the protocol, not at a spin.
	if ini.rsleeps+rsp.rsleeps < 100 || ini.wsleeps < 10 {
		t.Errorf("%d and %d readers' sleeps, %d writer's: want at least 100 and 10", ini.rsleeps, rsp.rsleeps, ini.wsleeps)
	}
	t.Logf("sleeps: readers %d and %d, writer %d", ini.rsleeps, rsp.rsleeps, ini.wsleeps)
}

// shmPingFail ends a ping-pong with what each side of the link shows,
// once the echoing goroutine has ended (the links' deadline ends it) and
// with its error, so that a wake-up lost tells which side slept through it.
func shmPingFail(t *testing.T, done <-chan error, ini, rsp *shmLink, format string, args ...any) {
	t.Helper()
	state := "initiator: " + ini.dump(true)
	var echo error
	select {
	case echo = <-done:
		state += "; responder: " + rsp.dump(true)
	case <-time.After(30 * time.Second):
		echo = errors.New("still running")
		state += "; responder: " + rsp.dump(false)
	}
	t.Fatalf(format+"\n\techo: %v\n\t%s", append(args, echo, state)...)
}

// dump is the link's counters and waiting words, and its reader's and
// writer's own if mine (no call of the link's is running).
func (l *shmLink) dump(mine bool) string {
	ring := func(r *shmRing) string {
		return fmt.Sprintf("head %d tail %d ltail %d rwait %d wwait %d", r.head.Load(), r.tail.Load(), r.ltail.Load(), r.rwait.Load(), r.wwait.Load())
	}
	s := fmt.Sprintf("tx {%s}, rx {%s}", ring(&l.tx), ring(&l.rx))
	if mine {
		s += fmt.Sprintf(" rt %d rlt %d rleft %d, sleeps %d read %d write", l.rt, l.rlt, l.rleft, l.rsleeps, l.wsleeps)
	}
	return s
}

// TestShmHandshake: the reader's announcement that it sleeps and the
// writer's publication, raced against each other round after round, never
// both miss: the reader sees the new head, or the writer sees the reader
// waiting (and rings it). Under the race detector, with plain Stores,
// both missed now and then, and the reader slept through bytes that were
// there (see shmRing.publishHead).
func TestShmHandshake(t *testing.T) {
	ini, rsp := shmLinks(t, cm.ShmMinRing)
	rounds := int64(100_000)
	if testing.Short() {
		rounds = 10_000
	}
	var start, done atomic.Int64
	go func() { // the reader
		for i := int64(1); i <= rounds; i++ {
			for start.Load() < i {
			}
			saw := int64(0)
			if rsp.announceRead() {
				saw = 1
			}
			done.Store(i<<1 | saw)
		}
	}()
	misses := 0
	h := ini.tx.head.Load()
	for i := int64(1); i <= rounds; i++ {
		// The reader has taken all and is not waiting; start.Store
		// orders these before its next look.
		rsp.rx.rwait.Store(0)
		rsp.rt = h
		start.Store(i)
		h += 16
		rang := ini.tx.publishHead(h)
		d := done.Load()
		for ; d>>1 < i; d = done.Load() {
		}
		if !rang && d&1 == 0 {
			misses++
		}
	}
	if misses > 0 {
		t.Fatalf("in %d of %d rounds the reader missed the bytes and the writer missed the reader", misses, rounds)
	}
}

// TestShmWaiterSlowYields: one sched_yield that takes longer than
// shmYieldSlow leaves the yields on (the peer's turn can be that long);
// a second within shmSlowPair turns them off for shmNoYield, and a wait
// then spins at most shmSpinNoYield; two slow yields further apart than
// shmSlowPair do not.
func TestShmWaiterSlowYields(t *testing.T) {
	defer func(f func()) { shmSchedYield = f }(shmSchedYield)
	yields, slow := 0, false
	shmSchedYield = func() {
		yields++
		if slow {
			time.Sleep(shmYieldSlow + time.Millisecond)
		}
	}
	// A wait that has spun 30 µs of a 100 µs budget goes on spinning
	// with the yields on, and stops with them off.
	spun := func(w *shmWaiter) bool { return w.spin(time.Now().Add(-30*time.Microsecond), 100*time.Microsecond) }

	w := newShmWaiter()
	for i := 0; i < 3; i++ {
		if !spun(&w) {
			t.Fatalf("fast yields: look %d stopped the spin", i)
		}
	}
	slow = true
	spun(&w)
	slow = false
	if n := yields; !spun(&w) || yields != n+1 {
		t.Fatal("one slow yield turned the yields off")
	}
	slow = true
	spun(&w)
	slow = false
	n := yields
	if spun(&w) {
		t.Error("two slow yields in a row: the wait still spins past shmSpinNoYield")
	}
	if w.spin(time.Now(), 100*time.Microsecond); yields != n {
		t.Error("two slow yields in a row: still yielding")
	}
	if !w.noYield.After(time.Now().Add(shmNoYield - 50*time.Millisecond)) {
		t.Errorf("yields off until %v, want about %v from now", time.Until(w.noYield), shmNoYield)
	}

	w = newShmWaiter()
	slow = true
	spun(&w)
	time.Sleep(shmSlowPair)
	spun(&w)
	slow = false
	if n := yields; !spun(&w) || yields != n+1 {
		t.Error("two slow yields more than shmSlowPair apart turned the yields off")
	}
}
