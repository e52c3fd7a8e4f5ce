package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"time"
	"unsafe"

	"github.com/gowarp/gowarp"
)

// Test is a perftest bandwidth test.
type Test string

// The tests.
const (
	WriteBW Test = "write_bw"
	ReadBW  Test = "read_bw"
	SendBW  Test = "send_bw"
)

// Tests lists them.
var Tests = []Test{WriteBW, ReadBW, SendBW}

// DefaultPort is perftest's port.
const DefaultPort = 18515

// Defaults of perftest's bandwidth tests.
const (
	DefaultSize    = 65536
	DefaultIters   = 5000
	DefaultTxDepth = 128
	DefaultRxDepth = 512 // DEF_RX_SEND
	// MaxOutReads is what perftest asks for in read_bw: siw's
	// max_qp_rd_atom.
	MaxOutReads = 128
)

// Options configure a run.
type Options struct {
	Test  Test
	Addr  string // the server, host:port
	Size  int    // message size (-s)
	Iters int    // messages (-n); send_bw needs the server's own -n
	// TxDepth is how many work requests stay outstanding (-t).
	TxDepth int
	// RxDepth is the server's receive depth (-r, send_bw): the client
	// keeps at most this many Sends beyond the credits the server granted.
	// perftest uses 512, or -n when that is smaller.
	RxDepth int
	// Connect tunes both connections (CRC, MPA revision, peer-to-peer).
	// IRD and ORD are set per test as perftest does.
	Connect gowarp.ConnectOptions
	// Settle is how long the client waits after the control connection is
	// up before its first message (perftest sleeps 1 s in write_bw). None
	// is needed: the queue pair wakes a siw server that missed the first
	// message while it accepted (gowarp.ConnectOptions.NoNudge).
	Settle time.Duration
	// DataTries and DataGap bound the retries of the data connection: the
	// server listens for it only after the first handshake (perftest
	// retries 10 times 100 ms apart).
	DataTries int
	DataGap   time.Duration
	// Log receives a line per protocol step; nil for none.
	Log io.Writer
}

func (o *Options) defaults() error {
	switch o.Test {
	case WriteBW, ReadBW, SendBW:
	default:
		return fmt.Errorf("perftest: unknown test %q (want write_bw, read_bw or send_bw)", o.Test)
	}
	if o.Size == 0 {
		o.Size = DefaultSize
	}
	if o.Iters == 0 {
		o.Iters = DefaultIters
	}
	if o.TxDepth == 0 {
		o.TxDepth = DefaultTxDepth
	}
	if o.RxDepth == 0 {
		o.RxDepth = DefaultRxDepth
	}
	// perftest's force_dependecies.
	o.TxDepth = min(o.TxDepth, o.Iters)
	o.RxDepth = min(o.RxDepth, o.Iters)
	if o.DataTries == 0 {
		o.DataTries = 50
	}
	if o.DataGap == 0 {
		o.DataGap = 100 * time.Millisecond
	}
	if o.Size < 1 || o.Iters < 1 || o.TxDepth < 1 || o.RxDepth < 1 {
		return errors.New("perftest: size, iterations and depths must be positive")
	}
	return nil
}

// Message is one control message of a run's transcript.
type Message struct {
	FromClient bool
	Data       []byte
}

// Result is what a run produced.
type Result struct {
	Local         Report // measured here, and sent to the server
	Remote        Report // the server's report (write_bw, read_bw): see Plausible
	ServerVersion string
	ClientDest    Dest
	ServerDest    Dest
	Transcript    []Message // the control connection, in order
}

