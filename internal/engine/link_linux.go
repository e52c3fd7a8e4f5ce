package engine

import (
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fdLink drives a TCP socket through its raw descriptor: scatter reads that
// land payload straight in registered memory, gathered non-blocking writes,
// and the kernel's send-queue counters. The callbacks handed to
// syscall.RawConn are built once, the read's iovec array grows to the most
// vectors a read has had (a few: see rxState), and a write takes its
// arrays from a free list for the system call (but for a few vectors, see
// writeVecsSmall), so no call allocates in steady state and an idle link
// holds no write arrays beyond 384 bytes.
type fdLink struct {
	c    net.Conn
	rc   syscall.RawConn
	race unsafe.Pointer // the race detector's stand-in for the stream (link_race.go)

	riov  []unix.Iovec
	rn    int
	rerr  error
	rfunc func(uintptr) bool
	// ReadIdle's buffer, the functions that give it back and take one,
	// and the callback that reads into it.
	ibuf  []byte
	iput  func([]byte)
	iget  func() []byte
	imore func(int) ([]byte, bool)
	itook bool // imore took the last read's bytes and said no more
	// inMore is 1 while imore runs, in the RawRead that read its bytes;
	// Close then only marks it 2 and the reader closes the connection
	// as it leaves (closeAfter): a Close waits for the reads in progress,
	// and the one in progress would be the caller's own when imore's
	// code (the core, or a ProgressFunc's function) closes.
	inMore     atomic.Int32
	closeAfter bool
	// The idle read is a recvmsg that asks (TCP_INQ, if inq) how many
	// bytes it left in the socket, a FIN counting as one: inqLeft, -1 if
	// unknown. wstart numbers the writes as they start, under the fd's
	// write lock, and wok is the number of the last the socket took (see
	// doReadIdle).
	inq     bool
	inqLeft int
	rmsg    unix.Msghdr
	rvec    unix.Iovec
	rcmsg   [24]byte // one cmsghdr and its int, aligned
	wstart  atomic.Uint64
	wok     atomic.Uint64
	// empties counts the idle reads that found the socket empty (tests).
	empties atomic.Int64
	ifunc   func(uintptr) bool
	// ReadIdle's busy poll (see setBusyPoll): how long it spins (0: not
	// at all), when this wait began to spin (zero: it has not found the
	// socket empty yet) and whether it went to the netpoller; bell is the
	// queue pair's doorbell.
	spinFor   time.Duration
	spinStart time.Time
	slept     bool
	bell      *atomic.Bool
	quiet     *atomic.Int32 // while not 0, no spinning
	spins     int
	// parked, wfd and unwatched are the link's state in parked (see
	// parkwatch_linux.go): its reader waits in the netpoller, the socket
	// it armed there (-1: none), and closed.
	parked    atomic.Bool
	wfd       int
	unwatched bool

	wiov    []unix.Iovec
	wmsg    []mmsghdr
	wsmall  *writeVecsSmall // arrays of a Writev of few vectors, made once
	wflat   bool            // the write's records are copied for the call (see flatten)
	wone    []byte          // the write's one contiguous record, sent with sendto (see Writev)
	wn      int
	werr    error
	wblock  bool
	wfunc   func(uintptr) bool
	outq    int
	outqErr error
	ofunc   func(uintptr)
	mss     int
	corked  bool // TCP_CORK is set (see Writev)
	corkOn  bool // what doCork sets
	cfunc   func(uintptr)
	mfunc   func(uintptr)
	// TCP_INFO as windowShort reads it, the write it asks about, and
	// its answer.
	ti      unix.TCPInfo
	tiN     int
	tiShort bool
	tiKnown bool
	tfunc   func(uintptr)
}

// NewLink returns the Link for c: the descriptor-level one for TCP on
// Linux, the portable one otherwise.
func NewLink(c net.Conn) Link {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return &streamLink{c: c}
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return &streamLink{c: c}
	}
	l := &fdLink{c: c, rc: rc, riov: make([]unix.Iovec, 0, minReadIov), race: linkRaceAddr(c), wfd: -1}
	l.rfunc, l.ifunc, l.wfunc, l.ofunc, l.mfunc, l.cfunc, l.tfunc = l.doRead, l.doReadIdle, l.doWrite, l.doOutq, l.doMSS, l.doCork, l.doInfo
	_ = rc.Control(l.mfunc)
	_ = rc.Control(func(fd uintptr) {
		l.inq = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_INQ, 1) == nil
	})
	l.rmsg.Iov, l.rmsg.Control = &l.rvec, &l.rcmsg[0]
	l.rmsg.SetIovlen(1)
	return l
}

