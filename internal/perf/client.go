package perf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gowarp/gowarp"
)

// Client runs tests against a Server.
type Client struct {
	// Dev is the device the client registers its buffers with (nil: a new one).
	Dev *gowarp.Device
	// Addr is the server's iWARP address; TCPAddr that of its plain-TCP
	// tests (empty: TCPAddr(Addr), the next port).
	Addr, TCPAddr string

	// runDone, if set, is called with the run's local buffer after its
	// queue pair is closed (tests).
	runDone func(t Test, buf []byte)
}

// Run runs test t once and returns its result.
func (c *Client) Run(ctx context.Context, t Test, o Options) (Result, error) {
	if err := o.check(t); err != nil {
		return Result{}, err
	}
	if t.TCP() {
		addr := c.TCPAddr
		if addr == "" {
			var err error
			if addr, err = TCPAddr(c.Addr); err != nil {
				return Result{}, err
			}
		}
		return runTCP(ctx, addr, t, &o)
	}
	if c.Dev == nil {
		c.Dev = gowarp.Open()
	}
	r, err := c.connect(ctx, t, &o)
	if err != nil {
		return Result{}, fmt.Errorf("%v: %w", t, err)
	}
	res, err := r.run(ctx)
	if cerr := r.close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return Result{}, fmt.Errorf("%v %d: %w", t, o.Size, err)
	}
	if c.runDone != nil {
		c.runDone(t, r.buf)
	}
	res.Transport = r.transport
	return res, nil
}

// clientRun is the client's side of one connection.
type clientRun struct {
	test   Test
	o      *Options
	pd     *gowarp.PD
	cq     *gowarp.CQ
	qp     *gowarp.QP
	buf    []byte // mr's memory, gone with it; a copy after close if keep
	keep   bool
	mr     *gowarp.MR
	credit *gowarp.MR
	rep    reply
	// transport is the link the connection got.
	transport gowarp.Transport
	// start, if set, is the clock's start shared by parallel runs, so
	// that they stop posting at the same moment (RunParallel).
	start time.Time
}

func (c *Client) connect(ctx context.Context, t Test, o *Options) (*clientRun, error) {
	r := &clientRun{test: t, o: o, pd: c.Dev.AllocPD(), keep: c.runDone != nil}
	depth := o.depth()
	sq, rq := depth+1, 1 // one more send slot for the final flush
	if t == SendLat {
		rq = latRecvDepth
	}
	if !t.Bandwidth() {
		sq = serverSQ
	}
	r.cq = c.Dev.NewCQ(sq + rq + 16)
	var err error
	r.qp, err = r.pd.NewQP(gowarp.QPConfig{SendCQ: r.cq, RecvCQ: r.cq, SendDepth: sq, RecvDepth: rq,
		Completion: o.Completion, AsyncOnly: o.AsyncOnly})
	if err != nil {
		return nil, err
	}
	// Alloc: a shared-memory link passes what is sent from it by
	// reference (one copy).
	if r.mr, err = r.pd.Alloc(o.Size, gowarp.LocalWrite|gowarp.RemoteWrite|gowarp.RemoteRead); err != nil {
		r.close()
		return nil, err
	}
	r.buf = r.mr.Bytes()
	pattern(r.buf, clientSeed)
	req := request{test: t, size: uint32(o.Size), depth: uint32(depth), maxFPDU: uint32(o.MaxFPDU),
		bufSTag: uint32(r.mr.STag()), bufAddr: r.mr.Addr(), bufLen: uint32(r.mr.Len())}
	if t == SendBW {
		if r.credit, err = r.pd.Register(make([]byte, 8), gowarp.RemoteWrite); err != nil {
			r.close()
			return nil, err
		}
		req.creditSTag, req.creditAddr = uint32(r.credit.STag()), r.credit.Addr()
	}
	if o.AsyncOnly {
		req.flags |= flagAsync
	}
	if o.Completion == gowarp.Acked {
		req.flags |= flagAcked
	}
	if o.Poll {
		req.flags |= flagPoll
	}
	if o.Each {
		req.flags |= flagEach
	}
	if t == SendLat {
		wr := gowarp.RecvWR{SGL: []gowarp.SGE{{MR: r.mr, Length: o.Size}}}
		for i := range rq {
			wr.ID = uint64(i)
			if err := r.qp.PostRecv(&wr); err != nil {
				r.close()
				return nil, err
			}
		}
	}
	err = r.qp.Connect(ctx, c.Addr, gowarp.ConnectOptions{PrivateData: req.append(nil), CRC: o.CRC,
		MPARevision: o.MPARevision, IRD: maxIRDORD, ORD: maxIRDORD, MaxFPDU: o.MaxFPDU,
		SharedMemory: o.SharedMemory, SharedMemoryRing: o.SharedMemoryRing, BusyPoll: o.BusyPoll})
	if err != nil {
		r.close()
		if rej, ok := errors.AsType[*gowarp.RejectedError](err); ok {
			return nil, fmt.Errorf("server refused: %s", rejectionReason(rej.PrivateData))
		}
		return nil, err
	}
	r.transport = r.qp.Transport()
	if r.rep, err = parseReply(r.qp.PeerPrivateData()); err != nil {
		r.close()
		return nil, err
	}
	if int(r.rep.bufLen) < o.Size || r.rep.bufSTag == 0 {
		r.close()
		return nil, fmt.Errorf("server offers %d bytes at STag %#x for messages of %d", r.rep.bufLen, r.rep.bufSTag, o.Size)
	}
	if t == SendBW && r.rep.creditBatch == 0 {
		r.close()
		return nil, errors.New("server returns no receive credits")
	}
	return r, nil
}

