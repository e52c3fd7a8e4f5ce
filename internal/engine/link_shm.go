//go:build linux

package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/gowarp/gowarp/internal/cm"
	"github.com/gowarp/gowarp/internal/mem"
	"golang.org/x/sys/unix"
)

// shmLink is the Link between two gowarp peers on one host: a byte ring
// per direction in a file both have mapped (negotiated by cm, shm.go),
// each with one writer and one reader, so the stream costs one copy in
// and one copy out and no system call while both sides are busy. The
// protocol above it is the same as over TCP: the receive core asks for
// bytes where it wants them (the target region for payload) and Readv
// copies them there out of the ring; Writev copies the transmit path's
// vectors (headers, payload straight from registered memory) in.
//
// The TCP connection stays open beside it. It is the liveness channel: a
// peer that closes or dies (the kernel closes its socket) gives FIN or
// RST, which a reader waiting on it sees. And it is the reader's
// doorbell: a reader that found its ring empty for shmSpin sets its
// waiting word and blocks in the socket's read (the netpoller: no thread,
// no CPU); a writer that publishes bytes and finds the word set clears
// it and sends one byte. So the engine's own doorbell, a read deadline
// set in the past (QP.ring), and Close stop a waiting reader as they
// stop a TCP read; Conn returns the connection wrapped so that a
// deadline also reaches a reader still spinning. A writer that finds its
// ring full (the peer's reader is behind) spins, even one that may not
// block (a post's, see Writev), then sleeps on a futex
// on the ring's tail, which the reader wakes when it frees space and
// sees the writer's word set; Close and a deadline wake it too.
type shmLink struct {
	c    net.Conn
	conn shmConn
	m    *cm.SharedMemory
	tx   shmRing // written here
	rx   shmRing // read here
	// refs counts the calls inside (Readv, Writev, Unacked, Close), with
	// shmClosed set from Close on: the last one out unmaps.
	refs atomic.Int64
	// rdl and wdl are the connection's read and write deadlines, in Unix
	// nanoseconds (0: none), for the calls that spin.
	rdl, wdl atomic.Int64
	// rxErr is what ended the connection (EOF, a reset), seen by the
	// reader: it reports it once the ring is empty.
	rxErr error
	// full bounds how long the ring may stay full with the peer reading
	// nothing (the link timeout): a peer that stopped fails the QP as a
	// TCP window closed that long does.
	full time.Duration
	// rspin is how long the reader spins now: halved after each wait
	// that had to sleep, doubled after each that did not, within
	// [spinMin, spinMax] (see Readv); wspin is how long a writer spins on
	// a full ring before it sleeps. The bounds are shmSpinMin and shmSpin
	// but for tests that make every wait sleep.
	rspin, spinMin, spinMax, wspin time.Duration
	// rwaiter and wwaiter are the reader's and the writer's spinning state
	// (see shmWaiter.spin).
	rwaiter, wwaiter shmWaiter
	// rsleeps and wsleeps count the times the reader and the writer set
	// their waiting word to sleep (each side's own; for tests).
	rsleeps, wsleeps int
	bell             [1]byte
	sink             [64]byte
	ts               unix.Timespec

	// The writer's side of the records (see shmRecord): lhead is the
	// stream bytes ever written (Unacked reads it), told the segments
	// of memory the peer was told of, and frees the count of shared
	// regions freed when it last looked for dead ones among them.
	lhead atomic.Uint64
	told  map[uint32]*mem.Shared
	dups  []shmDup // the memfds the reader has still to open
	frees uint64
	rec   [shmRecMax]byte // the writer's record being made
	// byRef is whether the peer can map this side's memory (see
	// shmProbe), refsSet whether its reader has said: until it has, and
	// if it cannot, every byte goes inline.
	byRef   bool
	refsSet bool
	// The reader's: the record being read (rleft of its stream bytes
	// left; rsrc holds them if it is a reference, nil if inline) and
	// the peer's segments mapped here.
	rleft int
	// rt and rlt are the reader's ring tail and stream bytes read, given
	// to the writer (the ring's tail and ltail) as rtPub and rltPub now
	// and then (see take).
	rt, rtPub, rlt, rltPub uint64
	rsrc                   []byte
	segs                   map[uint32][]byte
	probed                 bool            // the peer's probe was tried
	rrec                   [shmRecMax]byte // the record being parsed
}

// The ring carries records, each a header of 8 bytes (kind, three zero
// bytes, a 32-bit length, little-endian as the host: both ends are on
// it) and a body:
//
//	shmInline  len stream bytes follow in the ring
//	shmRef     16 bytes: segment (32 bits), zero (32), offset (64): the
//	           len stream bytes are there in the writer's shared segment
//	shmSeg     32 bytes: segment, PID, FD (32 bits each), zero (32),
//	           inode, size (64 each): a segment of the writer's, which the
//	           reader maps from /proc/PID/fd/FD (len 0)
//	shmForget  8 bytes: segment, zero (32): the segment is gone (len 0)
//
// So memory from Alloc (mem.RegisterShared) crosses by reference: one
// copy, by the reader, from its mapping of the writer's memory straight
// to the place the receive core asks for.
const (
	shmInline = 1 + iota
	shmRef
	shmSeg
	shmForget

	shmHdr    = 8
	shmRefLen = shmHdr + 16
	shmSegLen = shmHdr + 32
	shmFgtLen = shmHdr + 8
	shmRecMax = shmSegLen
	// shmRefMin is the least a vector must hold to go by reference: below
	// it the record and the reader's lookup cost more than the copy.
	shmRefMin = 4 << 10
	// shmMaxSegs bounds the segments a peer may have mapped here.
	shmMaxSegs = 4096
)