func fillIov(iov []unix.Iovec, bufs [][]byte) []unix.Iovec {
	iov = iov[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if len(iov) == cap(iov) {
			break
		}
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	return iov
}

func (l *fdLink) doRead(fd uintptr) bool {
	n, _, e := unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&l.riov[0])), uintptr(len(l.riov)))
	if e == unix.EAGAIN {
		return false
	}
	if e == unix.EINTR {
		return false
	}
	l.rn, l.rerr = int(n), nil
	if e != 0 {
		l.rn, l.rerr = 0, e
	}
	return true
}

// minReadIov is the read iovec array's first size: a read into the
// staging buffer takes one vector, a payload's a few more.
const minReadIov = 4

func (l *fdLink) Readv(bufs [][]byte) (int, error) {
	if len(bufs) > cap(l.riov) && cap(l.riov) < maxIov {
		l.riov = make([]unix.Iovec, 0, min(len(bufs), maxIov))
	}
	l.riov = fillIov(l.riov, bufs)
	if len(l.riov) == 0 {
		return 0, nil
	}
	l.rn, l.rerr = 0, nil
	err := l.rc.Read(l.rfunc)
	clear(l.riov) // drop the references to the buffers
	linkAcquire(l.race)
	if err != nil {
		return 0, err
	}
	if l.rerr == nil && l.rn == 0 {
		return 0, io.EOF
	}
	return l.rn, l.rerr
}

// ReadIdle reads into buf; when the socket has nothing, it reads again
// for a while if asked to (see setBusyPoll), then gives buf back before it waits in the
// netpoller, and takes a buffer again when woken to read. With more, it
// hands what it reads on where it reads it, and after a read that
// emptied the socket waits without trying it again (see doReadIdle).
func (l *fdLink) ReadIdle(buf []byte, put func([]byte), get func() []byte, more func(int) ([]byte, bool)) (int, []byte, error) {
	l.ibuf, l.iput, l.iget, l.imore = buf, put, get, more
	l.rn, l.rerr = 0, nil
	l.spinStart, l.slept = time.Time{}, false
	err := l.rc.Read(l.ifunc)
	linkAcquire(l.race)
	b := l.ibuf
	l.ibuf, l.iput, l.iget, l.imore = nil, nil, nil, nil
	if l.closeAfter {
		l.closeAfter, l.itook = false, false
		l.inMore.Store(0)
		l.closeNow()
		return 0, b, net.ErrClosed
	}
	if err != nil {
		return 0, b, err
	}
	if l.itook {
		l.itook = false
		return 0, b, nil // imore took the bytes and said no more
	}
	if l.rerr == nil && l.rn == 0 {
		return 0, b, io.EOF
	}
	return l.rn, b, l.rerr
}

