package perftest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/pcapstream"
	"github.com/gowarp/gowarp/wire"
)

// captured is the control connection of a capture of siw's perftest
// client talking to siw's perftest server: the Send payloads each side
// sent, in order.
type captured struct {
	client, server [][]byte
	// The IRD/ORD of the MPA request and reply of the control [0] and
	// data [1] connections.
	req, rep [2]wire.MPAFrame
}

func sends(t *testing.T, b []byte) [][]byte {
	t.Helper()
	_, n, err := wire.ParseMPAFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	b = b[n:]
	var out [][]byte
	for len(b) > 0 {
		f, n, err := wire.ParseFPDU(b, false)
		if err != nil {
			t.Fatal(err)
		}
		h, hn, err := wire.ParseHeader(f.ULPDU)
		if err != nil {
			t.Fatal(err)
		}
		if h.Opcode != wire.OpSend || !h.Last {
			t.Fatalf("control connection carries %v", h.Opcode)
		}
		out = append(out, f.ULPDU[hn:])
		b = b[n:]
	}
	return out
}

func loadCapture(t *testing.T, test Test) captured {
	t.Helper()
	conns, err := pcapstream.ReadFile(filepath.Join("..", "..", "wire", "testdata", "siw", "perftest-"+string(test)+".pcap"))
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 2 {
		t.Fatalf("%d connections in the capture, want control and data", len(conns))
	}
	c := captured{client: sends(t, conns[0].Initiator), server: sends(t, conns[0].Responder)}
	for i := range 2 {
		if c.req[i], _, err = wire.ParseMPAFrame(conns[i].Initiator); err != nil {
			t.Fatal(err)
		}
		if c.rep[i], _, err = wire.ParseMPAFrame(conns[i].Responder); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// answer checks that a connection request asks for the IRD/ORD siw's
// perftest client asked for on connection i, and returns the options that
// reply with what siw's server replied.
func (c *captured) answer(req *gowarp.ConnRequest, i int) (gowarp.ConnectOptions, error) {
	ird, ord, ok := req.ReadLimits()
	if want := c.req[i]; !ok || ird != int(want.IRD) || ord != int(want.ORD) {
		return gowarp.ConnectOptions{}, fmt.Errorf("connection %d asks for IRD/ORD %d/%d (rev 2: %v); perftest asks %d/%d", i, ird, ord, ok, want.IRD, want.ORD)
	}
	limit := func(v uint16) int {
		if v == 0 {
			return gowarp.NoReads
		}
		return int(v)
	}
	return gowarp.ConnectOptions{IRD: limit(c.rep[i].IRD), ORD: limit(c.rep[i].ORD)}, nil
}

// The captures are of ib_*_bw -R -F -n 5 -s 4096.
const capSize, capIters = 4096, 5

// checkClientMsg compares the client's i-th control message with the one
// siw's perftest client sent. Byte for byte, except what is the client's
// own: its queue pair number, PSN, buffer key and address, GID (and the
// padding perftest leaves uninitialised), and the measured figures.
func checkClientMsg(test Test, i int, got, want []byte) error {
	if len(got) != len(want) {
		return fmt.Errorf("message %d: %d bytes, siw's client sent %d (% x)", i, len(got), len(want), want)
	}
	switch {
	case len(want) == DestLen && bytes.Equal(want, make([]byte, DestLen)):
		if !bytes.Equal(got, want) {
			return fmt.Errorf("message %d: % x, want an all-zero pingpong_dest", i, got)
		}
	case len(want) == DestLen:
		g, _ := ParseDest(got)
		w, _ := ParseDest(want)
		if g.LID != w.LID || g.OutReads != w.OutReads || g.SRQN != w.SRQN || g.GIDIndex != w.GIDIndex {
			return fmt.Errorf("message %d: pingpong_dest %+v; siw's client sent %+v", i, g, w)
		}
		if g.RKey == 0 || g.VAddr == 0 || g.PSN>>24 != 0 || !bytes.Equal(got[20:24], make([]byte, 4)) {
			return fmt.Errorf("message %d: pingpong_dest %+v (padding % x)", i, g, got[20:24])
		}
	case len(want) == 8 && i >= 12: // bw_peak, bw_avg, msgRate_avg
		f := math.Float64frombits(binary.BigEndian.Uint64(got))
		if math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
			return fmt.Errorf("message %d: report figure %v", i, f)
		}
	default: // version, cycle buffer, cache line, MTU, report size and iterations
		if !bytes.Equal(got, want) {
			return fmt.Errorf("message %d: % x, siw's client sent % x", i, got, want)
		}
	}
	return nil
}

// fakeServer plays siw's perftest server from the capture: it answers the
// client's control messages with the server's captured ones (its
// pingpong_dest pointing at a real buffer here) and serves the data
// connection the way perftest's server does.
type fakeServer struct {
	test Test
	cap  captured
	dev  *gowarp.Device
	ln   *gowarp.Listener

	clientDest chan Dest
	done       chan struct{} // the control exchange is over
	placed     uint64        // bytes the client wrote (write_bw)
	received   int           // Sends received (send_bw)
	credits    []uint32
}

func (f *fakeServer) run(ctx context.Context) error {
	pd := f.dev.AllocPD()
	req, err := f.ln.Accept(ctx)
	if err != nil {
		return err
	}
	cq := f.dev.NewCQ(16)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err
	}
	defer qp.Close()
	rbuf, _ := pd.Register(make([]byte, 4096), gowarp.LocalWrite)
	sbuf, _ := pd.Register(make([]byte, 4096), 0)
	post := func() error {
		return qp.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: rbuf, Length: 4096}}})
	}
	if err := post(); err != nil {
		return err
	}
	co, err := f.cap.answer(req, 0)
	if err != nil {
		req.Reject(nil)
		return err
	}
	if err := req.Accept(ctx, qp, co); err != nil {
		return err
	}
	buf, _ := pd.Register(bytes.Repeat([]byte("perftest"), capSize/8), gowarp.LocalWrite|gowarp.RemoteRead|gowarp.RemoteWrite)
	dataErr := make(chan error, 1)
	go func() { dataErr <- f.data(ctx, pd, buf) }()

	var wc [4]gowarp.Completion
	for i, want := range f.cap.client {
		var got []byte
		for got == nil {
			n := cq.Poll(wc[:])
			if n == 0 {
				if err := cq.Wait(ctx); err != nil {
					return fmt.Errorf("waiting for message %d: %w", i, err)
				}
				continue
			}
			for _, w := range wc[:n] {
				if err := w.Err(); err != nil {
					return fmt.Errorf("message %d: %v (%v)", i, err, qp.Err())
				}
				if w.Op == gowarp.CompRecv {
					got = append([]byte{}, rbuf.Bytes()[:w.Bytes]...)
				}
			}
		}
		if err := checkClientMsg(f.test, i, got, want); err != nil {
			return err
		}
		if err := post(); err != nil {
			return err
		}
		answer := append([]byte{}, f.cap.server[i]...)
		if len(answer) == DestLen && !bytes.Equal(answer, make([]byte, DestLen)) {
			d, _ := ParseDest(answer)
			d.RKey, d.VAddr = uint32(buf.STag()), buf.Addr()
			answer = d.Append(nil)
			if i == 6 {
				cd, _ := ParseDest(got)
				f.clientDest <- cd
			}
		}
		copy(sbuf.Bytes(), answer)
		if err := qp.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: sbuf, Length: len(answer)}}}); err != nil {
			return err
		}
	}
	if f.test == WriteBW {
		// The Writes come on the data connection, which the control
		// exchange does not wait for (a Write completes at the client once
		// handed to TCP): wait, boundedly, for them to be placed. A Write
		// that never lands still fails the test.
		for deadline := time.Now().Add(5 * time.Second); buf.Placed() < capSize*capIters && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		f.placed = buf.Placed()
	}
	time.Sleep(10 * time.Millisecond) // let the last answer leave
	close(f.done)
	if err := <-dataErr; err != nil {
		return fmt.Errorf("data connection: %w", err)
	}
	return nil // and close, before the client, as perftest's server does
}