// shmRecLen is each kind's record length, 0 for no kind.
var shmRecLen = [...]int{shmInline: shmHdr, shmRef: shmRefLen, shmSeg: shmSegLen, shmForget: shmFgtLen}

// shmDup is a duplicate of a segment's memfd, named in a record that
// ends at ring position end.
type shmDup struct {
	fd  int
	end uint64
}

// errShmRecord is a record in the ring that no gowarp writer makes.
var errShmRecord = errors.New("gowarp: malformed shared-memory ring record")

// shmRing is one direction's ring: its counters in the shared file's
// page for it, each on cache lines of its own, and its bytes.
type shmRing struct {
	head *atomic.Uint64 // bytes ever written; the writer's line
	tail *atomic.Uint64 // bytes ever read; the reader's line
	// ltail is the stream bytes ever read (the ring's bytes are records
	// of them): what the writer's Unacked and its window look at.
	ltail *atomic.Uint64
	// probe is the writer's probe (see shmProbe): PID, FD (32 bits
	// each) and inode at probe[1:], made valid by probe[0] = 1 last;
	// verdict is the reader's answer, shmRefsOK or shmRefsNo.
	probe   *[4]atomic.Uint64
	verdict *atomic.Uint32
	rwait   *atomic.Uint32 // the reader sleeps on the connection
	wwait   *atomic.Uint32 // the writer sleeps on tail's futex
	data    []byte
	mask    uint64
	race    unsafe.Pointer // the race detector's stand-in for the head (link_shm_race.go)
}

const (
	shmClosed = 1 << 62
	// shmSpin is how long a reader or a blocked writer polls its ring
	// before it sleeps: longer than the peer's turnaround in a ping-pong
	// on a busy host, short enough to cost little CPU. Between two
	// processes at load 12 on 2 cores, 8-byte write_lat's median was
	// 1.3 µs with 100 µs (30 and 54 µs with 30 µs of spinning: the
	// peer's answer often came after the sleep), and write_bw was no
	// better with 300 µs.
	shmSpin = 100 * time.Microsecond
	// shmSpinMin is the least a reader spins: on a host so busy that the
	// peer's answer rarely comes within shmSpin, spinning only takes the
	// CPU from it (before spinning yielded, 8 B write_lat at load 20 had
	// a median of 66 µs spinning 100 µs every time, against TCP's 24), so
	// a reader whose waits keep ending asleep soon sleeps at once, paying
	// what a TCP reader pays.
	shmSpinMin = 2 * time.Microsecond
	// shmYieldSlow, shmSlowPair, shmNoYield and shmSpinNoYield: two
	// sched_yields less than shmSlowPair apart that each took longer than
	// shmYieldSlow stop the waits' yields for shmNoYield, and a wait then
	// spins at most shmSpinNoYield before it sleeps (see shmWaiter.spin).
	// A yield to a peer sharing the CPU takes what the peer's turn takes:
	// in a 64 KiB write_bw at load 3, the writer's were mostly under
	// 250 µs and 4-10 a second over a millisecond (so one alone proves
	// nothing); one behind busy threads of equal priority takes
	// milliseconds every time, and two of those per shmNoYield cost a
	// few percent.
	shmYieldSlow   = time.Millisecond
	shmSlowPair    = 20 * time.Millisecond
	shmNoYield     = 200 * time.Millisecond
	shmSpinNoYield = 20 * time.Microsecond
	// shmStagedMax bounds a read into the staging buffer (one vector,
	// not the payload's place): the core parses a header from it and
	// asks for the payload's rest in place, copied once, rather than
	// through the staging buffer, copied twice.
	shmStagedMax = 2048
	// shmPublish is how many bytes a writer copies between two updates
	// of the head, so the reader starts on a large batch early.
	shmPublish = 64 << 10
	// shmFullPoll is the longest a blocked writer sleeps before it looks
	// at the clock for the link timeout.
	shmFullPoll = 50 * time.Millisecond

	futexWait = 0 // FUTEX_WAIT without FUTEX_PRIVATE_FLAG: across processes
	futexWake = 1
)