// Busy polling (ConnectOptions.BusyPoll, 0 by default: off): a reader
// that finds its socket empty reads it again, yielding its processor to
// the process's other goroutines between reads, for up to the busy poll
// (DefaultBusyPoll is what the cache asks for) before it waits in the
// netpoller, while the host has CPUs to spare (see cpus). Waiting there parks the goroutine
// and, with nothing else to run, its thread and the CPU: on a VM the
// peer's next bytes then wait for the CPU's wake-up (an interrupt to a
// halted virtual CPU) and the thread's, which at times took 1-4 ms
// (between two processes, 4 KiB ReadAt at 16 in flight had no op
// complete for more than 200 µs 1,542 times in 3 s, a quarter of the
// run; runtime traces of both sides showed both idle meanwhile, the
// requests written). A reader that keeps its CPU a moment longer takes
// bytes that come within the peer's turnaround at once, and a CPU kept
// busy wakes at once for the peer's thread. Spinning only while bytes
// came soon (halving the spin after each wait that slept, doubling it
// after each it caught, as the shared-memory link does) or yielding to
// the host's threads with sched_yield lost all of it: the waits between
// a ReadAt client's batches often outlast a spin, so it shrank to
// nothing, and a yield often handed the CPU to the peer's process for
// longer than a yield should take.
//
// setBusyPoll makes the link's idle reads spin so for up to d, stopping
// early when bell (the queue pair's doorbell) rings, and not at all while
// quiet is not 0: the queue pair awaits a large Read's response (see
// quietRead).
func (l *fdLink) setBusyPoll(d time.Duration, bell *atomic.Bool, quiet *atomic.Int32) {
	l.spinFor, l.bell, l.quiet = d, bell, quiet
}

// doReadIdle is ReadIdle's read. With imore it goes on, in the same
// netpoller read (RawRead), for as long as imore takes the bytes and
// asks for more; and after a read that emptied the socket, if the socket
// then took a write, it waits for the next bytes before trying it again.
//
// Trying the socket first would find it empty (EAGAIN): a system call,
// about 1.5 µs on this project's hosts and a sixth of a small message's
// one-way time, spent before the reader sleeps on every message of a
// ping-pong (and by Go's net.Conn on every Read). Waiting first is safe
// only if whatever comes next raises a new edge-triggered readiness
// event, which the netpoller keeps for the next wait if no one waits yet:
//   - The read emptied the socket: TCP_INQ says it left nothing, not even
//     a FIN. A read that takes a FIN with the last bytes returns short,
//     and the FIN's event came before it (an end of file would wait
//     forever: a client that vanished held a server's session so).
//   - A reset's event can come before the read too, and be taken by the
//     wake-up that the bytes before it caused; the read then returns the
//     bytes, leaving the error for the next read, and TCP_INQ says
//     nothing of it. A write begun after the read finds the error
//     instead (tcp_sendmsg fails on it, and the queue pair with it): so
//     the socket must have taken a write begun since the read (one begun
//     before may have passed that check before the reset came).
//   - It must be the same RawRead: a new one begins by clearing the
//     readiness kept (runtime_pollReset), so bytes that came between the
//     two would wait there unseen.
//
// A readiness left from bytes already read ends the wait at once, and
// the read then finds the socket empty as before. A busy-polling reader
// (spinFor) tries the socket first, as spinning is the point.
func (l *fdLink) doReadIdle(fd uintptr) bool {
	parked.woke(l)
	for {
		if !l.readIdleOnce(fd) {
			return false
		}
		if l.rerr != nil || l.rn == 0 || l.imore == nil {
			return true
		}
		n, drained := l.rn, l.inqLeft == 0
		linkAcquire(l.race) // imore places what came, as after a read
		w0 := l.wstart.Load()
		l.inMore.Store(1)
		buf, again := l.imore(n)
		l.rn, l.ibuf = 0, buf // taken by imore
		if !l.inMore.CompareAndSwap(1, 0) {
			l.closeAfter = true // closed meanwhile: close it once out of RawRead
			again = false
		}
		if !again {
			l.itook = true
			return true
		}
		l.spinStart, l.slept = time.Time{}, false
		if drained && l.spinFor == 0 && l.wok.Load() > w0 {
			// Wait without the buffer, as after an empty read.
			l.slept = true
			l.iput(l.ibuf)
			l.ibuf = nil
			return false
		}
	}
}

