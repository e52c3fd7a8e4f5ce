package perftest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/gowarp/gowarp"
)

// session is one side of a run: it walks the test's Script over the
// control connection and runs the traffic on the data connection.
type session struct {
	o      *Options
	server bool
	dev    *gowarp.Device
	pd     *gowarp.PD
	ln     *gowarp.Listener // server
	c      *control
	d      *data
	r      *Result
	cycle  int // the peer's cycle buffer (its page size), at most maxCycle
	rounds int // send_lat and send_bw: sizes whose receives were posted; -b --all: sizes run (ScriptFor)
	// A server's watch for connections beyond its data connections (see
	// watchExtra): the context that bounds it, and the count it sends.
	watch context.Context
	t0    time.Time // the session's start, for its log's times
	extra <-chan int
}

// logf logs a step, with the time since the session began: a run that
// stalls says where and for how long.
func (s *session) logf(format string, args ...any) {
	if s.o.Log != nil {
		fmt.Fprintf(s.o.Log, "%8.3fs "+format+"\n", append([]any{time.Since(s.t0).Seconds()}, args...)...)
	}
}

// myMessage returns this side's message for step st; report is the index
// of the report field, dest the number of dests exchanged before.
func (s *session) myMessage(st Step, report, dest int) []byte {
	switch st {
	case StepVersion:
		return AppendVersion(nil, Version)
	case StepCycle:
		return AppendUint32(nil, uint32(os.Getpagesize()))
	case StepCacheLine:
		return AppendUint32(nil, CacheLine)
	case StepMTU:
		return AppendMTU(nil, MTU)
	case StepZeroDest:
		var zero Dest
		return zero.Append(nil)
	case StepDest:
		return s.r.LocalDests[qpOfDest(dest, len(s.r.LocalDests))].Append(nil)
	case StepReport:
		return s.r.Local.reportMsgs()[report]
	}
	panic(fmt.Sprintf("perftest: no message for %v", st))
}

// qpOfDest is the queue pair whose dest is the kth (from 0) of a run on
// qps queue pairs: each in turn twice, then the first's (ScriptFor).
func qpOfDest(k, qps int) int {
	if k < 2*qps {
		return k % qps
	}
	return 0
}

// run walks the script. The control connection is up.
func (s *session) run(ctx context.Context) error {
	var reports [reportFields][]byte
	nreport, ndest := 0, 0
	for _, st := range ScriptFor(s.o) {
		if !st.Message() {
			if err := s.act(ctx, st); err != nil {
				return err
			}
			continue
		}
		mine := s.myMessage(st, nreport, ndest)
		var got []byte
		var err error
		if s.server {
			if got, err = s.c.recv(ctx); err == nil {
				err = CheckMessage(st, got)
				if err == nil && st == StepDest && ndest == 2*s.o.QPs+1 {
					err = s.checkDuplex(ctx)
				}
				if err == nil && st == StepReport {
					// The server answers the client's report field with its own.
					reports[nreport] = got
				}
				if err == nil {
					err = s.c.send(ctx, mine)
				}
			}
		} else {
			if got, err = s.c.xchg(ctx, mine); err == nil {
				err = CheckMessage(st, got)
				if err == nil && st == StepReport {
					reports[nreport] = got
				}
			}
		}
		if err != nil {
			return fmt.Errorf("perftest: %v exchange: %w", st, err)
		}
		s.logf("%v exchanged", st)
		switch st {
		case StepCycle:
			// Both sides take the larger (perftest's check_sys_data).
			s.cycle = min(int(binary.BigEndian.Uint32(got)), maxCycle)
		case StepVersion:
			s.r.PeerVersion = ParseVersion(got)
			s.logf("peer is perftest %s", s.r.PeerVersion)
			if !VersionAtLeast(s.r.PeerVersion, 5.70) {
				return fmt.Errorf("perftest: peer version %q is older than 5.70", s.r.PeerVersion)
			}
		case StepDest:
			d, _ := ParseDest(got) // CheckMessage saw its length
			qp := qpOfDest(ndest, s.o.QPs)
			ndest++
			if ndest <= s.o.QPs {
				s.r.RemoteDests = append(s.r.RemoteDests, d)
				s.logf("peer: qpn %#x rkey %#x vaddr %#x", d.QPN, d.RKey, d.VAddr)
			} else if was := s.r.RemoteDests[qp]; d.RKey != was.RKey || d.VAddr != was.VAddr {
				return fmt.Errorf("perftest: peer's dest %d names rkey %#x vaddr %#x, its queue pair %d's named %#x %#x",
					ndest, d.RKey, d.VAddr, qp, was.RKey, was.VAddr)
			}
		case StepReport:
			nreport++
			if nreport == reportFields {
				if s.r.Remote, err = parseReport(reports); err != nil {
					return err
				}
				if s.o.Duplex && s.o.All {
					// Every size's, each after its traffic (ScriptFor).
					s.r.RemoteSizes = append(s.r.RemoteSizes, s.r.Remote)
					nreport = 0
				}
			}
		}
	}
	return nil
}

