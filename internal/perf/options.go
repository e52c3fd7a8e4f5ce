package perf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"time"

	"github.com/gowarp/gowarp"
)

// Defaults and limits.
const (
	// DefaultDepth is how many work requests bandwidth tests keep
	// outstanding. Measured on loopback (2 cores), depth 16…512:
	// write_bw is flat within noise; send_bw needs 128 (its server keeps
	// 2×depth receives, and credits lag); read_bw at 64 KiB peaks at
	// 16–32 (~2.0 GB/s) and falls to ~1.6 at 128, but at 64 B gains
	// from 32 to 128 (5 → 7.7 MB/s). 128 is the best compromise.
	// Signaling every request or every depth/8…depth/2 made no
	// measurable difference, at 64 B or 64 KiB; the default is depth/4.
	DefaultDepth = 128
	// MaxDepth bounds Options.Depth.
	MaxDepth = 4096
	// MaxSize bounds a message, and so the buffer a server registers for a
	// connection.
	MaxSize = 64 << 20
	// maxIRDORD is the most Reads in flight a connection allows (siw's and
	// gowarp's limit).
	maxIRDORD = 128
)

// ConnOptions are the connection settings of a run, the same on both
// sides: the client asks, and the server follows.
type ConnOptions struct {
	CRC         bool                  // MPA CRC32c on every FPDU
	MPARevision int                   // 1 or 2 (0: 2)
	Completion  gowarp.CompletionMode // when signaled Sends and Writes complete
	AsyncOnly   bool                  // transmit from the QP's goroutine only
	MaxFPDU     int                   // FPDU size on the wire (0: the TCP segment)
	Poll        bool                  // busy-poll CQs (with runtime.Gosched) instead of cq.Wait
	// Each makes the ping-pongs (write_lat, send_lat) wait for each
	// message with QP.Progress or cq.Wait and post after it returns, as
	// an application that waits per message does, instead of posting from
	// a QP.ProgressFunc loop (which spares a read of the emptied socket
	// per message).
	Each bool
	// SharedMemory offers a same-host shared-memory link (the client's
	// choice: the server takes it whenever offered). The plain-TCP tests
	// stay on TCP.
	SharedMemory bool
	// SharedMemoryRing is the ring size offered (0: the default).
	SharedMemoryRing int
	// BusyPoll is each side's ConnectOptions.BusyPoll: its own choice,
	// the server's for the connections it accepts.
	BusyPoll time.Duration
}

// Options are the parameters of one run of the client.
type Options struct {
	ConnOptions
	Size int
	// Depth is how many work requests bandwidth tests keep outstanding
	// (0: DefaultDepth).
	Depth int
	// PostList is how many work requests bandwidth tests post with one
	// doorbell (QP.PostSendList), like perftest's --post_list (0:
	// DefaultPostList; 1 posts them one by one).
	PostList int
	// SignalEvery makes bandwidth tests signal only every n-th work
	// request (0: automatic, depth/4).
	SignalEvery int
	// Iters, when positive, is the number of messages (bandwidth) or
	// round trips (latency) to run; otherwise the run lasts Duration.
	Iters    int
	Duration time.Duration
}

func (o *Options) check(t Test) error {
	switch {
	case !t.valid():
		return fmt.Errorf("perf: unknown test %v", t)
	case o.Size < 1 || o.Size > MaxSize:
		return fmt.Errorf("perf: size %d out of range [1, %d]", o.Size, MaxSize)
	case o.Depth < 0 || o.Depth > MaxDepth:
		return fmt.Errorf("perf: depth %d out of range [1, %d]", o.Depth, MaxDepth)
	case o.Iters <= 0 && o.Duration <= 0:
		return errors.New("perf: need a positive duration or iteration count")
	case o.MPARevision != 0 && o.MPARevision != 1 && o.MPARevision != 2:
		return fmt.Errorf("perf: MPA revision %d (want 1 or 2)", o.MPARevision)
	case o.MaxFPDU < 0 || o.MaxFPDU > 1<<16:
		return fmt.Errorf("perf: max FPDU %d out of range [0, 65536]", o.MaxFPDU)
	}
	return nil
}

func (o *Options) depth() int {
	if o.Depth == 0 {
		return DefaultDepth
	}
	return o.Depth
}

// DefaultPostList is the default Options.PostList: small messages then
// leave many to a system call.
const DefaultPostList = 16

func (o *Options) postList() int {
	if o.PostList <= 0 {
		return DefaultPostList
	}
	return min(o.PostList, o.depth())
}

func (o *Options) signalEvery() int {
	d := o.depth()
	n := o.SignalEvery
	if n <= 0 {
		n = d / 4
	}
	return max(1, min(n, d))
}

// done reports whether a run that started at start has done enough after
// i iterations, at now.
func (o *Options) done(i int, start, now time.Time) bool {
	if o.Iters > 0 {
		return i >= o.Iters
	}
	return now.Sub(start) >= o.Duration
}

