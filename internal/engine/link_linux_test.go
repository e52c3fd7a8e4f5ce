package engine

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if a, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if b, err = ln.Accept(); err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// idleBufs counts ReadIdle's buffers given back and taken.
type idleBufs struct {
	put chan []byte
	got []byte
}

func (ib *idleBufs) give(b []byte) { ib.put <- b }
func (ib *idleBufs) take() []byte  { return ib.got }

// TestReadIdle: a read that finds bytes reads them into the buffer it was
// given; one that finds none gives the buffer back before it waits, and
// reads what comes into the one it takes then; a deadline while it waits
// returns with no buffer.
func TestReadIdle(t *testing.T) {
	a, b := tcpPair(t)
	l := NewLink(b).(*fdLink)
	ib := &idleBufs{put: make(chan []byte, 1), got: make([]byte, 64)}
	first := make([]byte, 64)

	a.Write([]byte("ready"))
	for inq := 0; inq < 5; { // the read below must find them there
		l.rc.Control(func(fd uintptr) { inq, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		time.Sleep(time.Millisecond)
	}
	n, buf, err := l.ReadIdle(first, ib.give, ib.take, nil)
	if err != nil || n != 5 || &buf[0] != &first[0] || string(buf[:n]) != "ready" {
		t.Fatalf("bytes there: read %d into %p (%q), %v; want 5 into the buffer given", n, buf, buf[:n], err)
	}
	select {
	case <-ib.put:
		t.Fatal("the buffer was given back though bytes were there")
	default:
	}

	type result struct {
		n   int
		buf []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, buf, err := l.ReadIdle(first, ib.give, ib.take, nil)
		done <- result{n, buf, err}
	}()
	if back := <-ib.put; &back[0] != &first[0] { // before any byte is sent
		t.Fatalf("gave back %p, not the buffer given", back)
	}
	a.Write([]byte("later"))
	r := <-done
	if r.err != nil || r.n != 5 || &r.buf[0] != &ib.got[0] || !bytes.Equal(r.buf[:5], []byte("later")) {
		t.Fatalf("waited: read %d into %p (%q), %v; want 5 into the buffer taken", r.n, r.buf, r.buf[:r.n], r.err)
	}

	b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	n, buf, err = l.ReadIdle(first, ib.give, ib.take, nil)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n != 0 || buf != nil {
		t.Fatalf("deadline: read %d into %p, %v; want nothing, no buffer, the deadline", n, buf, err)
	}
	<-ib.put
	b.SetReadDeadline(time.Time{})

	a.Close()
	n, buf, err = l.ReadIdle(first, ib.give, ib.take, nil)
	if n != 0 || err == nil {
		t.Fatalf("closed peer: read %d, %v; want an error", n, err)
	}
	_ = buf
}

// TestAbortedAfterErrorTaken: a connection TCP aborts (its peer keeps the
// window shut past TCP_USER_TIMEOUT) reads as end-of-file once a write
// took the error TCP recorded; Aborted tells that from the peer's FIN,
// whether the FIN came alone or a reset followed it.
func TestAbortedAfterErrorTaken(t *testing.T) {
	a, b := tcpPair(t)
	ra, _ := a.(*net.TCPConn).SyscallConn()
	ra.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 300)
	})
	b.(*net.TCPConn).SetReadBuffer(4096)
	a.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	chunk := make([]byte, 64<<10)
	for { // fill b's window and a's buffer: b never reads
		if _, err := a.Write(chunk); err != nil {
			break
		}
	}
	l := NewLink(a).(*fdLink)
	for deadline := time.Now().Add(60 * time.Second); ; {
		var state uint8
		ra.Control(func(fd uintptr) {
			if ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				state = ti.State
			}
		})
		if state == tcpClose {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("TCP did not abort the connection whose peer kept its window shut")
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.SetWriteDeadline(time.Time{})
	if _, err := a.Write([]byte{1}); !errors.Is(err, unix.ETIMEDOUT) { // the writer takes the error
		t.Fatalf("write after the abort: %v, want ETIMEDOUT", err)
	}
	if n, err := l.Readv([][]byte{make([]byte, 16)}); !errors.Is(err, io.EOF) {
		t.Fatalf("read after the error was taken: %d, %v; want EOF", n, err)
	}
	if !l.Aborted() {
		t.Error("Aborted false for a connection TCP aborted")
	}

	c, d := tcpPair(t) // the peer's FIN
	d.Close()
	lc := NewLink(c).(*fdLink)
	if _, err := lc.Readv([][]byte{make([]byte, 16)}); !errors.Is(err, io.EOF) {
		t.Fatalf("read after the peer's FIN: %v, want EOF", err)
	}
	if lc.Aborted() {
		t.Error("Aborted true after the peer's FIN")
	}
	c.Write([]byte("after the FIN")) // the closed peer answers with a reset
	time.Sleep(50 * time.Millisecond)
	if _, err := lc.Readv([][]byte{make([]byte, 16)}); !errors.Is(err, io.EOF) {
		t.Fatalf("read after the FIN and a reset: %v, want EOF", err)
	}
	if lc.Aborted() {
		t.Error("Aborted true after the peer's FIN and a reset")
	}
}

