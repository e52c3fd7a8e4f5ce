package perf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/gowarp/gowarp"
)

// Server serves the tests to any number of clients, one after another or
// at once. Each connection runs in its own goroutine with its own PD, CQ,
// QP and buffer, all freed when the client leaves; a client that sends
// nonsense or vanishes only ends its own session.
//
// Each session has a device of its own (an STag table): besides keeping
// sessions apart, this frees whatever the engine may still hold when a
// client vanishes mid-transfer (see serverSession.close).
type Server struct {
	// Log receives session events and errors (nil: slog.Default()).
	Log *slog.Logger
	// Conn sets the server's side of every connection: CRC is asked for
	// whatever the client asks; AsyncOnly, Acked completion, Poll and a
	// MaxFPDU here apply in addition to what the client asks.
	Conn ConnOptions

	// sessionDone, if set, is called with a session's buffer after its
	// queue pair is closed (tests).
	sessionDone func(t Test, size int, buf []byte)
}

func (s *Server) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

// Serve serves iWARP connections from rdma and plain-TCP tests from tcp
// (if not nil) until ctx is done or rdma fails. It closes both listeners
// and returns once every session has ended; at ctx's end it returns nil.
func (s *Server) Serve(ctx context.Context, rdma *gowarp.Listener, tcp net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Either listener is closed at the end of ctx, which ends its accept
	// loops; sessions end with ctx too.
	context.AfterFunc(ctx, func() { rdma.Close() })
	var wg sync.WaitGroup
	if tcp != nil {
		context.AfterFunc(ctx, func() { tcp.Close() })
		wg.Go(func() { s.serveTCP(ctx, tcp, &wg) })
	}
	var failed error
	var once sync.Once
	for range acceptors {
		wg.Go(func() {
			if err := s.accept(ctx, rdma, &wg); err != nil {
				once.Do(func() { failed = err })
				cancel()
			}
		})
	}
	<-ctx.Done()
	wg.Wait()
	return failed
}

// acceptors is how many goroutines accept connections at once.
// gowarp's Listener.Accept reads the MPA request of each connection it
// accepts before it returns, for up to 10 s, so a client that connects
// and says nothing holds one acceptor that long; the others go on.
const acceptors = 8