// allHint names the likely cause of a run of all sizes whose peer went at
// the second size, or refused an access beyond its buffer after the
// first: it runs one size, given no --all, with a buffer for one. The
// exchange of one size is a prefix of the exchange of all, so neither
// side sees it before the traffic. A peer killed later is only that.
func allHint(o *Options, size int, err error) error {
	if !o.All {
		return err
	}
	gone := size == 4 && (errors.Is(err, gowarp.ErrPeerClosed) || errors.Is(err, gowarp.ErrLinkLost))
	if gone || size > 2 && errors.Is(err, gowarp.ErrPeerTerminated) {
		return fmt.Errorf("%w (the peer may run one size only: give both sides --all, perftest's -a, or neither)", err)
	}
	return err
}

// checkDuplex judges, at a write_bw or read_bw server, whether the client
// runs -b as this side does, when its dest after the dests of the queue
// pairs comes: the handshake that follows a one-way client's traffic, or
// the meeting before a bidirectional client's, which sends nothing before
// the answer. The exchange is alike either way, and sides given different
// -b had run to the end printing figures of what neither ran.
func (s *session) checkDuplex(ctx context.Context) error {
	// A one-way client's Writes or Reads left before its handshake, on
	// another connection: the first lands or is served soon after it if
	// not before. A bidirectional client sends nothing until this side
	// answers, so the wait costs a genuine -b run its length once, and
	// sees traffic only from a client without -b.
	if s.o.Test != WriteBW && s.o.Test != ReadBW {
		return nil
	}
	wait := time.Second
	if s.o.Duplex {
		wait = duplexWait
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var seen bool
	switch s.o.Test {
	case WriteBW:
		seen = s.d.buf.WaitPlaced(wctx, 1) == nil
	case ReadBW:
		// Reads served have a count and no wait: look every millisecond.
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for seen = s.d.buf.Reads() > 0; !seen && wctx.Err() == nil; seen = s.d.buf.Reads() > 0 {
			select {
			case <-wctx.Done():
			case <-tick.C:
			}
		}
	}
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case s.o.Duplex && seen:
		return errors.New("perftest: the client's traffic came before it met this server for it: it runs without -b; give both sides -b or neither")
	case !s.o.Duplex && !seen:
		return errors.New("perftest: the client's handshake came with none of its traffic: it runs -b (bidirectional); give both sides -b or neither")
	}
	return nil
}

// duplexWait is how long a bidirectional write_bw or read_bw server looks
// for the traffic a client without -b sent before its handshake
// (checkDuplex).
const duplexWait = 200 * time.Millisecond