// TestSmallWritevTakesNoFreeList: a Writev of a few vectors (a
// ping-pong's FPDU) uses the link's own arrays, not writeVecFree's, whose
// lock went from core to core at every send; a larger one still takes
// them from the list.
func TestSmallWritevTakesNoFreeList(t *testing.T) {
	a, b := tcpPair(t)
	l := NewLink(a).(*fdLink)
	// held reports whether the Writev still waited after wait: a long
	// wait for one that should not wait (a busy host may be slow to run
	// it), a short one for one that must (it cannot end meanwhile).
	write := func(bufs [][]byte, records []int, wait time.Duration) (held bool) {
		writeVecFree.mu.Lock()
		done := make(chan error, 1)
		go func() {
			_, err := l.Writev(bufs, records, true)
			done <- err
		}()
		var err error
		select {
		case err = <-done:
		case <-time.After(wait):
			held = true // it waits for the list's lock
		}
		writeVecFree.mu.Unlock()
		if held {
			err = <-done
		}
		if err != nil {
			t.Fatal(err)
		}
		return held
	}
	if write([][]byte{[]byte("hdr"), []byte("payload"), []byte("crc")}, []int{3}, 10*time.Second) {
		t.Fatal("a Writev of three vectors waited for writeVecFree")
	}
	many := make([][]byte, smallIov+1)
	for i := range many {
		many[i] = []byte{byte(i)}
	}
	if !write(many, nil, 200*time.Millisecond) {
		t.Fatalf("a Writev of %d vectors did not take writeVecFree's arrays", len(many))
	}
	want := append([]byte("hdrpayloadcrc"), make([]byte, smallIov+1)...)
	for i := range smallIov + 1 {
		want[13+i] = byte(i)
	}
	got := make([]byte, len(want))
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
}

// spinLink returns a link over a loopback pair and its peer, with
// tcpYield replaced by yield and the host's CPUs taken as free (or not)
// for the test.
func spinLink(t *testing.T, yield func(), free bool) (*fdLink, net.Conn) {
	t.Helper()
	a, b := tcpPair(t)
	old := tcpYield
	tcpYield = yield
	cpus.mu.Lock()
	at, ok := cpus.at.Load(), cpus.ok.Load()
	cpus.at.Store(math.MaxInt64) // not read again during the test
	cpus.ok.Store(free)
	cpus.mu.Unlock()
	t.Cleanup(func() {
		tcpYield = old
		cpus.at.Store(at)
		cpus.ok.Store(ok)
	})
	l := NewLink(b).(*fdLink)
	l.setBusyPoll(DefaultBusyPoll, nil, nil)
	return l, a
}