func newShmRing(ctrl, data []byte) shmRing {
	p := unsafe.Pointer(&ctrl[0])
	return shmRing{
		head:    (*atomic.Uint64)(p),
		tail:    (*atomic.Uint64)(unsafe.Add(p, 128)),
		ltail:   (*atomic.Uint64)(unsafe.Add(p, 512)),
		probe:   (*[4]atomic.Uint64)(unsafe.Add(p, 640)),
		verdict: (*atomic.Uint32)(unsafe.Add(p, 768)),
		rwait:   (*atomic.Uint32)(unsafe.Add(p, 256)),
		wwait:   (*atomic.Uint32)(unsafe.Add(p, 384)),
		data:    data,
		mask:    uint64(len(data) - 1),
	}
}

// newShmLink returns the link over m, with c as its liveness channel and
// doorbell; full is the link timeout (negative: none).
func newShmLink(c net.Conn, m *cm.SharedMemory, full time.Duration) Link {
	l := &shmLink{c: c, m: m, full: full, rspin: shmSpin, spinMin: shmSpinMin, spinMax: shmSpin, wspin: shmSpin,
		rwaiter: newShmWaiter(), wwaiter: newShmWaiter(), told: map[uint32]*mem.Shared{}, segs: map[uint32][]byte{}}
	l.conn = shmConn{Conn: c, l: l}
	in, out := newShmRing(m.Ctrl(0), m.Data(0)), newShmRing(m.Ctrl(1), m.Data(1))
	in.race, out.race = shmRaceAddr(m.ID(), 0), shmRaceAddr(m.ID(), 1)
	l.tx, l.rx = in, out
	if !m.Initiator {
		l.tx, l.rx = out, in
	}
	if p, err := shmProbe(); err == nil {
		l.tx.probe[1].Store(uint64(p.PID) | uint64(p.FD)<<32)
		l.tx.probe[2].Store(p.Ino)
		l.tx.probe[3].Store(uint64(p.Size))
		l.tx.probe[0].Store(1)
	}
	return l
}

// enter takes a reference for a call, false once closed.
func (l *shmLink) enter() bool {
	for {
		s := l.refs.Load()
		if s&shmClosed != 0 {
			return false
		}
		if l.refs.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

// exit drops a call's reference; the last after Close unmaps the file.
func (l *shmLink) exit() {
	if l.refs.Add(-1) == shmClosed {
		l.m.Unmap()
		for _, m := range l.segs {
			unix.Munmap(m)
		}
		l.segs = nil
		for _, d := range l.dups {
			unix.Close(d.fd)
		}
		l.dups = nil
	}
}

// past reports whether deadline dl (Unix nanoseconds, 0 for none) has
// passed.
func past(dl int64) bool { return dl != 0 && time.Now().UnixNano() >= dl }

// empty reports whether bufs hold no byte: a call with nothing to move
// returns at once, as fdLink's does.
func empty(bufs [][]byte) bool {
	for _, b := range bufs {
		if len(b) > 0 {
			return false
		}
	}
	return true
}

func (l *shmLink) Readv(bufs [][]byte) (int, error) {
	if empty(bufs) {
		return 0, nil
	}
	if !l.enter() {
		return 0, net.ErrClosed
	}
	defer l.exit()
	r := &l.rx
	limit := -1
	if len(bufs) == 1 {
		limit = shmStagedMax
	}
	var spinStart time.Time
	slept := false
	for i := 0; ; i++ {
		if past(l.rdl.Load()) {
			return 0, os.ErrDeadlineExceeded
		}
		if l.ready() {
			shmAcquire(r.race)
			n, err := l.take(bufs, limit)
			if err != nil {
				return 0, err
			}
			if r.wwait.Load() != 0 && r.wwait.CompareAndSwap(1, 0) {
				l.tell()
				futex(r.ltail, futexWake, 1<<30, nil)
			}
			if n > 0 {
				if i > 0 {
					l.adapt(slept)
				}
				return n, nil
			}
			continue // only segment records: look again
		}
		if l.rxErr != nil {
			return 0, l.rxErr
		}
		if l.refs.Load()&shmClosed != 0 {
			return 0, net.ErrClosed
		}
		if i == 0 {
			spinStart = time.Now()
		}
		if l.rspin > 0 && (i&15 != 15 || l.rwaiter.spin(spinStart, l.rspin)) {
			continue
		}
		slept = true
		if testHookShmSleep != nil {
			testHookShmSleep()
		}
		// Sleep on the connection until the writer rings (a byte), the
		// peer goes (EOF, a reset), a deadline passes or Close.
		l.rsleeps++
		if l.announceRead() {
			r.rwait.Store(0)
			continue
		}
		_, err := l.c.Read(l.sink[:])
		r.rwait.Store(0)
		i = -1
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) {
				// The doorbell (a completion from this side's transmit
				// path, say) found the reader asleep: the spin caught
				// nothing, and counts so. A waiter for local completions
				// only (write_bw's) otherwise spun shmSpin in every wait.
				l.adapt(true)
				return 0, err
			}
			// The peer's bytes written before it went are read first.
			l.rxErr = err
		}
	}
}

// testHookShmSleep, when set by a test before links start, runs in a
// reader and a writer about to sleep, before they set their waiting
// word: it widens the window in which the peer moves the ring.
var testHookShmSleep func()