// act performs an action step.
func (s *session) act(ctx context.Context, st Step) error {
	switch st {
	case ActData:
		var err error
		if s.server {
			s.d, err = acceptData(ctx, s.dev, s.pd, s.ln, s.o, s.cycle)
			if err == nil && s.watch != nil {
				s.watchExtra()
			}
		} else {
			s.d, err = dialData(ctx, s.dev, s.pd, s.o, s.cycle, s.logf)
		}
		if err != nil {
			return fmt.Errorf("perftest: data connection: %w", err)
		}
		for i := range s.d.qps {
			s.r.LocalDests = append(s.r.LocalDests, s.d.dest(s.o, s.server, i))
		}
		return nil
	case ActRecvs:
		if s.o.Test == SendLat || s.o.Test == SendBW {
			// The next size's receives (ScriptFor).
			sizes := sizesOf(s.o)
			s.d.size = sizes[min(s.rounds, len(sizes)-1)]
			s.rounds++
			if s.o.Test == SendBW && !s.server && s.rounds > 1 {
				if landed, want := s.d.creditsOver(ctx, s.o); landed < want {
					s.logf("%d of the last size's %d credit Writes landed; going on", landed, want)
				}
			}
		}
		if s.server || s.o.Test == SendLat {
			return s.d.postRecvs(s.o)
		}
		return nil
	case ActTraffic:
		o := s.o
		if o.All && (o.Duplex || o.Test == SendLat || o.Test == SendBW) {
			// One size a round (ScriptFor): a send test's, the one its
			// receives were posted for; a bidirectional run's, the next.
			so := *o
			so.Size, so.All = s.d.size, false
			if o.Duplex {
				sizes := sizesOf(o)
				so.Size = sizes[min(s.rounds, len(sizes)-1)]
				s.rounds++
			}
			s.logf("running %v: %d × %d B", o.Test, o.Iters, so.Size)
			if err := s.d.run(ctx, &so, s.server, s.r.RemoteDests, s.r); err != nil {
				return allHint(o, so.Size, fmt.Errorf("perftest: %s traffic, %d B: %w", o.Test, so.Size, err))
			}
			if o.Test == SendLat {
				s.r.LatSizes = append(s.r.LatSizes, s.r.Lat)
			} else {
				s.r.Sizes = append(s.r.Sizes, s.r.Local)
			}
			return nil
		}
		switch {
		case s.server && !s.o.Duplex && (s.o.Test == WriteBW || s.o.Test == ReadBW):
			s.logf("the client runs %v; its handshake comes after", s.o.Test)
			return nil
		case s.o.Duration != 0 && !s.server:
			s.logf("running %v: %d B for %v on %d queue pairs", s.o.Test, s.o.Size, s.o.Duration, s.o.QPs)
		default:
			s.logf("running %v: %d × %d B on %d queue pairs", s.o.Test, s.o.Iters, s.o.Size, s.o.QPs)
		}
		if err := s.d.run(ctx, s.o, s.server, s.r.RemoteDests, s.r); err != nil {
			return fmt.Errorf("perftest: %s traffic: %w", s.o.Test, err)
		}
		s.logf("traffic done")
		return nil
	}
	return fmt.Errorf("perftest: %v is not an action", st)
}

// control is the control connection: one receive posted; each message
// step is a Send each way.
type control struct {
	qp         *gowarp.QP
	cq         *gowarp.CQ
	sbuf, rbuf *gowarp.MR
	wc         [4]gowarp.Completion
	sent       int    // Sends completed
	got        []byte // a message received and not yet taken
	transcript *[]Message
	server     bool
	sendErr    error // a Send that failed (see pump)
	recvErr    error // a receive that failed (see pump)
}

const ctrlBuf = 4096

func newControl(dev *gowarp.Device, pd *gowarp.PD, r *Result, server bool) (*control, error) {
	c := &control{cq: dev.NewCQ(16), transcript: &r.Transcript, server: server}
	var err error
	if c.qp, err = pd.NewQP(gowarp.QPConfig{SendCQ: c.cq, RecvCQ: c.cq, SendDepth: 4, RecvDepth: 2}); err != nil {
		return nil, err
	}
	if c.sbuf, err = pd.Register(make([]byte, ctrlBuf), gowarp.LocalWrite); err != nil {
		c.close()
		return nil, err
	}
	if c.rbuf, err = pd.Register(make([]byte, ctrlBuf), gowarp.LocalWrite); err != nil {
		c.close()
		return nil, err
	}
	if err := c.postRecv(); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *control) postRecv() error {
	return c.qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: c.rbuf, Length: ctrlBuf}}})
}