// accept accepts connections and starts their sessions until ctx is done
// (nil) or the listener fails.
func (s *Server) accept(ctx context.Context, rdma *gowarp.Listener, wg *sync.WaitGroup) error {
	for {
		req, err := rdma.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of descriptors and the like: let sessions end, try again.
			s.log().Warn("perf: accept", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		wg.Go(func() { s.session(ctx, req) })
	}
}

// session serves one iWARP connection.
func (s *Server) session(ctx context.Context, cr *gowarp.ConnRequest) {
	log := s.log().With("peer", cr.RemoteAddr())
	req, err := parseRequest(cr.PrivateData())
	if err == nil {
		err = s.checkRequest(&req)
	}
	if err != nil {
		log.Warn("perf: refused a client", "err", err)
		if err := cr.Reject(rejection(err.Error())); err != nil {
			log.Debug("perf: reject", "err", err)
		}
		return
	}
	log = log.With("test", req.test, "size", req.size)
	ss, err := s.newSession(&req, log)
	if err != nil {
		log.Error("perf: session setup", "err", err)
		cr.Reject(rejection("server: " + err.Error()))
		return
	}
	defer func() {
		ss.close()
		if s.sessionDone != nil {
			s.sessionDone(req.test, int(req.size), ss.buf)
		}
	}()
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = cr.Accept(actx, ss.qp, ss.connectOptions(s.Conn))
	cancel()
	if err != nil {
		log.Warn("perf: accept", "err", err)
		return
	}
	log.Debug("perf: session start")
	stop := context.AfterFunc(ctx, func() { ss.qp.Close() })
	defer stop()
	start := time.Now()
	err = ss.run(ctx)
	qerr := ss.qp.Err()
	switch {
	case ctx.Err() != nil:
		log.Debug("perf: session ended by shutdown")
	case errors.Is(err, gowarp.ErrPeerClosed) || errors.Is(qerr, gowarp.ErrPeerClosed):
		log.Debug("perf: session end", "after", time.Since(start))
	case errors.Is(qerr, gowarp.ErrLinkLost):
		log.Info("perf: client connection lost", "err", qerr, "after", time.Since(start))
	default:
		log.Warn("perf: session failed", "err", err, "qp", qerr, "after", time.Since(start))
	}
}

func (s *Server) checkRequest(r *request) error {
	switch {
	case r.size < 1 || r.size > MaxSize:
		return fmt.Errorf("size %d out of range [1, %d]", r.size, MaxSize)
	case r.depth < 1 || r.depth > MaxDepth:
		return fmt.Errorf("depth %d out of range [1, %d]", r.depth, MaxDepth)
	case r.maxFPDU > 1<<16:
		return fmt.Errorf("max FPDU %d out of range [0, 65536]", r.maxFPDU)
	case r.test == WriteLat && (r.bufSTag == 0 || r.bufLen < r.size):
		return fmt.Errorf("write_lat needs a client buffer of %d bytes, got %d bytes at STag %#x", r.size, r.bufLen, r.bufSTag)
	case r.test == SendBW && r.creditSTag == 0:
		return errors.New("send_bw needs a credit buffer")
	}
	return nil
}

// serverSession is the server's side of one connection.
type serverSession struct {
	req     request
	log     *slog.Logger
	pd      *gowarp.PD
	cq      *gowarp.CQ
	qp      *gowarp.QP
	buf     []byte // mr's memory, gone with it; a copy after close if keep
	keep    bool
	mr      *gowarp.MR
	credit  *gowarp.MR // source of credit Writes (send_bw)
	poll    bool
	each    bool // ping-pongs wait per message (Options.Each)
	recvs   int  // receives kept posted
	batch   int  // send_bw: receives reposted per credit Write
	maxFPDU int
}

// Receive depth of the latency tests, and the send queue of the server.
const (
	latRecvDepth = 16
	serverSQ     = 64
)

func (s *Server) newSession(r *request, log *slog.Logger) (*serverSession, error) {
	dev := gowarp.Open(gowarp.WithLogger(log))
	ss := &serverSession{req: *r, log: log, pd: dev.AllocPD(), poll: s.Conn.Poll || r.flags&flagPoll != 0, each: r.flags&flagEach != 0, keep: s.sessionDone != nil}
	ss.maxFPDU = s.Conn.MaxFPDU
	if ss.maxFPDU == 0 {
		ss.maxFPDU = int(r.maxFPDU)
	}
	switch r.test {
	case SendBW:
		ss.recvs = min(2*int(r.depth), MaxDepth)
		ss.batch = max(1, ss.recvs/4)
	case SendLat:
		ss.recvs = latRecvDepth
	default:
		ss.recvs = 1 // an empty receive, whose flush tells that the client left
	}
	ss.cq = dev.NewCQ(ss.recvs + serverSQ + 16)
	completion := s.Conn.Completion
	if r.flags&flagAcked != 0 {
		completion = gowarp.Acked
	}
	var err error
	ss.qp, err = ss.pd.NewQP(gowarp.QPConfig{SendCQ: ss.cq, RecvCQ: ss.cq, SendDepth: serverSQ, RecvDepth: ss.recvs,
		Completion: completion, AsyncOnly: s.Conn.AsyncOnly || r.flags&flagAsync != 0})
	if err != nil {
		return nil, err
	}
	// Alloc: a shared-memory link passes what is sent from it by
	// reference (one copy).
	if ss.mr, err = ss.pd.Alloc(int(r.size), gowarp.LocalWrite|gowarp.RemoteRead|gowarp.RemoteWrite); err != nil {
		ss.close()
		return nil, err
	}
	ss.buf = ss.mr.Bytes()
	pattern(ss.buf, serverSeed)
	if r.test == SendBW {
		if ss.credit, err = ss.pd.Register(make([]byte, 8), 0); err != nil {
			ss.close()
			return nil, err
		}
	}
	// Receives go up before the reply, so the client may Send at once.
	wr := gowarp.RecvWR{}
	if r.test == SendBW || r.test == SendLat {
		wr.SGL = []gowarp.SGE{{MR: ss.mr, Length: len(ss.buf)}}
	}
	for i := range ss.recvs {
		wr.ID = uint64(i)
		if err := ss.qp.PostRecv(&wr); err != nil {
			ss.close()
			return nil, err
		}
	}
	return ss, nil
}

func (ss *serverSession) connectOptions(c ConnOptions) gowarp.ConnectOptions {
	rep := reply{bufSTag: uint32(ss.mr.STag()), bufLen: uint32(ss.mr.Len()), bufAddr: ss.mr.Addr(),
		recvDepth: uint32(ss.recvs), creditBatch: uint32(ss.batch)}
	// A shared-memory link is the client's choice, taken whenever offered.
	return gowarp.ConnectOptions{PrivateData: rep.append(nil), CRC: c.CRC,
		IRD: maxIRDORD, ORD: maxIRDORD, MaxFPDU: ss.maxFPDU, SharedMemory: true, BusyPoll: c.BusyPoll}
}

// close tears the session down: the queue pair first, so that no work is
// outstanding on the regions, then the regions. Once Close has returned
// the engine holds none of them, even when a client vanished mid-transfer
// (TestAbruptCloseReleasesRegions), so Deregister succeeds; a failure is
// only logged: the region would stay in the session's own STag table,
// which is collected with the session.
func (ss *serverSession) close() {
	if ss.qp != nil {
		ss.qp.Close()
	}
	if ss.keep && ss.buf != nil {
		ss.buf = bytes.Clone(ss.buf) // the memory goes with the region
	}
	for _, mr := range []*gowarp.MR{ss.mr, ss.credit} {
		if mr != nil {
			if err := mr.Deregister(); err != nil {
				ss.log.Debug("perf: deregister after close", "stag", mr.STag(), "err", err)
			}
		}
	}
}

// run plays the server's side of the test until the client leaves.
func (ss *serverSession) run(ctx context.Context) error {
	w := waiter{ctx: ctx, cq: ss.cq, poll: ss.poll}
	switch ss.req.test {
	case SendBW:
		return ss.sendBW(ctx, &w)
	case SendLat:
		return ss.sendLat(ctx, &w)
	case WriteLat:
		return ss.writeLat(ctx)
	}
	// write_bw, read_bw, read_lat: the client does everything; the flush
	// of the one posted receive says when it has gone.
	w.poll = false
	var wc [4]gowarp.Completion
	n, err := w.next(wc[:])
	if err != nil {
		return err
	}
	for _, c := range wc[:n] {
		if err := c.Err(); err != nil {
			return err
		}
	}
	// A successful completion here is a Send the test does not expect:
	// the client is misbehaving.
	return errors.New("unexpected Send from the client")
}

// sendBW keeps receives posted, reposting each as it completes, and
// returns credits to the client: one 8-byte Write to its credit buffer
// per batch of reposted receives.
func (ss *serverSession) sendBW(ctx context.Context, w *waiter) error {
	credit := gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: ss.credit, Length: 8}},
		RemoteAddr: ss.req.creditAddr, RKey: gowarp.STag(ss.req.creditSTag)}
	reposted, owed := 0, 0
	return ss.onReceives(w, 64, func() error {
		if reposted++; reposted%ss.batch == 0 {
			owed++
		}
		return nil
	}, func() error {
		for ; owed > 0; owed-- {
			if err := ss.qp.PostSend(&credit); err != nil {
				if errors.Is(err, gowarp.ErrQueueFull) {
					return nil // try again after the next completions
				}
				return err
			}
		}
		return nil
	})
}