// Run runs one test against a perftest server.
func Run(ctx context.Context, dev *gowarp.Device, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	r := &Result{}
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", args...)
		}
	}
	pd := dev.AllocPD()

	// The control connection.
	c, err := dialControl(ctx, dev, pd, o)
	if err != nil {
		return nil, fmt.Errorf("perftest: control connection: %w", err)
	}
	defer c.close()
	c.transcript = &r.Transcript
	logf("control connection up; settling %v", o.Settle)
	select {
	case <-time.After(o.Settle):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	m, err := c.xchg(ctx, AppendVersion(nil, Version))
	if err != nil {
		return nil, fmt.Errorf("perftest: version exchange: %w", err)
	}
	r.ServerVersion = ParseVersion(m)
	logf("server is perftest %s", r.ServerVersion)
	if !VersionAtLeast(r.ServerVersion, 5.70) {
		return nil, fmt.Errorf("perftest: server version %q is older than 5.70", r.ServerVersion)
	}
	pagesize := uint32(os.Getpagesize())
	steps := [][]byte{AppendUint32(nil, pagesize), AppendUint32(nil, CacheLine), AppendMTU(nil, MTU)}
	for _, s := range steps {
		if _, err := c.xchg(ctx, s); err != nil {
			return nil, fmt.Errorf("perftest: parameter exchange: %w", err)
		}
	}

	// The data connection, between two empty handshakes.
	var zero Dest
	if _, err := c.xchg(ctx, zero.Append(nil)); err != nil {
		return nil, fmt.Errorf("perftest: handshake before the data connection: %w", err)
	}
	d, err := dialData(ctx, dev, pd, o, logf)
	if err != nil {
		return nil, fmt.Errorf("perftest: data connection: %w", err)
	}
	defer d.close()
	if _, err := c.xchg(ctx, zero.Append(nil)); err != nil {
		return nil, fmt.Errorf("perftest: handshake after the data connection: %w", err)
	}

	// Keys: the client's pingpong_dest, answered by the server's.
	r.ClientDest = Dest{OutReads: 1, QPN: d.qpn, PSN: rand.Uint32() & 0xffffff,
		RKey: uint32(d.buf.STag()), VAddr: d.buf.Addr()}
	if o.Test == ReadBW {
		r.ClientDest.OutReads = MaxOutReads
	}
	if o.Test == SendBW {
		// The server's credit Writes land in the second word of the
		// credit buffer, as perftest's ctx_alloc_credit lays it out.
		r.ClientDest.RKey, r.ClientDest.VAddr = uint32(d.credit.STag()), d.credit.Addr()+4
	}
	myDest := r.ClientDest.Append(nil)
	handshakes := 3
	if o.Test == SendBW {
		handshakes = 4 // the last one tells the client the receives are posted
	}
	for i := range handshakes {
		m, err := c.xchg(ctx, myDest)
		if err != nil {
			return nil, fmt.Errorf("perftest: handshake %d: %w", i+1, err)
		}
		sd, err := ParseDest(m)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			r.ServerDest = sd
		} else if sd.RKey != r.ServerDest.RKey || sd.VAddr != r.ServerDest.VAddr {
			return nil, fmt.Errorf("perftest: server's handshake %d names rkey %#x vaddr %#x, the first named %#x %#x",
				i+1, sd.RKey, sd.VAddr, r.ServerDest.RKey, r.ServerDest.VAddr)
		}
	}
	logf("server buffer: rkey %#x vaddr %#x; running %d × %d B", r.ServerDest.RKey, r.ServerDest.VAddr, o.Iters, o.Size)

	if err := d.traffic(ctx, &o, &r.ServerDest, &r.Local); err != nil {
		return nil, fmt.Errorf("perftest: %s traffic: %w", o.Test, err)
	}
	logf("traffic done")

	if o.Test != SendBW {
		if _, err := c.xchg(ctx, myDest); err != nil {
			return nil, fmt.Errorf("perftest: handshake before the reports: %w", err)
		}
		var got [5][]byte
		for i, f := range r.Local.reportMsgs() {
			if got[i], err = c.xchg(ctx, f); err != nil {
				return nil, fmt.Errorf("perftest: report exchange: %w", err)
			}
		}
		if r.Remote, err = parseReport(got); err != nil {
			return nil, err
		}
	}
	if _, err := c.xchg(ctx, myDest); err != nil {
		return nil, fmt.Errorf("perftest: closing handshake: %w", err)
	}
	// The server closes first: perftest's server destroys its side right
	// after this handshake. Closing at once instead can make siw complete
	// the server's last Send with an error (it suspends transmission when
	// the peer's FIN arrives, before the Send's completion is written).
	logf("closing")
	for deadline := time.Now().Add(3 * time.Second); c.qp.State() == gowarp.StateReady && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	d.qp.Disconnect(dctx)
	c.qp.Disconnect(dctx)
	return r, nil
}