// shmWaiter is what a reader or a writer keeps between its waits: its
// look at the goroutines of its process waiting for a processor, and
// until when it spins without sched_yield.
type shmWaiter struct {
	run     shmRunnable
	noYield time.Time // no sched_yield before then
	slow    time.Time // when the last slow yield ended
}

func newShmWaiter() shmWaiter { return shmWaiter{run: newShmRunnable()} }

// spin is a spinning wait's step every 16 looks at the ring: it reports
// whether the wait, started at start, goes on spinning (false once it has
// spun budget: it sleeps), and gives the processor away meanwhile.
//
// sched_yield hands the processor to the other threads of the host, the
// peer's among them: on a host with more runnable threads than processors
// the peer often waits for the very processor the spinner holds (at load
// 19 on 2 cores, 8-byte write_lat's median was 14-16 µs with it and
// 120-150 µs in most runs without, spinning 100 µs; pinned to one CPU,
// 2.5 µs with it against 41 µs spinning 20 µs without). But a yield puts
// the caller behind every runnable thread of its CPU, and busy threads of
// equal priority each keep the CPU for a slice: with six busy loops on
// the 2 cores, every yield took milliseconds, 8-byte write_lat's median
// was 3-4 ms and 64 KiB-1 MiB write_bw 0.4-1 GB/s, no better than TCP's.
// So two yields less than shmSlowPair apart that each took longer than
// shmYieldSlow turn yielding off for shmNoYield: a wait then spins at most
// shmSpinNoYield and sleeps, and a sleeper's wake-up gets the CPU ahead of
// the busy threads (with the six busy loops: 0.4 µs in most runs, 1.3-2.8
// GB/s; see docs/shm.md).
//
// runtime.Gosched is called only when a goroutine of this process waits
// for a processor (the peer's, in one process): with a processor idle
// (two processes, each with a goroutine spinning) it put the spinner on
// the global queue and woke an idle thread to take it, two futex calls
// and a thread switch per call, and the spinner was often in that
// hand-off when its peer's bytes came. Between two processes at load
// 8-9, 8-byte write_lat's median was 6.6-8.6 µs gated so, against 7.6-22
// µs calling it every time (TCP's 13.4-18.9 in the same rounds).
func (s *shmWaiter) spin(start time.Time, budget time.Duration) bool {
	now := time.Now()
	yieldOK := !now.Before(s.noYield)
	if !yieldOK {
		budget = min(budget, shmSpinNoYield)
	}
	if now.Sub(start) >= budget {
		return false
	}
	if yieldOK {
		shmSchedYield()
		if d := time.Since(now); d > shmYieldSlow {
			end := now.Add(d)
			if end.Sub(s.slow) < shmSlowPair {
				s.noYield = end.Add(shmNoYield)
			}
			s.slow = end
		}
	}
	metrics.Read(s.run[:])
	if s.run[0].Value.Uint64() > 0 {
		runtime.Gosched()
	}
	return true
}

// shmSchedYield is sched_yield(2); tests make it slow.
var shmSchedYield = func() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// shmRunnable reads the count of this process's goroutines that wait for
// a processor (about 200 ns, nothing allocated; the scheduler's lock is
// taken for it).
type shmRunnable [1]metrics.Sample

func newShmRunnable() shmRunnable {
	return shmRunnable{{Name: "/sched/goroutines/runnable:goroutines"}}
}

// adapt sets how long the next wait spins after one that slept or not.
func (l *shmLink) adapt(slept bool) {
	if slept {
		l.rspin = max(l.rspin/2, l.spinMin)
	} else {
		l.rspin = min(l.rspin*2, l.spinMax)
	}
}