// data serves the data connection: for send_bw it posts a receive per
// message and grants credits with RDMA Writes of the receive count, every
// rx_depth/3 receives, as perftest's run_iter_bw_server does.
func (f *fakeServer) data(ctx context.Context, pd *gowarp.PD, buf *gowarp.MR) error {
	req, err := f.ln.Accept(ctx)
	if err != nil {
		return err
	}
	cq := f.dev.NewCQ(64)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, RecvDepth: capIters})
	if err != nil {
		return err
	}
	defer qp.Close()
	if f.test == SendBW {
		for range capIters {
			if err := qp.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: buf, Length: capSize}}}); err != nil {
				return err
			}
		}
	}
	co, err := f.cap.answer(req, 1)
	if err != nil {
		req.Reject(nil)
		return err
	}
	if err := req.Accept(ctx, qp, co); err != nil {
		return err
	}
	cd := <-f.clientDest
	if f.test != SendBW {
		<-f.done // the client's Writes and Reads need nothing from here
		return nil
	}
	ctrl := make([]byte, 4)
	cmr, _ := pd.Register(ctrl, 0)
	const creditCnt = 2 // rx_depth 6 / 3, as in the capture
	var wc [8]gowarp.Completion
	for f.received < capIters {
		if err := cq.Wait(ctx); err != nil {
			return err
		}
		n := cq.Poll(wc[:])
		for _, w := range wc[:n] {
			if err := w.Err(); err != nil {
				return fmt.Errorf("%v: %v (%v)", w.Op, err, qp.Err())
			}
			if w.Op != gowarp.CompRecv {
				continue
			}
			if w.Bytes != capSize {
				return fmt.Errorf("Send of %d bytes, want %d", w.Bytes, capSize)
			}
			f.received++
			if f.received%creditCnt == 0 {
				binary.LittleEndian.PutUint32(ctrl, uint32(f.received))
				f.credits = append(f.credits, uint32(f.received))
				if err := qp.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: cmr, Length: 4}},
					RemoteAddr: cd.VAddr, RKey: gowarp.STag(cd.RKey)}); err != nil {
					return err
				}
			}
		}
	}
	<-f.done
	return nil
}