// control is the control connection: one receive posted, the client
// Sends and then waits for the server's Send.
type control struct {
	qp         *gowarp.QP
	cq         *gowarp.CQ
	sbuf, rbuf *gowarp.MR
	wc         [4]gowarp.Completion
	transcript *[]Message
}

const ctrlBuf = 4096

func dialControl(ctx context.Context, dev *gowarp.Device, pd *gowarp.PD, o Options) (*control, error) {
	c := &control{cq: dev.NewCQ(16)}
	var err error
	if c.qp, err = pd.NewQP(gowarp.QPConfig{SendCQ: c.cq, RecvCQ: c.cq, SendDepth: 4, RecvDepth: 2}); err != nil {
		return nil, err
	}
	if c.sbuf, err = pd.Register(make([]byte, ctrlBuf), gowarp.LocalWrite); err != nil {
		return nil, err
	}
	if c.rbuf, err = pd.Register(make([]byte, ctrlBuf), gowarp.LocalWrite); err != nil {
		return nil, err
	}
	if err := c.postRecv(); err != nil {
		return nil, err
	}
	co := o.Connect
	// perftest asks rdma_cm for no Reads on the control connection: MPA
	// IRD/ORD 0/0 (wire/testdata/siw/perftest-*.pcap).
	co.IRD, co.ORD = gowarp.NoReads, gowarp.NoReads
	if err := c.qp.Connect(ctx, o.Addr, co); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *control) postRecv() error {
	return c.qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: c.rbuf, Length: ctrlBuf}}})
}

// xchg Sends msg and returns the server's answer.
func (c *control) xchg(ctx context.Context, msg []byte) ([]byte, error) {
	copy(c.sbuf.Bytes(), msg)
	if err := c.qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpSend, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: c.sbuf, Length: len(msg)}}}); err != nil {
		return nil, err
	}
	*c.transcript = append(*c.transcript, Message{FromClient: true, Data: append([]byte(nil), msg...)})
	var answer []byte
	sent := false
	for answer == nil || !sent {
		n := c.cq.Poll(c.wc[:])
		if n == 0 {
			if err := c.cq.Wait(ctx); err != nil {
				return nil, err
			}
			continue
		}
		for _, w := range c.wc[:n] {
			if err := w.Err(); err != nil {
				if qerr := c.qp.Err(); qerr != nil {
					return nil, fmt.Errorf("%v completion: %w (%w)", w.Op, err, qerr)
				}
				return nil, fmt.Errorf("%v completion: %w", w.Op, err)
			}
			switch w.Op {
			case gowarp.CompSend:
				sent = true
			case gowarp.CompRecv:
				answer = append([]byte{}, c.rbuf.Bytes()[:w.Bytes]...)
			}
		}
	}
	*c.transcript = append(*c.transcript, Message{Data: answer})
	return answer, c.postRecv()
}

func (c *control) close() { c.qp.Close() }

// data is the data connection and its buffers.
type data struct {
	qp     *gowarp.QP
	cq     *gowarp.CQ
	buf    *gowarp.MR
	credit *gowarp.MR // send_bw: the server Writes its credit count here
	words  []uint32   // the credit buffer's memory
	qpn    uint32
}

func dialData(ctx context.Context, dev *gowarp.Device, pd *gowarp.PD, o Options, logf func(string, ...any)) (*data, error) {
	d := &data{cq: dev.NewCQ(2*o.TxDepth + 16), qpn: 0x100 + rand.Uint32N(0xff00)}
	var err error
	// perftest registers its buffer with every right (and adds remote
	// write to read_bw's for iWARP).
	if d.buf, err = pd.Register(make([]byte, o.Size), gowarp.LocalWrite|gowarp.RemoteRead|gowarp.RemoteWrite); err != nil {
		return nil, err
	}
	d.words = make([]uint32, 2)
	if d.credit, err = pd.Register(unsafe.Slice((*byte)(unsafe.Pointer(&d.words[0])), 8), gowarp.LocalWrite|gowarp.RemoteWrite); err != nil {
		return nil, err
	}
	co := o.Connect
	// As perftest: out_reads for read_bw, 0/0 otherwise (the captures).
	co.IRD, co.ORD = gowarp.NoReads, gowarp.NoReads
	if o.Test == ReadBW {
		co.IRD, co.ORD = MaxOutReads, MaxOutReads
	}
	var last error
	for try := range o.DataTries {
		if try > 0 {
			select {
			case <-time.After(o.DataGap):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: d.cq, RecvCQ: d.cq, SendDepth: o.TxDepth + 8, RecvDepth: 4})
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = qp.Connect(cctx, o.Addr, co)
		cancel()
		if err == nil {
			d.qp = qp
			logf("data connection up after %d tries", try+1)
			return d, nil
		}
		last = err
	}
	return nil, fmt.Errorf("%d tries: %w", o.DataTries, last)
}