// TCPAddr returns the address of the plain-TCP tests for an iWARP address:
// the same host, the next port.
func TCPAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p >= 65535 {
		return "", fmt.Errorf("perf: bad port in %q", addr)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1)), nil
}

// Listen listens for the iWARP tests on addr and for the plain-TCP tests
// on the port after it. With port 0 it picks a free pair.
func Listen(dev *gowarp.Device, addr string) (*gowarp.Listener, net.Listener, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, err
	}
	tries := 1
	if port == "0" {
		tries = 50
	}
	for i := 0; ; i++ {
		ln, err := dev.Listen(addr)
		if err != nil {
			return nil, nil, err
		}
		ta, err := TCPAddr(ln.Addr().String())
		if err != nil {
			ln.Close()
			return nil, nil, err
		}
		tln, err := net.Listen("tcp", ta)
		if err == nil {
			return ln, tln, nil
		}
		ln.Close()
		if i+1 >= tries {
			return nil, nil, fmt.Errorf("perf: TCP floor listener: %w", err)
		}
	}
}

// waiter waits for completions on a CQ, either blocking in cq.Wait or
// busy-polling with runtime.Gosched between polls.
type waiter struct {
	ctx  context.Context
	cq   *gowarp.CQ
	poll bool
}

// next polls up to len(wc) completions, waiting for at least one. A
// polling waiter yields with a spinner between polls: with pure
// runtime.Gosched, read_lat's Read Responses, which its queue pair's
// receive goroutine reads, waited for sysmon's network poll (p99 4 ms in
// one process, 11 ms across two; see spinSleep).
func (w *waiter) next(wc []gowarp.Completion) (int, error) {
	var spin spinner
	for i := 1; ; i++ {
		if n := w.cq.Poll(wc); n > 0 {
			return n, nil
		}
		if !w.poll {
			if err := w.cq.Wait(w.ctx); err != nil {
				return 0, err
			}
			continue
		}
		if i%256 == 0 {
			if err := w.ctx.Err(); err != nil {
				return 0, err
			}
		}
		spin.yield()
	}
}

// loop runs fn in qp.ProgressFunc, returning fn's error (stored in *ferr
// as it returns false) before ProgressFunc's own.
func loop(ctx context.Context, qp *gowarp.QP, fn func() bool, ferr *error) error {
	err := qp.ProgressFunc(ctx, fn)
	if *ferr != nil {
		return *ferr
	}
	return err
}

// waitPlaced waits until mr has had at least want bytes placed in it by
// qp's peer, receiving on qp's connection in this goroutine (QP.Progress),
// as perftest's ib_write_lat polls its buffer. It gives up when qp leaves
// the ready state or ctx is done.
func waitPlaced(ctx context.Context, mr *gowarp.MR, want uint64, qp *gowarp.QP) error {
	for mr.Placed() < want {
		if err := qp.Progress(ctx); err != nil {
			return err
		}
	}
	return nil
}

// spinYields and spinSleep shape a spinner: it yields with runtime.Gosched
// spinYields times, then sleeps spinSleep per turn.
//
// Pure Gosched spinning starves the receive goroutines when every P runs a
// spinner (client and server of a ping-pong in one process on two cores):
// Gosched requeues the spinner on the global run queue, which the
// scheduler serves before it polls the network, so arrivals wait for
// sysmon's 10 ms poll. A sleep leaves the P idle, and an idle P polls.
var (
	spinYields = 0
	spinSleep  = time.Microsecond
)

// spinner yields the processor while a goroutine waits for memory to change.
type spinner struct{ n int }

func (s *spinner) yield() {
	if s.n < spinYields {
		s.n++
		runtime.Gosched()
		return
	}
	time.Sleep(spinSleep)
}

// qpGone returns the queue pair's error once it has left the ready state.
func qpGone(qp *gowarp.QP) error {
	if qp.State() == gowarp.StateReady {
		return nil
	}
	if err := qp.Err(); err != nil {
		return err
	}
	return gowarp.ErrNotReady
}

// postRetry posts wr, retrying while the send queue is full (unsignaled
// work leaves it as the socket takes its bytes).
func postRetry(ctx context.Context, qp *gowarp.QP, wr *gowarp.SendWR) error {
	for i := 1; ; i++ {
		err := qp.PostSend(wr)
		if err == nil || !errors.Is(err, gowarp.ErrQueueFull) {
			return err // nil first: errors.Is is a call, on every post
		}
		if i%64 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		runtime.Gosched()
	}
}

// pattern fills b with the test pattern of seed: a sequence in which
// a misplaced or missing byte shows.
func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*131) ^ byte(i>>8) ^ seed
	}
}

// Pattern seeds of the two sides' buffers.
const (
	clientSeed = 0x5a
	serverSeed = 0xa5
)