// take reads records from the ring into bufs, at most limit stream
// bytes if limit > 0, and returns the stream bytes it copied: inline
// bytes out of the ring, referenced ones out of the writer's segment.
func (l *shmLink) take(bufs [][]byte, limit int) (int, error) {
	r := &l.rx
	if !l.probed && r.probe[0].Load() == 1 {
		l.answerProbe()
	}
	h, t := r.head.Load(), l.rt
	want := 0
	for _, b := range bufs {
		want += len(b)
	}
	if limit > 0 {
		want = min(want, limit)
	}
	var sc scatter
	sc.bufs = bufs
	done := 0
	for done < want {
		if l.rleft == 0 {
			if h-t < shmHdr {
				if h != t {
					return 0, errShmRecord // a writer publishes whole headers
				}
				break
			}
			hdr := l.rrec[:shmHdr]
			r.get(t, hdr)
			kind, n := hdr[0], int(binary.LittleEndian.Uint32(hdr[4:]))
			if kind == shmRef && limit > 0 && done > 0 {
				// A staging read has its header: the payload that follows
				// is asked for in place, copied once rather than twice.
				break
			}
			if hdr[1]|hdr[2]|hdr[3] != 0 {
				return 0, errShmRecord
			}
			size := 0
			if int(kind) < len(shmRecLen) {
				size = shmRecLen[kind]
			}
			if size == 0 || (n == 0) != (kind == shmSeg || kind == shmForget) {
				return 0, errShmRecord
			}
			if h-t < uint64(size) {
				return 0, errShmRecord // a writer publishes whole records
			}
			body := l.rrec[shmHdr:size]
			r.get(t+shmHdr, body)
			t += uint64(size)
			switch kind {
			case shmInline:
				l.rleft, l.rsrc = n, nil
			case shmRef:
				id, off := binary.LittleEndian.Uint32(body), binary.LittleEndian.Uint64(body[8:])
				m, ok := l.segs[id]
				if !ok || binary.LittleEndian.Uint32(body[4:]) != 0 || off > uint64(len(m)) || uint64(n) > uint64(len(m))-off {
					return 0, errShmRecord
				}
				l.rleft, l.rsrc = n, m[off:off+uint64(n)]
			case shmSeg:
				if err := l.mapSeg(body); err != nil {
					return 0, err
				}
			case shmForget:
				id := binary.LittleEndian.Uint32(body)
				if m, ok := l.segs[id]; ok {
					unix.Munmap(m)
					delete(l.segs, id)
				}
			}
			continue
		}
		k := min(l.rleft, want-done)
		if l.rsrc != nil {
			k = sc.put(l.rsrc[:k])
			l.rsrc = l.rsrc[k:]
		} else {
			k = min(k, int(h-t))
			if k == 0 {
				break
			}
			off := t & r.mask
			c := sc.put(r.data[off:min(off+uint64(k), uint64(len(r.data)))])
			if c < k {
				c += sc.put(r.data[:k-c])
			}
			t += uint64(c)
		}
		l.rleft -= k
		done += k
	}
	l.rt = t
	l.rlt += uint64(done)
	// The counters go to the writer when the ring is empty (the reader is
	// about to wait) or has moved far: each store to a line the writer
	// reads waits for the line to come back from the writer's core, and
	// one per record, four per FPDU, cost 1 MiB write_bw a fifth.
	if !l.ready() || t-l.rtPub >= uint64(len(r.data))/4 || l.rlt-l.rltPub >= shmWindow(uint64(len(r.data)))/8 {
		l.tell()
	}
	return done, nil
}

// tell gives the writer the reader's counters.
func (l *shmLink) tell() {
	r := &l.rx
	if l.rt != l.rtPub {
		r.tail.Swap(l.rt) // see shmRing.publishHead
		l.rtPub = l.rt
	}
	if l.rlt != l.rltPub {
		r.ltail.Swap(l.rlt)
		l.rltPub = l.rlt
	}
}

// ready reports whether the reader has stream bytes to take: records in
// the ring, or a reference's bytes left.
func (l *shmLink) ready() bool {
	return l.rx.head.Load() != l.rt || len(l.rsrc) > 0
}

// scatter copies into bufs in order.
type scatter struct {
	bufs [][]byte
	i    int // the buffer being filled
	off  int // bytes of it filled
}

// put copies b into the buffers and returns how much of it fit.
func (s *scatter) put(b []byte) int {
	n := 0
	for n < len(b) && s.i < len(s.bufs) {
		k := bigCopy(s.bufs[s.i][s.off:], b[n:])
		n += k
		s.off += k
		if s.off == len(s.bufs[s.i]) {
			s.i, s.off = s.i+1, 0
		}
	}
	return n
}

// get copies the ring's bytes at p into b.
func (r *shmRing) get(p uint64, b []byte) {
	off := p & r.mask
	n := copy(b, r.data[off:])
	copy(b[n:], r.data)
}

// set copies b into the ring at p. b is often registered memory, a
// Write's or a Read Response's payload: the copy is wireCopy, out of the
// race detector's sight in race builds, as the kernel's copy in sendmsg
// is on a TCP link and a NIC's reads would be (see link_race.go).
func (r *shmRing) set(p uint64, b []byte) {
	off := p & r.mask
	n := wireCopy(r.data[off:], b)
	wireCopy(r.data, b[n:])
}

// mapSeg maps the writer's segment a shmSeg record's body names, read
// only, after checking that it is the memfd the writer registered
// (inode, size) and that it cannot shrink (so no access faults).
func (l *shmLink) mapSeg(body []byte) error {
	id := binary.LittleEndian.Uint32(body)
	pid, fd := binary.LittleEndian.Uint32(body[4:]), binary.LittleEndian.Uint32(body[8:])
	ino, size := binary.LittleEndian.Uint64(body[16:]), binary.LittleEndian.Uint64(body[24:])
	if _, ok := l.segs[id]; ok || binary.LittleEndian.Uint32(body[12:]) != 0 || size == 0 || size > 1<<40 {
		return errShmRecord
	}
	if len(l.segs) >= shmMaxSegs {
		return fmt.Errorf("%w: more than %d segments", errShmRecord, shmMaxSegs)
	}
	m, err := mapPeerSeg(int(pid), int(fd), ino, int(size))
	if err != nil {
		return err
	}
	l.segs[id] = m
	return nil
}