// close disconnects and frees the run's resources.
func (r *clientRun) close() error {
	if r.qp != nil {
		if r.qp.State() == gowarp.StateReady {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			r.qp.Disconnect(ctx)
			cancel()
		}
		r.qp.Close()
	}
	if r.keep && r.buf != nil {
		r.buf = bytes.Clone(r.buf) // the memory goes with the region
	}
	var errs []error
	for _, mr := range []*gowarp.MR{r.mr, r.credit} {
		if mr != nil {
			if err := mr.Deregister(); err != nil {
				errs = append(errs, fmt.Errorf("deregister region %v: %w", mr.STag(), err))
			}
		}
	}
	return errors.Join(errs...)
}

func (r *clientRun) run(ctx context.Context) (Result, error) {
	switch r.test {
	case WriteBW, ReadBW, SendBW:
		return r.bandwidth(ctx)
	case WriteLat:
		return r.writeLat(ctx)
	case ReadLat:
		return r.readLat(ctx)
	case SendLat:
		return r.sendLat(ctx)
	}
	return Result{}, fmt.Errorf("perf: %v is not an RDMA test", r.test)
}

// flushID is the ID of the zero-length Read that ends a bandwidth run.
const flushID = ^uint64(0)

// bandwidth keeps depth work requests outstanding, signaling every n-th,
// until the run is over; a zero-length Read then stops the clock: its
// completion means every Write and Send before it is placed at the
// server (RDMAP ordering), and every Read answered.
func (r *clientRun) bandwidth(ctx context.Context) (Result, error) {
	o := r.o
	depth := uint64(o.depth())
	every := uint64(o.signalEvery())
	wr := gowarp.SendWR{SGL: []gowarp.SGE{{MR: r.mr, Length: o.Size}}, RemoteAddr: r.rep.bufAddr, RKey: gowarp.STag(r.rep.bufSTag)}
	switch r.test {
	case WriteBW:
		wr.Op = gowarp.OpWrite
	case ReadBW:
		wr.Op = gowarp.OpRead
	case SendBW:
		wr.Op = gowarp.OpSend
		wr.RemoteAddr, wr.RKey = 0, 0
	}
	flush := gowarp.SendWR{ID: flushID, Op: gowarp.OpRead, Flags: gowarp.Signaled, RemoteAddr: r.rep.bufAddr, RKey: gowarp.STag(r.rep.bufSTag)}
	// send_bw may Send only into receives the server has posted: those it
	// posted first, plus a batch per credit Write.
	credits := func() uint64 { return ^uint64(0) }
	if r.test == SendBW {
		initial, batch := uint64(r.rep.recvDepth), uint64(r.rep.creditBatch)
		credits = func() uint64 { return initial + r.credit.Placed()/8*batch }
	}
	w := waiter{ctx: ctx, cq: r.cq, poll: o.Poll}
	wc := make([]gowarp.Completion, 64)
	var spin spinner
	var posted, completed uint64
	stopping, flushed := false, false
	list := make([]gowarp.SendWR, 0, o.postList())
	post := func() error {
		_, err := r.qp.PostSendList(list)
		list = list[:0]
		return err
	}
	start := time.Now()
	if !r.start.IsZero() {
		start = r.start
	}
	for {
		blocked := false
		if !stopping {
			limit := min(completed+depth, credits())
			for posted < limit && (o.Iters <= 0 || posted < uint64(o.Iters)) {
				w := wr
				w.ID, w.Flags = posted, 0
				if (posted+1)%every == 0 {
					w.Flags = gowarp.Signaled
				}
				list = append(list, w)
				posted++
				if len(list) == cap(list) {
					if err := post(); err != nil {
						return Result{}, err
					}
				}
			}
			if len(list) > 0 {
				if err := post(); err != nil {
					return Result{}, err
				}
			}
			blocked = posted == limit && limit < completed+depth
			if o.done(int(posted), start, time.Now()) {
				stopping = true
			}
		}
		if stopping && !flushed {
			if err := r.qp.PostSend(&flush); err != nil {
				return Result{}, err
			}
			flushed = true
		}
		var n int
		if blocked {
			// Waiting for credits, which come as Writes, not completions.
			if n = r.cq.Poll(wc); n == 0 {
				if err := qpGone(r.qp); err != nil {
					return Result{}, err
				}
				spin.yield()
				continue
			}
		} else {
			var err error
			if n, err = w.next(wc); err != nil {
				return Result{}, err
			}
		}
		for _, c := range wc[:n] {
			if err := c.Err(); err != nil {
				return Result{}, r.completionErr(c, err)
			}
			if c.ID == flushID {
				return bandwidthResult(r.test, o.Size, int(posted), time.Since(start)), nil
			}
			completed = max(completed, c.ID+1)
		}
	}
}