// pump waits for completions and records them. A Send's error is kept
// for the caller to judge: a client whose Send was answered knows the peer
// has it, though the peer may have closed at once after its answer (a
// server after the closing handshake) and flushed a completion not yet
// written.
func (c *control) pump(ctx context.Context) error {
	n := c.cq.Poll(c.wc[:])
	if n == 0 {
		if st := c.qp.State(); st != gowarp.StateReady {
			return fmt.Errorf("control connection %v: %w", st, c.qp.Err())
		}
		return waitCQ(ctx, c.cq, c.qp)
	}
	for _, w := range c.wc[:n] {
		if w.Op == gowarp.CompSend {
			c.sent++
			if err := w.Err(); err != nil && c.sendErr == nil {
				c.sendErr = c.wrap(&w, err)
			}
			continue
		}
		if err := w.Err(); err != nil {
			// A receive posted for a next message that never comes is
			// flushed when the peer closes after the last one: an error
			// only for a recv that waits for it.
			if c.recvErr == nil {
				c.recvErr = c.wrap(&w, err)
			}
			continue
		}
		if c.got != nil {
			return fmt.Errorf("peer sent a second message before the answer to its first")
		}
		c.got = append([]byte{}, c.rbuf.Bytes()[:w.Bytes]...)
	}
	return nil
}

func (c *control) wrap(w *gowarp.Completion, err error) error {
	if qerr := c.qp.Err(); qerr != nil {
		return fmt.Errorf("%v completion: %w (%w)", w.Op, err, qerr)
	}
	return fmt.Errorf("%v completion: %w", w.Op, err)
}

// xchg is a client's message step: it Sends msg and returns the answer.
func (c *control) xchg(ctx context.Context, msg []byte) ([]byte, error) {
	want := c.sent + 1
	if err := c.post(msg); err != nil {
		return nil, err
	}
	got, err := c.recv(ctx)
	if err != nil {
		if c.sendErr != nil {
			return nil, fmt.Errorf("%w; %w", c.sendErr, err)
		}
		return nil, err
	}
	for c.sent < want {
		if err := c.pump(ctx); err != nil {
			return nil, err
		}
	}
	c.sendErr = nil // answered: the peer has it
	return got, nil
}

func (c *control) post(msg []byte) error {
	copy(c.sbuf.Bytes(), msg)
	if err := c.qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpSend, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: c.sbuf, Length: len(msg)}}}); err != nil {
		return err
	}
	*c.transcript = append(*c.transcript, Message{FromClient: !c.server, Data: append([]byte(nil), msg...)})
	return nil
}

// send Sends msg and waits for its completion (a server's answer).
func (c *control) send(ctx context.Context, msg []byte) error {
	want := c.sent + 1
	if err := c.post(msg); err != nil {
		return err
	}
	for c.sent < want {
		if err := c.pump(ctx); err != nil {
			return err
		}
	}
	return c.sendErr
}

// recv returns the peer's next message.
func (c *control) recv(ctx context.Context) ([]byte, error) {
	for c.got == nil {
		if c.recvErr != nil {
			return nil, c.recvErr
		}
		if err := c.pump(ctx); err != nil {
			return nil, err
		}
	}
	m := c.got
	c.got = nil
	*c.transcript = append(*c.transcript, Message{FromClient: c.server, Data: m})
	if err := c.postRecv(); err != nil && c.qp.State() == gowarp.StateReady {
		return nil, err
	}
	// A queue pair that closed after this message fails the next step, if
	// there is one.
	return m, nil
}

// close closes the queue pair and deregisters the buffers it used.
func (c *control) close() {
	c.qp.Close()
	for _, mr := range []*gowarp.MR{c.sbuf, c.rbuf} {
		if mr != nil {
			mr.Deregister()
		}
	}
}

// data is the data connections and their buffers.
type data struct {
	qp     *gowarp.QP   // the first queue pair, the only one but with Options.QPs
	qps    []*gowarp.QP // all of them, qps[0] == qp, sharing cq and buf
	cq     *gowarp.CQ
	pd     *gowarp.PD
	buf    *gowarp.MR // for each queue pair, two halves: what this side sends, what the peer places
	size   int        // a message's
	half   int        // a half's: see halfSize
	cycle  int        // the cycle buffer: this side's page size or the peer's, the larger
	credit *gowarp.MR // send_bw client: the server Writes its credit count here
	words  []uint32   // the credit buffer's memory
	qpn    uint32
	wc     [64]gowarp.Completion
	// Counts of completions seen by pump.
	sends, recvs int
	// credited is the count of credit Writes a send_bw client has seen
	// land, over the sizes before (creditsOver).
	credited int
	// placed is what the peer's Writes of the sizes run so far placed
	// (write_lat).
	placed  uint64
	recvBad error // a receive of the wrong size
}