// mapPeerSeg maps a peer's shared segment of size bytes, read only.
func mapPeerSeg(pid, fd int, ino uint64, size int) ([]byte, error) {
	f, path, err := openPeer(pid, fd, ino, size)
	if err != nil {
		return nil, err
	}
	defer unix.Close(f)
	m, err := unix.Mmap(f, 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("gowarp: shared memory: mapping the peer's memory %s: %w", path, err)
	}
	return m, nil
}

// openPeer opens a peer's memfd, read only, after checking that it is
// the sealed memory of size bytes and inode ino the peer named.
func openPeer(pid, fd int, ino uint64, size int) (int, string, error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	f, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, path, fmt.Errorf("gowarp: shared memory: the peer's memory %s: %w (the peers must run as the same user, in one PID namespace)", path, err)
	}
	var st unix.Stat_t
	err = unix.Fstat(f, &st)
	seals, serr := unix.FcntlInt(uintptr(f), unix.F_GET_SEALS, 0)
	if err != nil || serr != nil || st.Ino != ino || st.Size != int64(size) || seals&unix.F_SEAL_SHRINK == 0 {
		unix.Close(f)
		return -1, path, fmt.Errorf("gowarp: shared memory: %s is not the peer's sealed memory of %d bytes", path, size)
	}
	return f, path, nil
}

// Verdicts of a reader on its writer's probe.
const (
	shmRefsOK = 1
	shmRefsNo = 2
)

// answerProbe tries the writer's probe once: whether this side can open
// the writer's memory as it would a segment's (same user, same PID
// namespace). The writer sends by reference only after a yes, so peers
// that cannot (containers sharing /dev/shm but not PIDs) keep to inline
// bytes instead of failing the link at the first reference.
func (l *shmLink) answerProbe() {
	l.probed = true
	p := l.rx.probe
	pf := p[1].Load()
	f, _, err := openPeer(int(uint32(pf)), int(pf>>32), p[2].Load(), int(p[3].Load()))
	if err != nil {
		l.rx.verdict.Store(shmRefsNo)
		return
	}
	unix.Close(f)
	l.rx.verdict.Store(shmRefsOK)
}

// refsOK reports whether the peer's reader can map this side's memory,
// false until it said.
func (l *shmLink) refsOK() bool {
	if !l.refsSet {
		switch l.tx.verdict.Load() {
		case shmRefsOK:
			l.byRef, l.refsSet = true, true
		case shmRefsNo:
			l.refsSet = true
		}
	}
	return l.byRef
}

// shmProbe is the process's probe: a small sealed memfd, open for the
// process's life, that a peer's reader opens as it would a segment.
var shmProbe = sync.OnceValues(func() (*mem.Shared, error) {
	r, err := mem.NewTable().RegisterShared(0, 4096, 0, mem.Options{})
	if err != nil {
		return nil, err
	}
	s, _ := mem.FindShared(r.Bytes())
	return s, nil
})