// samples collects latency samples in nanoseconds.
func newSamples(o *Options) []int64 {
	if o.Iters > 0 {
		return make([]int64, 0, o.Iters)
	}
	return make([]int64, 0, 1<<16)
}

// writeLat is perftest's ib_write_lat: the client Writes size bytes into
// the server's buffer, the server sees them land and Writes size bytes
// back; a round trip ends when the server's Write has landed here.
func (r *clientRun) writeLat(ctx context.Context) (Result, error) {
	o := r.o
	size := uint64(o.Size)
	wr := gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: r.mr, Length: o.Size}},
		RemoteAddr: r.rep.bufAddr, RKey: gowarp.STag(r.rep.bufSTag)}
	samples := newSamples(o)
	var want uint64 // the region is new, and the server Writes only in answer
	start := time.Now()
	t0 := start
	if !o.Each && !o.Poll {
		// Post each Write from the wait for the last one's answer.
		if err := postRetry(ctx, r.qp, &wr); err != nil {
			return Result{}, err
		}
		want = size
		var ferr error
		err := loop(ctx, r.qp, func() bool {
			if r.mr.Placed() < want {
				return true
			}
			if !lap(o, &samples, start, &t0) {
				return false
			}
			if ferr = postRetry(ctx, r.qp, &wr); ferr != nil {
				return false
			}
			want += size
			return true
		}, &ferr)
		if err != nil {
			return Result{}, err
		}
		return latencyResult(r.test, o.Size, samples, time.Since(start), true), nil
	}
	for more := true; more; more = lap(o, &samples, start, &t0) {
		if err := postRetry(ctx, r.qp, &wr); err != nil {
			return Result{}, err
		}
		want += size
		if err := waitPlaced(ctx, r.mr, want, r.qp); err != nil {
			return Result{}, err
		}
	}
	return latencyResult(r.test, o.Size, samples, time.Since(start), true), nil
}

// lap ends a ping-pong's round trip: it keeps its time since *t0, which
// it moves on, and reports whether the test goes on.
func lap(o *Options, samples *[]int64, start time.Time, t0 *time.Time) bool {
	t1 := time.Now()
	*samples = append(*samples, int64(t1.Sub(*t0)))
	*t0 = t1
	return !o.done(len(*samples), start, t1)
}