// waitInq waits until l's socket holds n bytes.
func waitInq(l *fdLink, n int) {
	for inq := 0; inq < n; {
		l.rc.Control(func(fd uintptr) { inq, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		if inq < n {
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// TestReadIdleSpinTakesBytes: a reader that finds its socket empty reads
// it again as it spins, and takes bytes that come meanwhile into the
// buffer it was given, never waiting in the netpoller (the buffer is not
// given back); with nothing coming it spins out its time, then waits.
func TestReadIdleSpinTakesBytes(t *testing.T) {
	var peer net.Conn
	var l *fdLink
	writeAt := -1 // the yield at which the peer's byte goes
	yields := 0
	l, peer = spinLink(t, func() {
		if yields++; yields == writeAt {
			peer.Write([]byte("x"))
			waitInq(l, 1)
		}
	}, true)
	ib := &idleBufs{put: make(chan []byte, 1), got: make([]byte, 64)}
	first := make([]byte, 64)

	// Nothing comes: it spins, sleeps and meets its deadline.
	l.Conn().SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, _, err := l.ReadIdle(first, ib.give, ib.take, nil); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("with nothing sent: %v, want the deadline", err)
	}
	<-ib.put // it spun out its time (or was not scheduled for it) and waited
	l.Conn().SetReadDeadline(time.Time{})

	// The byte comes at the spin's third yield.
	l.spinFor = time.Hour // the spin does not run out, however the test is scheduled
	yields, writeAt = 0, 3
	n, buf, err := l.ReadIdle(first, ib.give, ib.take, nil)
	if err != nil || n != 1 || &buf[0] != &first[0] || buf[0] != 'x' {
		t.Fatalf("byte sent while it spun: read %d into %p, %v; want 1 into the buffer given", n, buf, err)
	}
	select {
	case <-ib.put:
		t.Fatal("the buffer was given back: it waited in the netpoller")
	default:
	}
	if yields != writeAt {
		t.Fatalf("%d yields, want %d (the byte came at the %dth)", yields, writeAt, writeAt)
	}
}

// TestReadIdleNoSpin: a reader that finds its socket empty waits in the
// netpoller at once where its queue pair did not ask for busy polling,
// however free the host, where the host's CPUs are all wanted, and while
// a large Read is outstanding.
func TestReadIdleNoSpin(t *testing.T) {
	for _, c := range []struct {
		name  string
		poll  time.Duration
		free  bool
		large int32
	}{{"not asked for", 0, true, 0}, {"busy host", time.Hour, false, 0}, {"large read outstanding", time.Hour, true, 1}} {
		t.Run(c.name, func(t *testing.T) {
			yields := 0
			l, peer := spinLink(t, func() { yields++ }, c.free)
			var large atomic.Int32
			large.Store(c.large)
			l.setBusyPoll(c.poll, nil, &large)
			ib := &idleBufs{put: make(chan []byte, 1), got: make([]byte, 64)}
			done := make(chan error, 1)
			go func() {
				_, _, err := l.ReadIdle(make([]byte, 64), ib.give, ib.take, nil)
				done <- err
			}()
			<-ib.put // it waits in the netpoller
			peer.Write([]byte("x"))
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if yields != 0 {
				t.Fatalf("%d yields, want none", yields)
			}
		})
	}
}

// TestReadIdleBellStopsSpin: the queue pair's doorbell (QP.ring: the bell,
// then a read deadline in the past) stops a reader that spins, which
// would otherwise spin out its whole time before it saw the deadline.
func TestReadIdleBellStopsSpin(t *testing.T) {
	yields := 0
	l, _ := spinLink(t, func() { yields++ }, true)
	var bell atomic.Bool
	l.setBusyPoll(time.Hour, &bell, nil)
	ib := &idleBufs{put: make(chan []byte, 1), got: make([]byte, 64)}
	bell.Store(true)
	l.Conn().SetReadDeadline(time.Unix(1, 0))
	if _, _, err := l.ReadIdle(make([]byte, 64), ib.give, ib.take, nil); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("rung: %v, want the deadline", err)
	}
	if yields != 0 {
		t.Fatalf("%d yields after the bell rang, want none", yields)
	}
}

// TestLoadavgRunning: the running threads of /proc/loadavg's text, and
// text that has none.
func TestLoadavgRunning(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		isOK bool
	}{
		{"0.61 0.52 0.40 3/98 30187\n", 3, true},
		{"12.00 9.10 5.00 17/203 1\n", 17, true},
		{"0.61 0.52 0.40 /98 30187\n", 0, false},
		{"0.61 0.52 0.40 3", 0, false},
		{"0.61 0.52", 0, false},
		{"", 0, false},
	} {
		n, ok := loadavgRunning([]byte(c.in))
		if n != c.n || ok != c.isOK {
			t.Errorf("%q: %d, %v; want %d, %v", c.in, n, ok, c.n, c.isOK)
		}
	}
}

// smallVecWrite returns vectors of 1-1500 bytes in records of about
// recBytes each, n bytes in all, as the transmit path builds them where
// FPDUs fill 1448-byte segments, and the bytes they make in order.
func smallVecWrite(n, recBytes int, seed uint64) (bufs [][]byte, records []int, want []byte) {
	r := seed
	rec := 0
	for len(want) < n {
		r = r*6364136223846793005 + 1442695040888963407
		k := min(1+int(r>>33)%1500, n-len(want))
		b := make([]byte, k)
		for i := range b {
			b[i] = byte(r>>(8*(i%7))) + byte(i)
		}
		bufs = append(bufs, b)
		want = append(want, b...)
		if rec += k; rec >= recBytes {
			records = append(records, len(bufs))
			rec = 0
		}
	}
	return bufs, records, want
}

// resumeWrite returns what is left of a write of bufs in records after n
// bytes were written, as the transmit path resumes one: whole vectors
// dropped, the first one left cut, the records counted from it.
func resumeWrite(bufs [][]byte, records []int, n int) ([][]byte, []int) {
	drop := 0
	for drop < len(bufs) && n >= len(bufs[drop]) {
		n -= len(bufs[drop])
		drop++
	}
	bufs = bufs[drop:]
	if n > 0 {
		bufs[0] = bufs[0][n:]
	}
	for len(records) > 0 && records[0] <= drop {
		records = records[1:]
	}
	for i := range records {
		records[i] -= drop
	}
	return bufs, records
}

// TestFlatten: the leading records that fit a flat buffer become one
// message of one vector each, holding their vectors' bytes in order, and
// the rest are left for the next write; a first record larger than the
// buffer is sent as it is; at most flatRecs records are flattened.
func TestFlatten(t *testing.T) {
	build := func(bufs [][]byte, records []int) *fdLink {
		l := &fdLink{wiov: make([]unix.Iovec, 0, maxIov), wmsg: make([]mmsghdr, 0, maxIov)}
		msg, r := 0, 0
		for i, b := range bufs {
			for r < len(records) && records[r] <= i {
				l.endMsg(msg)
				msg, r = len(l.wiov), r+1
			}
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			l.wiov = append(l.wiov, v)
		}
		l.endMsg(msg)
		return l
	}
	bytesOf := func(msgs []mmsghdr) (out []byte, vecs int) {
		for _, m := range msgs {
			for _, v := range unsafe.Slice(m.hdr.Iov, m.hdr.Iovlen) {
				out = append(out, unsafe.Slice(v.Base, v.Len)...)
			}
			vecs += int(m.hdr.Iovlen)
		}
		return out, vecs
	}
	f := new(flatBufs)
	for _, c := range []struct {
		name     string
		n, rec   int
		wantRecs int // records flattened; 0: none, the write as it is
	}{
		{"all fit", 3 * 40 << 10, 40 << 10, 3},
		{"two of three fit", 3 * 50 << 10, 50 << 10, 2},
		{"first too large", 200 << 10, 150 << 10, 0},
		{"more records than flatRecs", 200 << 10, 500, flatRecs},
	} {
		t.Run(c.name, func(t *testing.T) {
			bufs, records, want := smallVecWrite(c.n, c.rec, 1)
			l := build(bufs, records)
			if got, _ := bytesOf(l.wmsg); !bytes.Equal(got, want) {
				t.Fatal("the test's records do not hold its bytes")
			}
			msgs := l.flatten(f)
			got, vecs := bytesOf(msgs)
			if c.wantRecs == 0 {
				if &msgs[0] != &l.wmsg[0] || len(msgs) != len(l.wmsg) {
					t.Fatalf("flattened %d records, want the write as it is", len(msgs))
				}
				return
			}
			if len(msgs) != c.wantRecs || vecs != c.wantRecs {
				t.Fatalf("%d messages of %d vectors, want %d of one each", len(msgs), vecs, c.wantRecs)
			}
			whole, _ := bytesOf(l.wmsg[:c.wantRecs])
			if !bytes.Equal(got, whole) || !bytes.Equal(got, want[:len(got)]) {
				t.Fatal("the flattened records do not hold the records' bytes in order")
			}
		})
	}
}

// TestWritevSmallVectors: a stream of records of small vectors, written
// with Writev and resumed after every short write as the transmit path
// does, reaches the peer intact, while the peer reads slowly enough for
// the socket to take only part of many writes; and a flattened Writev
// allocates nothing.
func TestWritevSmallVectors(t *testing.T) {
	a, b := tcpPair(t)
	l := NewLink(a).(*fdLink)
	bufs, records, want := smallVecWrite(4<<20, 60<<10, 2)
	got := make(chan []byte, 1)
	go func() {
		out := make([]byte, 0, len(want))
		p := make([]byte, 7000)
		b.SetReadDeadline(time.Now().Add(30 * time.Second))
		for len(out) < len(want) {
			n, err := b.Read(p)
			out = append(out, p[:n]...)
			if err != nil {
				break
			}
			if len(out)%5 == 0 {
				time.Sleep(50 * time.Microsecond)
			}
		}
		got <- out
	}()
	short := 0
	for len(bufs) > 0 {
		n, err := l.Writev(bufs, records, true)
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, b := range bufs {
			total += len(b)
		}
		if n < total {
			short++
		}
		bufs, records = resumeWrite(bufs, records, n)
	}
	if out := <-got; !bytes.Equal(out, want) {
		t.Fatalf("the peer read %d bytes, not the %d written in order", len(out), len(want))
	}
	if short == 0 {
		t.Fatal("no write was short: the resumption was not tried")
	}
	t.Logf("%d short writes", short)

	// Steady state: the flat buffer and the vectors come from free lists.
	one, recs1, _ := smallVecWrite(32<<10, 16<<10, 3)
	go io.Copy(io.Discard, b)
	if avg := testing.AllocsPerRun(100, func() {
		if _, err := l.Writev(one, recs1, true); err != nil {
			t.Fatal(err)
		}
	}); avg != 0 {
		t.Fatalf("a flattened Writev allocated %v times", avg)
	}
}

// TestFlatWriteWaitsWithoutBuffer: a blocking Writev of small vectors
// that waits for room (the peer reads nothing) holds no flat buffer while
// it waits: a transmit goroutine per slow peer would otherwise keep 128
// KiB each.
func TestFlatWriteWaitsWithoutBuffer(t *testing.T) {
	a, b := tcpPair(t)
	l := NewLink(a).(*fdLink)
	bufs, records, want := smallVecWrite(16<<20, 60<<10, 4)
	done := make(chan error, 1)
	go func() {
		for len(bufs) > 0 {
			n, err := l.Writev(bufs, records, true)
			if err != nil {
				done <- err
				return
			}
			bufs, records = resumeWrite(bufs, records, n)
		}
		done <- nil
	}()
	// The socket's buffers fill within milliseconds; the writer then waits.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var outq int
		rc, _ := a.(*net.TCPConn).SyscallConn()
		rc.Control(func(fd uintptr) { outq, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
		if outq > 0 {
			time.Sleep(50 * time.Millisecond)
			rc.Control(func(fd uintptr) { outq2, _ := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ); outq -= outq2 })
			if outq == 0 {
				break // nothing moved in 50 ms: the writer waits
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the socket never filled")
		}
		time.Sleep(time.Millisecond)
	}
	flatFree.mu.Lock()
	out := flatFree.out
	flatFree.mu.Unlock()
	if out != 0 {
		t.Errorf("a waiting write holds %d flat buffers", out)
	}
	got := make([]byte, len(want))
	b.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the peer read other bytes than were written")
	}
}

// TestWritevOneRecord: a write of one record, in one vector or in
// several of at most tinyMax bytes in all (sent from one buffer with
// sendto), or more (sendmsg), arrives whole and in order, with nothing
// allocated.
func TestWritevOneRecord(t *testing.T) {
	a, b := tcpPair(t)
	l := NewLink(a).(*fdLink)
	var want []byte
	var r uint64 = 7
	for size := 1; size <= tinyMax+40; size += 3 {
		for nv := 1; nv <= 4; nv++ {
			bufs := make([][]byte, nv)
			left := size
			for i := range bufs {
				k := left / (nv - i)
				left -= k
				bufs[i] = make([]byte, k)
				for j := range bufs[i] {
					r = r*6364136223846793005 + 1442695040888963407
					bufs[i][j] = byte(r >> 40)
				}
				want = append(want, bufs[i]...)
			}
			var records []int
			if nv%2 == 0 {
				records = []int{nv} // the record's end given, or not
			}
			for len(bufs) > 0 {
				n, err := l.Writev(bufs, records, true)
				if err != nil {
					t.Fatal(err)
				}
				bufs, records = resumeWrite(bufs, records, n)
			}
		}
	}
	got := make([]byte, len(want))
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes read are not those written")
	}
	go io.Copy(io.Discard, b)
	three := [][]byte{make([]byte, 16), make([]byte, 8), make([]byte, 6)}
	one := [][]byte{make([]byte, 1000)}
	if avg := testing.AllocsPerRun(100, func() {
		if _, err := l.Writev(three, nil, true); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Writev(one, nil, true); err != nil {
			t.Fatal(err)
		}
	}); avg != 0 {
		t.Fatalf("%v allocations per write", avg)
	}
}