// readIdleOnce reads into the idle buffer once, taking one if it holds
// none, as a RawRead callback: false when the socket had nothing.
func (l *fdLink) readIdleOnce(fd uintptr) bool {
	if l.ibuf == nil {
		l.ibuf = l.iget()
	}
	n, e := l.readInq(fd)
	if e == unix.EAGAIN && !l.slept && l.spinFor > 0 && (l.quiet == nil || l.quiet.Load() == 0) {
		if l.spinStart.IsZero() {
			l.spinStart = time.Now()
		}
		for e == unix.EAGAIN && !l.rung() && l.spin() {
			n, e = l.readInq(fd)
		}
	}
	switch e {
	case unix.EAGAIN:
		l.empties.Add(1)
		// Nothing to read: wait without the buffer.
		l.slept = true
		if l.spinFor > 0 {
			parked.arm(l, int(fd))
		}
		l.iput(l.ibuf)
		l.ibuf = nil
		return false
	case unix.EINTR:
		return false
	case 0:
		l.rn, l.rerr = int(n), nil
	default:
		l.rn, l.rerr = 0, e
	}
	return true
}

// readInq reads into the idle buffer: with TCP_INQ a recvmsg, which also
// sets inqLeft to the bytes it left (a FIN counting as one), else a read
// (inqLeft -1).
func (l *fdLink) readInq(fd uintptr) (uintptr, syscall.Errno) {
	l.inqLeft = -1
	if !l.inq {
		n, _, e := unix.Syscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&l.ibuf[0])), uintptr(len(l.ibuf)))
		return n, e
	}
	l.rvec.Base = &l.ibuf[0]
	l.rvec.SetLen(len(l.ibuf))
	l.rmsg.SetControllen(len(l.rcmsg)) // the kernel leaves what it filled
	n, _, e := unix.Syscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&l.rmsg)), unix.MSG_DONTWAIT)
	l.rvec.Base = nil // the buffer goes back to its free list
	if e == 0 && l.rmsg.Controllen >= unix.SizeofCmsghdr+4 {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&l.rcmsg[0]))
		if h.Level == unix.IPPROTO_TCP && h.Type == unix.TCP_CM_INQ {
			l.inqLeft = int(*(*int32)(unsafe.Pointer(&l.rcmsg[unix.SizeofCmsghdr])))
		}
	}
	return n, e
}

// spin is a step of a spinning wait: it reports whether the wait goes on
// spinning (false once it has spun l.spinFor, or the host's CPUs are
// wanted: see cpus), having let the process's other goroutines run.
func (l *fdLink) spin() bool {
	now := time.Now()
	if now.Sub(l.spinStart) >= l.spinFor || !cpus.free(now) {
		return false
	}
	if l.spins++; l.spins%parkEvery == 0 {
		parked.poll()
	}
	tcpYield()
	return true
}

// tcpYield is runtime.Gosched; tests replace it.
var tcpYield = runtime.Gosched

// cpus says whether the host has CPUs to spare: a spinning reader keeps
// a CPU that, where every CPU is wanted, the host's other threads (the
// peer's among them, waiting behind them) would have, and a sleeper's
// wake-up gets one ahead of them. With 4 KiB ReadAt at 16 and 4 in
// flight at load 5-6 on 2 cores, readers that spun whatever the load
// made 0.94 and 0.46 x memcached's rate (medians of 3 runs), against
// 1.5-1.7 and 1.0-1.6 in the same runs for readers that spun less
// (adaptively, or yielding with sched_yield). The threads running count
// this process's own (a spinning reader, the Go runtime's spinning
// threads) and the peer's, hence twice the CPUs.
var cpus hostCPUs

// hostCPUs reads the host's running threads (/proc/loadavg's fourth
// field, the threads running or waiting for a CPU) at most every
// cpusEvery, from a descriptor opened once: nothing allocated.
type hostCPUs struct {
	mu     sync.Mutex
	fd     int // -1: none (unreadable: spin as if free)
	opened bool
	at     atomic.Int64 // when last read, Unix nanoseconds
	ok     atomic.Bool  // the threads running do not fill the CPUs
	n      int          // the CPUs
	buf    [128]byte
}