// readLat Reads size bytes from the server, one Read at a time.
func (r *clientRun) readLat(ctx context.Context) (Result, error) {
	o := r.o
	wr := gowarp.SendWR{ID: 1, Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: r.mr, Length: o.Size}},
		RemoteAddr: r.rep.bufAddr, RKey: gowarp.STag(r.rep.bufSTag)}
	w := waiter{ctx: ctx, cq: r.cq, poll: o.Poll}
	var wc [4]gowarp.Completion
	samples := newSamples(o)
	start := time.Now()
	t0 := start
	if !o.Each && !o.Poll {
		// Post each Read from the wait for the last one's completion,
		// as the other ping-pongs post theirs.
		if err := r.qp.PostSend(&wr); err != nil {
			return Result{}, err
		}
		var ferr error
		err := loop(ctx, r.qp, func() bool {
			n := r.cq.Poll(wc[:])
			if n == 0 {
				return true
			}
			for _, c := range wc[:n] {
				if err := c.Err(); err != nil {
					ferr = r.completionErr(c, err)
					return false
				}
			}
			if !lap(o, &samples, start, &t0) {
				return false
			}
			if ferr = r.qp.PostSend(&wr); ferr != nil {
				return false
			}
			return true
		}, &ferr)
		if err != nil {
			return Result{}, err
		}
		return latencyResult(r.test, o.Size, samples, time.Since(start), false), nil
	}
	for more := true; more; more = lap(o, &samples, start, &t0) {
		if err := r.qp.PostSend(&wr); err != nil {
			return Result{}, err
		}
		n, err := w.next(wc[:])
		if err != nil {
			return Result{}, err
		}
		for _, c := range wc[:n] {
			if err := c.Err(); err != nil {
				return Result{}, r.completionErr(c, err)
			}
		}
	}
	return latencyResult(r.test, o.Size, samples, time.Since(start), false), nil
}

// sendLat is a Send/Receive ping-pong: the client Sends size bytes, the
// server's receive completes and it Sends size bytes back.
func (r *clientRun) sendLat(ctx context.Context) (Result, error) {
	o := r.o
	send := gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: r.mr, Length: o.Size}}}
	recv := gowarp.RecvWR{SGL: []gowarp.SGE{{MR: r.mr, Length: o.Size}}}
	w := waiter{ctx: ctx, cq: r.cq, poll: o.Poll}
	var wc [4]gowarp.Completion
	samples := newSamples(o)
	start := time.Now()
	t0 := start
	if !o.Each && !o.Poll {
		// Post each Send from the wait for the last one's answer.
		if err := postRetry(ctx, r.qp, &send); err != nil {
			return Result{}, err
		}
		var ferr error
		err := loop(ctx, r.qp, func() bool {
			got := false
			for {
				n := r.cq.Poll(wc[:])
				if n == 0 {
					break
				}
				for _, c := range wc[:n] {
					if err := c.Err(); err != nil {
						ferr = r.completionErr(c, err)
						return false
					}
					if c.Op == gowarp.CompRecv {
						got = true
						recv.ID = c.ID
						if ferr = r.qp.PostRecv(&recv); ferr != nil {
							return false
						}
					}
				}
			}
			if !got {
				return true
			}
			if !lap(o, &samples, start, &t0) {
				return false
			}
			if ferr = postRetry(ctx, r.qp, &send); ferr != nil {
				return false
			}
			return true
		}, &ferr)
		if err != nil {
			return Result{}, err
		}
		return latencyResult(r.test, o.Size, samples, time.Since(start), true), nil
	}
	for more := true; more; more = lap(o, &samples, start, &t0) {
		if err := postRetry(ctx, r.qp, &send); err != nil {
			return Result{}, err
		}
		for got := false; !got; {
			n, err := w.next(wc[:])
			if err != nil {
				return Result{}, err
			}
			for _, c := range wc[:n] {
				if err := c.Err(); err != nil {
					return Result{}, r.completionErr(c, err)
				}
				if c.Op == gowarp.CompRecv {
					got = true
					recv.ID = c.ID
					if err := r.qp.PostRecv(&recv); err != nil {
						return Result{}, err
					}
				}
			}
		}
	}
	return latencyResult(r.test, o.Size, samples, time.Since(start), true), nil
}

// completionErr says why a completion failed: a flushed request's own
// status tells nothing, the queue pair's error (the peer closed, the link
// broke) does.
func (r *clientRun) completionErr(c gowarp.Completion, err error) error {
	if qerr := r.qp.Err(); qerr != nil && c.Status == gowarp.WRFlushError {
		return fmt.Errorf("%v completion: %w: %w", c.Op, err, qerr)
	}
	return fmt.Errorf("%v completion: %w", c.Op, err)
}