func (d *data) close() { d.qp.Close() }

// credits returns the count the server last wrote into the credit
// buffer. The server's RDMA Write lands in this memory while the client
// runs; an aligned 32-bit load never sees half of a write on the
// platforms gowarp runs on, and the race detector is told to look away.
//
//go:norace
//go:noinline
func credits(p *uint32) uint32 { return *p }

// traffic runs the test: Iters work requests, TxDepth outstanding, each
// signaled, timed from post to completion as perftest does.
func (d *data) traffic(ctx context.Context, o *Options, srv *Dest, rep *Report) error {
	n := o.Iters
	tposted := make([]int64, n)
	tcompleted := make([]int64, n)
	t0 := time.Now()
	now := func() int64 { return int64(time.Since(t0)) }
	sge := []gowarp.SGE{{MR: d.buf, Length: o.Size}}
	wr := gowarp.SendWR{Flags: gowarp.Signaled, SGL: sge, RemoteAddr: srv.VAddr, RKey: srv.RKey}
	switch o.Test {
	case WriteBW:
		wr.Op = gowarp.OpWrite
	case ReadBW:
		wr.Op = gowarp.OpRead
	case SendBW:
		wr.Op = gowarp.OpSend
	}
	var wc [64]gowarp.Completion
	var credit uint32
	posted, completed := 0, 0
	for completed < n {
		blocked := false
		for posted < n && posted-completed < o.TxDepth {
			if o.Test == SendBW {
				if c := credits(&d.words[1]); c > credit && int(c) <= posted {
					credit = c
				}
				if posted-int(credit) >= o.RxDepth {
					blocked = true
					break
				}
			}
			wr.ID = uint64(posted)
			tposted[posted] = now()
			if err := d.qp.PostSend(&wr); err != nil {
				return fmt.Errorf("posting work request %d: %w", posted, err)
			}
			posted++
		}
		k := d.cq.Poll(wc[:])
		for _, w := range wc[:k] {
			if err := w.Err(); err != nil {
				if qerr := d.qp.Err(); qerr != nil {
					return fmt.Errorf("work request %d: %w (%w)", w.ID, err, qerr)
				}
				return fmt.Errorf("work request %d: %w", w.ID, err)
			}
			tcompleted[completed] = now()
			completed++
		}
		if k > 0 {
			continue
		}
		if blocked && posted == completed {
			// Waiting for credit: it comes as an RDMA Write, which makes
			// no completion here.
			if err := ctx.Err(); err != nil {
				return err
			}
			time.Sleep(20 * time.Microsecond)
			continue
		}
		if err := d.cq.Wait(ctx); err != nil {
			return err
		}
	}
	*rep = report(o.Size, tposted, tcompleted)
	return nil
}

// report computes perftest's figures: average bandwidth over the whole
// run, message rate, and peak bandwidth from the best
// (tcompleted[j]-tposted[i])/(j-i+1) over all i ≤ j (sampled for long
// runs).
func report(size int, tposted, tcompleted []int64) Report {
	n := len(tposted)
	r := Report{Size: uint64(size), Iters: uint64(n)}
	dt := float64(tcompleted[n-1]-tposted[0]) / 1e9
	if dt <= 0 {
		return r
	}
	const mb = 1 << 20
	r.BWAvg = float64(size) * float64(n) / dt / mb
	r.MsgRateMpps = float64(n) / dt / 1e6
	step := max(1, n/2048)
	best := float64(tcompleted[n-1] - tposted[0])
	for i := 0; i < n; i += step {
		for j := i; j < n; j += step {
			if t := float64(tcompleted[j]-tposted[i]) / float64(j-i+1); t > 0 && t < best {
				best = t
			}
		}
	}
	r.BWPeak = float64(size) / (best / 1e9) / mb
	return r
}