// maxCycle bounds the cycle buffer a peer can make this side allocate.
const maxCycle = 1 << 20

// halfSize is the size of each half of a data buffer, perftest's
// BUFF_SIZE: the message or the cycle buffer, whichever is larger, rounded
// up to the cache line. The bandwidth tests move their remote address by
// the message (rounded up to the cache line) through the cycle buffer when
// a message is at most half of it (perftest's increase_rem_addr), so a
// buffer of two messages was too small for their Reads and Writes of up
// to 2 KiB (a Terminate for bounds, 2026-12-07).
func halfSize(size, cycle int) int {
	return (max(size, cycle) + CacheLine - 1) / CacheLine * CacheLine
}

// newData allocates a data connection's buffers and queue pair; peerCycle
// is the peer's cycle buffer.
func newData(dev *gowarp.Device, pd *gowarp.PD, o *Options, peerCycle int) (*data, error) {
	d := &data{cq: dev.NewCQ(2*o.TxDepth*o.QPs + o.RxDepth + 16), qpn: 0x100 + rand.Uint32N(0xff00), size: o.Size, pd: pd}
	d.cycle = max(peerCycle, os.Getpagesize())
	d.half = halfSize(o.Size, d.cycle)
	var err error
	// perftest registers its buffer with every right.
	if d.buf, err = pd.Register(make([]byte, 2*d.half*o.QPs), gowarp.LocalWrite|gowarp.RemoteRead|gowarp.RemoteWrite); err != nil {
		return nil, err
	}
	d.words = make([]uint32, 2)
	if d.credit, err = pd.Register(wordBytes(d.words), gowarp.LocalWrite|gowarp.RemoteWrite); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *data) newQP(pd *gowarp.PD, o *Options) (*gowarp.QP, error) {
	return pd.NewQP(gowarp.QPConfig{SendCQ: d.cq, RecvCQ: d.cq, SendDepth: o.TxDepth + 8, RecvDepth: o.RxDepth + 4})
}

// dataConnect returns the options of the data connection: perftest asks
// for its outstanding reads in read tests, none otherwise.
func dataConnect(o *Options) gowarp.ConnectOptions {
	co := o.Connect
	// As perftest: out_reads for read tests, 0/0 otherwise (the captures).
	co.IRD, co.ORD = gowarp.NoReads, gowarp.NoReads
	if o.Test == ReadBW || o.Test == ReadLat {
		co.IRD, co.ORD = MaxOutReads, MaxOutReads
	}
	return co
}

func dialData(ctx context.Context, dev *gowarp.Device, pd *gowarp.PD, o *Options, cycle int, logf func(string, ...any)) (*data, error) {
	d, err := newData(dev, pd, o, cycle)
	if err != nil {
		return nil, err
	}
	for i := range o.QPs {
		qp, err := d.dialOne(ctx, pd, o, logf)
		if err != nil {
			d.close()
			switch {
			case i > 0:
				// The server took the first: perftest's refuses (or
				// resets) the connections beyond its own -q.
				err = fmt.Errorf("queue pair %d of %d: %w (the server took %d: give both sides the same -q)", i+1, o.QPs, err, i)
			case o.QPs > 1:
				err = fmt.Errorf("queue pair %d of %d: %w", i+1, o.QPs, err)
			}
			return nil, err
		}
		d.add(qp)
	}
	return d, nil
}