const cpusEvery = 10 * time.Millisecond

// free reports whether the threads running, the caller's included, are
// no more than twice the host's CPUs, as last read.
func (h *hostCPUs) free(now time.Time) bool {
	t := now.UnixNano()
	if t-h.at.Load() < int64(cpusEvery) || !h.mu.TryLock() {
		return h.ok.Load()
	}
	defer h.mu.Unlock()
	h.at.Store(t)
	if !h.opened {
		h.opened, h.n = true, runtime.NumCPU()
		fd, err := unix.Open("/proc/loadavg", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			fd = -1
		}
		h.fd = fd
	}
	if h.fd < 0 {
		h.ok.Store(true)
		return true
	}
	k, err := unix.Pread(h.fd, h.buf[:], 0)
	run, ok := 0, false
	if err == nil {
		run, ok = loadavgRunning(h.buf[:k])
	}
	h.ok.Store(!ok || run <= 2*h.n)
	return h.ok.Load()
}

// loadavgRunning parses the running threads out of /proc/loadavg's text
// ("0.61 0.52 0.40 3/98 30187": 3).
func loadavgRunning(b []byte) (int, bool) {
	field := 0
	for i := 0; i < len(b); i++ {
		if b[i] == ' ' {
			field++
			continue
		}
		if field == 3 {
			n, digits := 0, 0
			for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
				n, digits = n*10+int(b[i]-'0'), digits+1
			}
			if digits == 0 || i == len(b) || b[i] != '/' {
				return 0, false
			}
			return n, true
		}
	}
	return 0, false
}

// rung reports whether the queue pair's doorbell rang (QP.ring): a
// spinning reader stops at once rather than at its read deadline.
func (l *fdLink) rung() bool { return l.bell != nil && l.bell.Load() }

// mmsghdr is struct mmsghdr, for sendmmsg(2). Go pads it as C does: to
// 64 bytes on 64-bit Linux, 32 on 32-bit.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
}

// doWrite sends the records with one sendmmsg, each with MSG_EOR so that
// TCP starts a new segment after it (as siw sends each FPDU). One record
// goes with sendmsg: sendmmsg copies in the mmsghdr and offers to
// reschedule after each message (cond_resched), which on a busy host gave
// the CPU away in the middle of a ping-pong's send.
func (l *fdLink) doWrite(fd uintptr) bool {
	const flags = unix.MSG_EOR | unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL
	msgs := l.wmsg
	if l.wflat {
		// Taken for this call only: a write that waits for room holds
		// no flat buffer meanwhile, and copies again when it retries.
		f := flatFree.get()
		defer flatFree.put(f)
		msgs = l.flatten(f)
	}
	// After the copy: what the peer reads was read here before (see
	// link_race.go).
	linkRelease(l.race)
	ticket := l.wstart.Add(1)
	var n uintptr
	var e syscall.Errno
	if b := l.wone; b != nil {
		// One buffer: sendto, with no msghdr or vectors to copy in.
		n, _, e = unix.Syscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), flags, 0, 0)
		if e == 0 {
			l.wn, l.werr = int(n), nil
			l.wok.Store(ticket)
			return true
		}
	} else if len(msgs) == 1 {
		n, _, e = unix.Syscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&msgs[0].hdr)), flags)
		if e == 0 {
			msgs[0].len, n = uint32(n), 1
		}
	} else {
		n, _, e = unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), flags, 0, 0)
	}
	if e == unix.EAGAIN || e == unix.EINTR {
		if l.wblock {
			return false
		}
		l.wn, l.werr = 0, errWouldBlock
		return true
	}
	if e != 0 {
		l.wn, l.werr = 0, e
		return true
	}
	l.wn, l.werr = 0, nil
	for i := range int(n) {
		l.wn += int(msgs[i].len)
	}
	l.wok.Store(ticket)
	return true
}