// sendLat answers every Send with a Send of the same size.
func (ss *serverSession) sendLat(ctx context.Context, w *waiter) error {
	send := gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: ss.mr, Length: len(ss.buf)}}}
	return ss.onReceives(w, 16, func() error { return postRetry(ctx, ss.qp, &send) }, nil)
}

// onReceives waits for completions until an error, reposting each
// completed receive and calling each for it, then batch (if any) after
// every burst of completions.
func (ss *serverSession) onReceives(w *waiter, burst int, each, batch func() error) error {
	wc := make([]gowarp.Completion, burst)
	recv := gowarp.RecvWR{SGL: []gowarp.SGE{{MR: ss.mr, Length: len(ss.buf)}}}
	if batch == nil && !ss.each && !ss.poll {
		// Answer each receive from the wait for it.
		var ferr error
		return loop(w.ctx, ss.qp, func() bool {
			for {
				n := ss.cq.Poll(wc)
				if n == 0 {
					return true
				}
				for _, c := range wc[:n] {
					if ferr = c.Err(); ferr != nil {
						return false
					}
					if c.Op != gowarp.CompRecv {
						continue
					}
					recv.ID = c.ID
					if ferr = ss.qp.PostRecv(&recv); ferr != nil {
						return false
					}
					if ferr = each(); ferr != nil {
						return false
					}
				}
			}
		}, &ferr)
	}
	for {
		n, err := w.next(wc)
		if err != nil {
			return err
		}
		for _, c := range wc[:n] {
			if err := c.Err(); err != nil {
				return err
			}
			if c.Op != gowarp.CompRecv {
				continue
			}
			recv.ID = c.ID
			if err := ss.qp.PostRecv(&recv); err != nil {
				return err
			}
			if err := each(); err != nil {
				return err
			}
		}
		if batch != nil {
			if err := batch(); err != nil {
				return err
			}
		}
	}
}

// writeLat waits for each of the client's Writes to land in the buffer
// and answers it with a Write of the same size into the client's buffer.
func (ss *serverSession) writeLat(ctx context.Context) error {
	size := uint64(ss.req.size)
	write := gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: ss.mr, Length: int(size)}},
		RemoteAddr: ss.req.bufAddr, RKey: gowarp.STag(ss.req.bufSTag)}
	// The region is new: its count starts at 0. (Reading it here instead
	// would race with the client's first Write, which may land as soon as
	// the connection is accepted.)
	var want uint64
	if !ss.each && !ss.poll {
		// Answer each Write from the wait for it.
		want = size
		var ferr error
		return loop(ctx, ss.qp, func() bool {
			if ss.mr.Placed() < want {
				return true
			}
			if ferr = postRetry(ctx, ss.qp, &write); ferr != nil {
				return false
			}
			want += size
			return true
		}, &ferr)
	}
	for {
		want += size
		if err := waitPlaced(ctx, ss.mr, want, ss.qp); err != nil {
			return err
		}
		if err := postRetry(ctx, ss.qp, &write); err != nil {
			return err
		}
	}
}