// dialOne connects one data queue pair, trying again as perftest does: the
// server listens for it only after the first handshake.
func (d *data) dialOne(ctx context.Context, pd *gowarp.PD, o *Options, logf func(string, ...any)) (*gowarp.QP, error) {
	co := dataConnect(o)
	var last error
	for try := range o.DataTries {
		if try > 0 {
			select {
			case <-time.After(o.DataGap):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		qp, err := d.newQP(pd, o)
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = qp.Connect(cctx, o.Addr, co)
		cancel()
		if err == nil {
			logf("data connection up after %d tries", try+1)
			return qp, nil
		}
		// Closed, it leaves the CQ: the latency tests' waits receive
		// inline only on a CQ's single queue pair.
		qp.Close()
		last = err
	}
	return nil, fmt.Errorf("%d tries: %w", o.DataTries, last)
}

// add adds a connected queue pair.
func (d *data) add(qp *gowarp.QP) {
	d.qps = append(d.qps, qp)
	d.qp = d.qps[0]
}

func acceptData(ctx context.Context, dev *gowarp.Device, pd *gowarp.PD, ln *gowarp.Listener, o *Options, cycle int) (*data, error) {
	d, err := newData(dev, pd, o, cycle)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	co := dataConnect(o)
	// perftest's write_lat server Writes first, without peer-to-peer
	// mode: the four dests before the traffic make sure the client is
	// ready.
	co.SendFirst = o.Test == WriteLat
	for i := range o.QPs {
		if err := d.acceptOne(actx, ln, pd, o, co); err != nil {
			d.close()
			if o.QPs > 1 {
				err = fmt.Errorf("queue pair %d of %d: %w", i+1, o.QPs, err)
			}
			return nil, err
		}
	}
	return d, nil
}

// acceptOne accepts one data connection.
func (d *data) acceptOne(ctx context.Context, ln *gowarp.Listener, pd *gowarp.PD, o *Options, co gowarp.ConnectOptions) error {
	req, err := ln.Accept(ctx)
	if err != nil {
		return err
	}
	qp, err := d.newQP(pd, o)
	if err != nil {
		req.Reject(nil)
		return err
	}
	if err := req.Accept(ctx, qp, co); err != nil {
		qp.Close()
		return err
	}
	d.add(qp)
	return nil
}

// dest is this side's pingpong_dest for queue pair i: the buffer the peer
// Writes to or Reads from, or for a send_bw client the word the server's
// credit Writes land in.
func (d *data) dest(o *Options, server bool, i int) Dest {
	ds := Dest{OutReads: 1, QPN: d.qpn + uint32(i), PSN: rand.Uint32() & 0xffffff,
		RKey: uint32(d.buf.STag()), VAddr: d.buf.Addr() + uint64(d.base(i))}
	switch o.Test {
	case ReadBW, ReadLat:
		ds.OutReads = MaxOutReads
	case WriteLat:
		// The peer's Writes land in the second half, as in perftest.
		ds.VAddr += uint64(d.half)
	case WriteBW:
		if o.Duplex {
			// This side Writes from the first half while the peer's
			// Writes land: in the second.
			ds.VAddr += uint64(d.half)
		}
	case SendBW:
		if !server {
			// The server's credit Writes land in the second word of the
			// credit buffer, as perftest's ctx_alloc_credit lays it out.
			ds.RKey, ds.VAddr = uint32(d.credit.STag()), d.credit.Addr()+4
		}
	}
	return ds
}

// base is the offset of queue pair i's part of the buffer.
func (d *data) base(i int) int { return 2 * d.half * i }

func (d *data) close() {
	if d == nil {
		return
	}
	for _, qp := range d.qps {
		qp.Close()
	}
}

// recvWR is a receive into the second half of the buffer.
func (d *data) recvWR() *gowarp.RecvWR {
	return &gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: d.buf, Offset: d.half, Length: d.size}}}
}

// postRecvs posts the receives of a send test.
func (d *data) postRecvs(o *Options) error {
	for range o.RxDepth {
		if err := d.qp.PostRecv(d.recvWR()); err != nil {
			return fmt.Errorf("posting receives: %w", err)
		}
	}
	return nil
}