// writeVecs are the arrays of one sendmmsg at its largest (80 KiB),
// taken from writeVecFree for the call (see freeList).
type writeVecs struct {
	iov [maxIov]unix.Iovec
	msg [maxIov]mmsghdr
}

var writeVecFree = newFreeList(1024, func() *writeVecs { return new(writeVecs) })

// writeVecsSmall are the arrays of a Writev of at most smallIov vectors
// in at most smallMsg records (a ping-pong's one FPDU has three vectors),
// which the link keeps: such a write takes nothing from writeVecFree,
// whose lock's cache line went from core to core at every send when two
// queue pairs of a process ping-ponged. It is made at the first such
// write, so a link that never writes holds none.
type writeVecsSmall struct {
	iov  [smallIov]unix.Iovec
	msg  [smallMsg]mmsghdr
	tiny [tinyMax]byte
}

// tinyMax bounds a write of one record that is copied into one buffer
// and sent with sendto(2) (a ping-pong's FPDU: header, payload and CRC in
// three vectors): sendmsg copies in the msghdr and its vectors and walks
// them.
const tinyMax = 256

const (
	smallIov = 8
	smallMsg = 4
)

// Writev sends bufs as records, all in one system call.
func (l *fdLink) Writev(bufs [][]byte, records []int, block bool) (int, error) {
	if len(bufs) == 1 && len(records) <= 1 && len(bufs[0]) > 0 && len(bufs[0]) <= tinyMax {
		// One small record in one buffer (a ping-pong's FPDU framed
		// whole, see txMini): sendto it, with no vectors or msghdr to
		// build.
		l.wone, l.wflat, l.wblock = bufs[0], false, block
		err := l.rc.Write(l.wfunc)
		l.wone = nil
		if err != nil {
			return 0, err
		}
		return l.wn, l.werr
	}
	small := len(bufs) <= smallIov && len(records) < smallMsg
	if small {
		if l.wsmall == nil {
			l.wsmall = new(writeVecsSmall)
		}
		l.wiov, l.wmsg = l.wsmall.iov[:0], l.wsmall.msg[:0]
	} else {
		v := writeVecFree.get()
		defer writeVecFree.put(v)
		l.wiov, l.wmsg = v.iov[:0], v.msg[:0]
	}
	defer func() { l.wiov, l.wmsg = nil, nil }()
	msg, r := 0, 0 // first vector of the open message; next record end
	total := 0
	for i, b := range bufs {
		for r < len(records) && records[r] <= i {
			l.endMsg(msg)
			msg = len(l.wiov)
			r++
		}
		if len(l.wiov) == cap(l.wiov) {
			break
		}
		if len(b) > 0 {
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			l.wiov = append(l.wiov, v)
			total += len(b)
		}
	}
	l.endMsg(msg)
	if len(l.wmsg) == 0 {
		return 0, nil
	}
	l.wone = nil
	if len(l.wmsg) == 1 && (len(l.wiov) == 1 || small && total <= tinyMax) {
		if len(l.wiov) == 1 {
			l.wone = unsafe.Slice(l.wiov[0].Base, l.wiov[0].Len)
		} else {
			p := 0
			for _, v := range l.wiov {
				p += wireCopy(l.wsmall.tiny[p:], unsafe.Slice(v.Base, v.Len))
			}
			l.wone = l.wsmall.tiny[:p]
		}
	}
	l.wflat = !small && len(l.wiov) >= flatMinVecs && total <= len(l.wiov)*flatAvg
	// Where FPDUs fill segments (see txState.place), TCP must cut the
	// stream only at multiples of the MSS. With TCP_NODELAY (Go's default)
	// it sends a short segment wherever the peer's window ends, and the
	// rest of its buffer goes out shifted off the FPDUs: over veth 30-45 %
	// of write_bw's segments straddled two FPDUs. Corked, it sends only
	// full segments, and holds the last short one back until uncorked.
	// But a corked socket costs: over veth, 64 KiB write_bw used about 8 %
	// more CPU per byte on the sending side and ran at 0.83 of plain TCP's
	// rate against 0.96 uncorked. So the link corks only while the peer's
	// window is too short for what the socket holds unsent and this write
	// (see windowShort), and stays corked, across writes, until the window
	// has room for it all or the transmit path has nothing more to write
	// (Flush): uncorked in between, TCP would cut what it holds where the
	// window ends.
	if total > l.mss && l.mss > 0 && l.mss <= alignMaxSeg {
		if short, _ := l.windowShort(total); short != l.corked {
			l.cork(short)
		}
	}
	l.wblock = block
	err := l.rc.Write(l.wfunc)
	clear(l.wiov) // drop the references to the buffers
	clear(l.wmsg)
	l.wone = nil
	if err != nil {
		return 0, err
	}
	return l.wn, l.werr
}