// listen opens a device listening on loopback for a test, closed when the
// test ends, and a context that ends after 20 s, so that a peer that goes
// quiet fails the test instead of hanging it.
func listen(t *testing.T) (context.Context, *gowarp.Device, *gowarp.Listener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	dev := gowarp.Open()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ctx, dev, ln
}

// TestAgainstCapture runs the client against a server that answers with
// what siw's perftest server sent in the captures and checks every control
// message the client sends against what siw's perftest client sent.
func TestAgainstCapture(t *testing.T) {
	for _, test := range []Test{WriteBW, ReadBW, SendBW} {
		t.Run(string(test), func(t *testing.T) {
			cp := loadCapture(t, test)
			if len(cp.client) != len(cp.server) {
				t.Fatalf("capture: %d client and %d server messages", len(cp.client), len(cp.server))
			}
			ctx, dev, ln := listen(t)
			f := &fakeServer{test: test, cap: cp, dev: dev, ln: ln, clientDest: make(chan Dest, 1), done: make(chan struct{})}
			sctx, scancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			var serr error
			wg.Add(1)
			go func() { defer wg.Done(); serr = f.run(sctx) }()
			r, err := Run(ctx, gowarp.Open(), Options{Test: test, Addr: ln.Addr().String(), Size: capSize, Iters: capIters,
				Connect: gowarp.ConnectOptions{NoP2P: true}, DataGap: 10 * time.Millisecond})
			time.Sleep(20 * time.Millisecond)
			scancel()
			wg.Wait()
			if serr != nil && sctx.Err() == nil {
				t.Fatalf("server: %v", serr)
			}
			if err != nil {
				t.Fatalf("client: %v (server: %v)", err, serr)
			}
			if serr != nil {
				t.Logf("server ended with %v", serr)
			}
			if n := 2 * len(cp.client); len(r.Transcript) != n {
				t.Errorf("transcript of %d messages, want %d", len(r.Transcript), n)
			}
			if r.PeerVersion != "6.06" {
				t.Errorf("server version %q", r.PeerVersion)
			}
			if r.Local.Size != capSize || r.Local.Iters != capIters || r.Local.BWAvg <= 0 || r.Local.BWPeak < r.Local.BWAvg*(1-1e-9) {
				t.Errorf("local report %+v", r.Local)
			}
			switch test {
			case WriteBW:
				if f.placed != capSize*capIters {
					t.Errorf("server buffer took %d bytes of Writes, want %d", f.placed, capSize*capIters)
				}
			case SendBW:
				if f.received != capIters || len(f.credits) != 2 {
					t.Errorf("server received %d Sends and granted credits %v", f.received, f.credits)
				}
			}
			if test != SendBW && r.Remote.Plausible(capSize) {
				t.Errorf("the captured server's report %+v passes as plausible; it is uninitialised memory", r.Remote)
			}
		})
	}
}

func TestDestRoundTrip(t *testing.T) {
	cp := loadCapture(t, WriteBW)
	raw := cp.client[6]
	d, err := ParseDest(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := Dest{OutReads: 1, QPN: 3, PSN: 0x1393b4, RKey: 0xe6b42600, VAddr: 0x55d817e2e000,
		GID: [16]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}}
	if d != want {
		t.Fatalf("ParseDest = %+v, want %+v", d, want)
	}
	if got := d.Append(nil); !bytes.Equal(got, raw) {
		t.Fatalf("Append = % x, want % x", got, raw)
	}
}

func TestReportFigures(t *testing.T) {
	// siw's write_bw client sent these for 5 × 4096 B; its server printed
	// "4096 5 29.36 12.75 0.003264".
	cp := loadCapture(t, WriteBW)
	var m [5][]byte
	copy(m[:], cp.client[10:15])
	r, err := parseReport(m)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Line(false); got != " 4096       5                29.36              12.75  \t\t   0.003264" {
		t.Errorf("Line() = %q", got)
	}
	if !r.Plausible(4096) {
		t.Errorf("%+v not plausible", r)
	}
	back := r.reportMsgs()
	for i := range m {
		if !bytes.Equal(back[i], m[i]) {
			t.Errorf("report field %d re-encodes as % x, captured % x", i, back[i], m[i])
		}
	}
	// report() on a steady run: 10 messages of 1 MiB, 1 ms apart.
	tp, tc := make([]int64, 10), make([]int64, 10)
	for i := range tp {
		tp[i] = int64(i) * 1e6
		tc[i] = tp[i] + 1e6
	}
	got := report(1<<20, tp, tc, mib)
	if math.Abs(got.BWAvg-1000) > 1e-6 || math.Abs(got.BWPeak-1000) > 1e-6 || math.Abs(got.MsgRateMpps-0.001) > 1e-9 {
		t.Errorf("report = %+v, want 1000 MB/s average and peak, 0.001 Mpps", got)
	}
}