// put writes bufs to the ring as records, as far as the ring and the
// window (see shmWindow) have room, and returns the stream bytes written
// and the reader's counters it saw (the ring's tail and ltail), for a
// writer that found no room to wait on.
func (l *shmLink) put(bufs [][]byte) (n int, tl, lt uint64) {
	r := &l.tx
	size := uint64(len(r.data))
	h := r.head.Load() // only this side moves it
	tl, lt = r.tail.Load(), r.ltail.Load()
	free := int(size - (h - tl))
	lh := l.lhead.Load()
	win := int(shmWindow(size) - (lh - lt))
	for len(l.dups) > 0 && l.dups[0].end <= tl {
		unix.Close(l.dups[0].fd) // the reader has mapped the segment
		l.dups = l.dups[1:]
	}
	if f := mem.SharedFrees(); f != l.frees {
		// Tell the peer of the segments gone, first: their ids are
		// never reused, so an old forget is harmless.
		for id, sg := range l.told {
			if sg.Dead() && free >= shmFgtLen {
				rec := l.record(shmForget, 0)
				binary.LittleEndian.PutUint32(rec[8:], id)
				r.set(h, rec)
				h += shmFgtLen
				free -= shmFgtLen
				delete(l.told, id)
			}
		}
		if len(l.told) == 0 || !l.anyDead() {
			l.frees = f
		}
	}
	done, published := 0, 0
	// next is the segment of bufs[i] when the scan of an inline run found
	// it (nextAt: i), so that it is not looked up twice.
	var next *mem.Shared
	nextAt, nextOff := -1, 0
	for i := 0; i < len(bufs) && win > done; {
		b := bufs[i]
		if len(b) == 0 {
			i++
			continue
		}
		var sg *mem.Shared
		var off int
		if nextAt == i {
			sg, off = next, nextOff
		} else if len(b) >= shmRefMin && l.refsOK() {
			sg, off = mem.FindShared(b)
		}
		if sg != nil && l.told[sg.ID] == nil {
			if free < shmSegLen+shmRefLen {
				break
			}
			// The reader opens a duplicate of the memfd, kept open until
			// it has read the record: the region may be deregistered
			// (its memfd closed) before the reader comes to it.
			dup, err := unix.FcntlInt(uintptr(sg.FD), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				sg = nil // out of descriptors: the bytes go inline
			} else {
				rec := l.record(shmSeg, 0)
				binary.LittleEndian.PutUint32(rec[8:], sg.ID)
				binary.LittleEndian.PutUint32(rec[12:], uint32(sg.PID))
				binary.LittleEndian.PutUint32(rec[16:], uint32(dup))
				binary.LittleEndian.PutUint64(rec[24:], sg.Ino)
				binary.LittleEndian.PutUint64(rec[32:], uint64(sg.Size))
				r.set(h, rec)
				h += shmSegLen
				free -= shmSegLen
				l.told[sg.ID] = sg
				l.dups = append(l.dups, shmDup{dup, h})
			}
		}
		if sg != nil {
			if free < shmRefLen {
				break
			}
			k := min(len(b), win-done)
			rec := l.record(shmRef, k)
			binary.LittleEndian.PutUint32(rec[8:], sg.ID)
			binary.LittleEndian.PutUint64(rec[16:], uint64(off))
			r.set(h, rec)
			h += shmRefLen
			free -= shmRefLen
			done += k
			// Publish at once: the reader starts copying while the
			// next records are written.
			l.publish(h, lh+uint64(done))
			published = done
			if k < len(b) {
				break
			}
			i++
			continue
		}
		// An inline record of this vector and the next that do not go
		// by reference, as many bytes as fit.
		if free <= shmHdr {
			break
		}
		run := len(b)
		for j := i + 1; j < len(bufs); j++ {
			if v := bufs[j]; len(v) >= shmRefMin && l.byRef {
				if sg, off := mem.FindShared(v); sg != nil {
					next, nextAt, nextOff = sg, j, off
					break
				}
			}
			run += len(bufs[j])
		}
		k := min(run, free-shmHdr, win-done)
		r.set(h, l.record(shmInline, k))
		h += shmHdr
		free -= shmHdr + k
		for c := 0; c < k; {
			v := bufs[i][:min(len(bufs[i]), k-c)]
			r.set(h, v)
			h += uint64(len(v))
			c += len(v)
			done += len(v)
			if len(v) < len(bufs[i]) {
				break // the caller resumes past what was written
			}
			i++
			if done-published >= shmPublish {
				l.publish(h, lh+uint64(done))
				published = done
			}
		}
		if k < run {
			break
		}
	}
	if h != r.head.Load() {
		l.publish(h, lh+uint64(done))
	}
	return done, tl, lt
}

// anyDead reports whether a segment told to the peer is gone.
func (l *shmLink) anyDead() bool {
	for _, sg := range l.told {
		if sg.Dead() {
			return true
		}
	}
	return false
}

// record returns the writer's record buffer cut to kind's length,
// zeroed, with its header for n stream bytes.
func (l *shmLink) record(kind byte, n int) []byte {
	rec := l.rec[:shmRecLen[kind]]
	clear(rec)
	rec[0] = kind
	binary.LittleEndian.PutUint32(rec[4:], uint32(n))
	return rec
}

// publish moves the head to h, with lh stream bytes written, and rings a
// reader that sleeps.
func (l *shmLink) publish(h, lh uint64) {
	r := &l.tx
	l.lhead.Store(lh)
	shmRelease(r.race)
	if r.publishHead(h) {
		// Best effort: a peer that is gone shows on the read side.
		l.c.Write(l.bell[:])
	}
}

func (l *shmLink) Writev(bufs [][]byte, _ []int, block bool) (int, error) {
	if empty(bufs) {
		return 0, nil
	}
	if !l.enter() {
		return 0, net.ErrClosed
	}
	defer l.exit()
	r := &l.tx
	var spinStart, fullSince time.Time
	for i := 0; ; i++ {
		if past(l.wdl.Load()) {
			return 0, os.ErrDeadlineExceeded
		}
		n, t, lt := l.put(bufs)
		if n > 0 {
			return n, nil
		}
		if l.refs.Load()&shmClosed != 0 {
			return 0, net.ErrClosed
		}
		if i == 0 {
			spinStart = time.Now()
		}
		if l.wspin > 0 && (i&15 != 15 || l.wwaiter.spin(spinStart, l.wspin)) {
			continue
		}
		// A writer that may not block spins too, only not to sleep: a
		// full ring is a reader copying out, which frees room within
		// microseconds, and the posting goroutine that writes on keeps
		// the process's work on one thread. Handing the rest to the
		// transmit goroutine at once made two (the transmit goroutine
		// writing, the poster spinning in its CQ wait for the
		// completions), each hand-off and doorbell waking a thread:
		// 64 KiB write_bw's client made 3.4 K futex, 1.5 K read and
		// 8.7 K context switches a second, and 1.4 K, 0.6 K and 4.3 K
		// spinning here (see docs/shm.md).
		if !block {
			return 0, errWouldBlock
		}
		// Sleep until the reader frees space (it wakes the futex on the
		// tail when it sees wwait), Close or a deadline (which wake it
		// here), or shmFullPoll, to look at the link timeout.
		if fullSince.IsZero() {
			fullSince = time.Now()
		} else if l.full > 0 && time.Since(fullSince) > l.full {
			return 0, syscall.ETIMEDOUT
		}
		if testHookShmSleep != nil {
			testHookShmSleep()
		}
		r.wwait.Swap(1) // see shmRing.publishHead
		l.wsleeps++
		if r.tail.Load() == t && r.ltail.Load() == lt {
			l.ts = unix.NsecToTimespec(int64(shmFullPoll))
			futex(r.ltail, futexWait, uint32(lt), &l.ts)
		}
		r.wwait.Store(0)
		if r.tail.Load() != t || r.ltail.Load() != lt {
			fullSince = time.Time{}
		}
	}
}