// windowShort reports whether the peer's receive window lacks room for
// the bytes the socket holds unsent and n more: TCP would then cut them
// where the window ends. known is false where TCP_INFO does not tell the
// window (older kernels) or cannot be read; short is then true.
func (l *fdLink) windowShort(n int) (short, known bool) {
	l.tiN = n
	if l.rc.Control(l.tfunc) != nil {
		return true, false
	}
	return l.tiShort, l.tiKnown
}

func (l *fdLink) doInfo(fd uintptr) {
	l.tiShort, l.tiKnown = true, false
	ln := uint32(unix.SizeofTCPInfo)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO, uintptr(unsafe.Pointer(&l.ti)), uintptr(unsafe.Pointer(&ln)), 0)
	if e != 0 || uintptr(ln) < unsafe.Offsetof(l.ti.Snd_wnd)+unsafe.Sizeof(l.ti.Snd_wnd) {
		return
	}
	l.tiKnown = true
	i := &l.ti
	inflight := int64(i.Bytes_sent - i.Bytes_retrans - i.Bytes_acked)
	room := int64(i.Snd_wnd) - max(inflight, 0)
	l.tiShort = int64(i.Notsent_bytes)+int64(l.tiN) > room
}

// Held reports whether the link holds bytes back (it is corked).
func (l *fdLink) Held() bool { return l.corked }

// Flush uncorks the socket once the peer's window has room for all it
// holds unsent (TCP then cuts nothing where the window ends), or at once
// where the window is not known, and reports whether it is still corked.
func (l *fdLink) Flush() bool {
	if !l.corked {
		return false
	}
	if short, known := l.windowShort(0); !short || !known {
		l.cork(false)
	}
	return l.corked
}

func (l *fdLink) cork(on bool) {
	l.corkOn = on
	if l.rc.Control(l.cfunc) == nil {
		l.corked = on
	}
}

func (l *fdLink) doCork(fd uintptr) {
	v := 0
	if l.corkOn {
		v = 1
	}
	_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK, v)
}

// Small vectors are flattened: over veth (MSS 1448), 64 KiB write_bw
// sent each FPDU as two vectors (its payload from registered memory; its
// trailer and the next FPDU's header from the batch's arena), and the
// kernel's copy of them cost five times what it costs per byte for one
// 64 KiB buffer (_copy_from_iter: 38 % of the sender's CPU at 2.3 GB/s,
// against plain TCP's 11 % at 3.0): the sender, its CPU full, ran at 0.74
// of tcp_bw. Copied first into one buffer per record (a trial that
// copied every write so), the same bytes went at 3.5-3.6 GB/s, with less
// system time (1.95 s against 2.34 in 3 s) for the user copy's 0.4 s;
// as landed, scripts/veth-perf's median went from 0.74 to 0.96 of
// tcp_bw (8 runs). On loopback the trial's 512-byte send_bw gained a
// quarter; 64 KiB Writes (three vectors) and small ping-pongs (three) are
// not flattened.
const (
	flatMinVecs = 8       // fewer vectors are not flattened
	flatAvg     = 2 << 10 // nor vectors of more bytes on average
	flatMax     = 128 << 10
)