// pump takes the completions there are, waiting for some if there are
// none and wait is set, and counts them.
func (d *data) pump(ctx context.Context, wait bool) (int, error) {
	n := d.cq.Poll(d.wc[:])
	if n == 0 {
		if !wait {
			return 0, nil
		}
		if st := d.qp.State(); st != gowarp.StateReady {
			return 0, fmt.Errorf("data connection %v: %w", st, d.qp.Err())
		}
		return 0, waitCQ(ctx, d.cq, d.qp)
	}
	for _, w := range d.wc[:n] {
		if err := w.Err(); err != nil {
			if qerr := d.qp.Err(); qerr != nil {
				return 0, fmt.Errorf("work request %d (%v): %w (%w)", w.ID, w.Op, err, qerr)
			}
			return 0, fmt.Errorf("work request %d (%v): %w", w.ID, w.Op, err)
		}
		if w.Op == gowarp.CompRecv {
			d.recvs++
			if w.Bytes != d.size && d.recvBad == nil {
				d.recvBad = fmt.Errorf("a Send of %d bytes, want %d", w.Bytes, d.size)
			}
		} else {
			d.sends++
		}
	}
	return n, d.recvBad
}

// run runs this side's part of the test; peers are the peer's dests, one
// for each queue pair.
func (d *data) run(ctx context.Context, o *Options, server bool, peers []Dest, r *Result) error {
	peer := &peers[0]
	switch {
	case o.Test == WriteBW || o.Test == ReadBW:
		if server && !o.Duplex {
			return nil // the client Writes or Reads; nothing to do here
		}
		if o.All {
			// As perftest's -a: each size in turn, 2 B to MaxSize.
			for _, size := range sizesOf(o) {
				so := *o
				so.Size = size
				var rep Report
				if err := d.traffic(ctx, &so, peers, &rep); err != nil {
					return allHint(o, size, fmt.Errorf("%d B: %w", size, err))
				}
				r.Sizes = append(r.Sizes, rep)
			}
			r.Local = r.Sizes[len(r.Sizes)-1]
			return nil
		}
		return d.traffic(ctx, o, peers, &r.Local)
	case o.Test == SendBW:
		if server {
			return d.sendBWServer(ctx, o, peer, &r.Local)
		}
		return d.traffic(ctx, o, peers, &r.Local)
	case o.Test == ReadLat && server:
		return nil
	}
	rtt := 2.0
	if o.Test == ReadLat {
		rtt = 1
	}
	// send_lat runs one size a call (session.act); the others every size
	// in turn with -a, with no handshake between, as perftest's.
	for _, size := range sizesOf(o) {
		so := *o
		so.Size = size
		tposted, sampled, err := d.pingPong(ctx, &so, server, peer)
		if err != nil {
			if o.All {
				return allHint(o, size, fmt.Errorf("%d B: %w", size, err))
			}
			return err
		}
		if o.Duration > 0 {
			from, to, _ := o.window()
			r.Lat = latSampled(size, sampled, time.Duration(to-from), rtt)
			continue
		}
		r.Lat = latReport(size, tposted, rtt)
		if o.All {
			r.LatSizes = append(r.LatSizes, r.Lat)
		}
	}
	return nil
}

// Bandwidth units: perftest's MB/sec is 2^20 bytes a second, its Gb/sec
// (--report_gbits) 10^9 bits.
const (
	mib   = 1 << 20
	gbits = 125e6
)

// unit is the number of bytes a second in o's unit of bandwidth.
func (o *Options) unit() float64 {
	if o.Gbits {
		return gbits
	}
	return mib
}

// reportRecv is the send_bw server's report: bytes received over the time
// from the first receive to the last, with no peak (as perftest's server).
func reportRecv(size, n int, first, last time.Time, unit float64) Report {
	r := Report{Size: uint64(size), Iters: uint64(n)}
	if dt := last.Sub(first).Seconds(); dt > 0 && n > 1 {
		// The first receive starts the clock: n-1 messages arrive after it.
		r.BWAvg = float64(size) * float64(n-1) / dt / unit
		r.MsgRateMpps = float64(n-1) / dt / 1e6
	}
	return r
}

// waitCQ waits for a completion, waking now and then to see whether the
// queue pair has failed without one (a peer gone with nothing in flight).
func waitCQ(ctx context.Context, cq *gowarp.CQ, qp *gowarp.QP) error {
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err := cq.Wait(wctx)
	if err != nil && ctx.Err() == nil {
		return nil // the tick: the caller polls and looks again
	}
	return err
}