// announceRead sets the reader's waiting word, then reports whether bytes
// came meanwhile (it need not sleep). With publishHead it is the
// handshake that loses no wake-up: see there.
func (l *shmLink) announceRead() bool {
	l.rx.rwait.Swap(1)
	return l.ready()
}

// publishHead moves the ring's head to h, then reports whether the reader
// was waiting, clearing its word: the writer rings it then.
//
// The reader stores its word and loads the head; the writer stores the
// head and loads the word. One of the two must see the other's store, so
// each store must be ordered before the load after it: a full fence, not
// only release order. Swap is one in every build (XCHG on amd64, as Store
// is too in a plain build); Store is not under the race detector, whose
// stores to memory outside Go's heap are plain release stores. With
// Store, TestShmHandshake found both loads stale in 6 to 27 of 100,000
// rounds under -race, and TestAdapterSharedMemoryLinkNoLostWakeup hung
// once in about 9,000 runs (and once in CI); with Swap, none.
func (r *shmRing) publishHead(h uint64) bool {
	r.head.Swap(h)
	return r.rwait.Load() != 0 && r.rwait.CompareAndSwap(1, 0)
}

// futex calls futex(2) on the low 32 bits of w (little-endian: the
// word at its address; on a big-endian machine the high ones, which
// change as rarely: a wait then ends at its timeout).
func futex(w *atomic.Uint64, op int, val uint32, ts *unix.Timespec) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), uintptr(op), uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
}

// Unacked returns the bytes written to the ring that the peer has not
// read yet: the acknowledgement of this link is the peer's read.
func (l *shmLink) Unacked() (int, error) {
	if !l.enter() {
		return 0, net.ErrClosed
	}
	defer l.exit()
	return int(l.lhead.Load() - l.tx.ltail.Load()), nil
}

// MSS is 0: there are no segments, and full FPDUs are 64 KiB (see
// txState.init) unless MaxFPDU says otherwise.
func (l *shmLink) MSS() int { return 0 }

// Close closes the connection (the peer's reader sees it) and wakes this
// side's calls; the last of them unmaps the file.
func (l *shmLink) Close() error {
	for {
		s := l.refs.Load()
		if s&shmClosed != 0 {
			return l.c.Close()
		}
		if l.refs.CompareAndSwap(s, (s+1)|shmClosed) {
			break
		}
	}
	err := l.c.Close()
	futex(l.tx.ltail, futexWake, 1<<30, nil)
	l.exit()
	return err
}

func (l *shmLink) Conn() net.Conn { return &l.conn }

// wakeWriter wakes this side's writer, if it sleeps, to look at its
// deadline.
func (l *shmLink) wakeWriter() {
	if l.enter() {
		futex(l.tx.ltail, futexWake, 1<<30, nil)
		l.exit()
	}
}

// shmConn is the connection under a shmLink: its deadlines reach the
// link's calls that spin or sleep on the ring as well as its reads.
type shmConn struct {
	net.Conn
	l *shmLink
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return max(t.UnixNano(), 1)
}

func (c *shmConn) SetDeadline(t time.Time) error {
	c.l.rdl.Store(unixNano(t))
	c.l.wdl.Store(unixNano(t))
	c.l.wakeWriter()
	return c.Conn.SetDeadline(t)
}

func (c *shmConn) SetReadDeadline(t time.Time) error {
	c.l.rdl.Store(unixNano(t))
	return c.Conn.SetReadDeadline(t)
}

func (c *shmConn) SetWriteDeadline(t time.Time) error {
	c.l.wdl.Store(unixNano(t))
	c.l.wakeWriter()
	return c.Conn.SetWriteDeadline(t)
}

// CloseWrite half-closes the connection (after a Terminate: see
// QP.closeAfterTerm); the peer's reader takes it as the end, after the
// ring's bytes.
func (c *shmConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// shmWindow is the most stream bytes a writer may have written that the
// reader has not taken, on a ring of size bytes.
func shmWindow(size uint64) uint64 { return max(size, shmWindowMin) }

// shmWindowMin: a ring's bytes bound the stream bytes in flight when they
// are inline; references take a few bytes of it each, and a window of
// only the ring's bytes (1 MiB by default) let one 1 MiB Write at a time
// be in flight: the writer waited for the reader's copy, the reader for
// the writer's next record.
const shmWindowMin = 8 << 20