// flatBufs are a flattened write's bytes and its arrays: a vector and a
// message per record, at most flatRecs records.
type flatBufs struct {
	b   [flatMax]byte
	iov [flatRecs]unix.Iovec
	msg [flatRecs]mmsghdr
}

const flatRecs = 64

// flatFree keeps the buffers of flattened writes (see freeList): a write
// takes one for each system call.
var flatFree = newFreeList(1024, func() *flatBufs { return new(flatBufs) })

// flatten copies the write's leading whole records, as many as f holds,
// into f and returns f's messages for them, one vector each; the records
// that do not fit are left for the next write (a short write, which the
// caller resumes). A write whose first record does not fit is sent as it
// is: it returns the write's own messages.
func (l *fdLink) flatten(f *flatBufs) []mmsghdr {
	p, k := 0, 0
	for ; k < len(l.wmsg) && k < flatRecs; k++ {
		h := &l.wmsg[k].hdr
		vs := unsafe.Slice(h.Iov, h.Iovlen)
		n := 0
		for _, v := range vs {
			n += int(v.Len)
		}
		if p+n > len(f.b) {
			break
		}
		start := p
		for _, v := range vs {
			p += wireCopy(f.b[p:], unsafe.Slice(v.Base, v.Len))
		}
		f.iov[k] = unix.Iovec{Base: &f.b[start]}
		f.iov[k].SetLen(n)
		f.msg[k] = mmsghdr{}
		f.msg[k].hdr.Iov = &f.iov[k]
		f.msg[k].hdr.SetIovlen(1)
	}
	if k == 0 {
		return l.wmsg
	}
	return f.msg[:k]
}

// endMsg makes the vectors from index first on one message.
func (l *fdLink) endMsg(first int) {
	if len(l.wiov) == first {
		return
	}
	var m mmsghdr
	m.hdr.Iov = &l.wiov[first]
	m.hdr.SetIovlen(len(l.wiov) - first)
	l.wmsg = append(l.wmsg, m)
}

func (l *fdLink) doOutq(fd uintptr) {
	l.outq, l.outqErr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
}

// Unacked reads SIOCOUTQ: the bytes of the send queue the peer has not
// acknowledged, sent or not. It must not race with another Unacked call.
func (l *fdLink) Unacked() (int, error) {
	if err := l.rc.Control(l.ofunc); err != nil {
		return 0, err
	}
	return l.outq, l.outqErr
}

func (l *fdLink) doMSS(fd uintptr) {
	if v, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG); err == nil {
		l.mss = v
	}
}

// MSS reads TCP_MAXSEG afresh: on loopback it grows after the connection
// is made (TCP bounds it by half the largest window the peer offered).
func (l *fdLink) MSS() int {
	_ = l.rc.Control(l.mfunc)
	return l.mss
}

func (l *fdLink) Close() error {
	for {
		switch s := l.inMore.Load(); {
		case s == 0:
			return l.closeNow()
		case s == 2 || l.inMore.CompareAndSwap(1, 2):
			return nil // the reader closes it as it leaves (see inMore)
		}
	}
}

func (l *fdLink) closeNow() error {
	parked.forget(l)
	return l.c.Close()
}
func (l *fdLink) Conn() net.Conn { return l.c }

// Aborted reports whether the connection ended without the peer's FIN
// and with no error left to report: TCP aborted it (its retransmissions
// or keepalive probes went unanswered for the link timeout, or a reset
// came) and a write on the socket took the error, so a read sees only
// end-of-file. A FIN leaves the socket in CLOSE_WAIT; a FIN and then a
// reset leave the reset's error in SO_ERROR. Cold path: it runs at EOF.
func (l *fdLink) Aborted() bool {
	state, soerr := uint8(0), -1
	_ = l.rc.Control(func(fd uintptr) {
		if ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			state = ti.State
		}
		if state == tcpClose {
			soerr, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		}
	})
	return state == tcpClose && soerr == 0
}

// tcpClose is TCP_CLOSE of the kernel's TCP states (include/net/tcp_states.h).
const tcpClose = 7
