package perf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// logBuffer collects a server's log for inspection; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// sessionLog records the buffers of ended server sessions.
type sessionLog struct {
	mu   sync.Mutex
	ends []sessionEnd
	ch   chan struct{}
}

type sessionEnd struct {
	test Test
	size int
	buf  []byte
}

func newSessionLog() *sessionLog { return &sessionLog{ch: make(chan struct{}, 100)} }

func (s *sessionLog) done(t Test, size int, buf []byte) {
	s.mu.Lock()
	s.ends = append(s.ends, sessionEnd{t, size, buf})
	s.mu.Unlock()
	s.ch <- struct{}{}
}

// wait waits for n more sessions to end and returns the last one.
func (s *sessionLog) wait(t *testing.T, n int) sessionEnd {
	t.Helper()
	for range n {
		select {
		case <-s.ch:
		case <-time.After(10 * time.Second):
			t.Fatal("server session did not end")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ends[len(s.ends)-1]
}

// startLoopback starts a loopback server whose log goes to the returned buffer.
func startLoopback(t *testing.T, srv *Server) (*Loopback, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	srv.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	lb, err := StartLoopback(srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lb.Close(); err != nil {
			t.Errorf("server: %v", err)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", logs)
		}
	})
	return lb, logs
}

func checkSane(t *testing.T, r Result, test Test, size, iters int) {
	t.Helper()
	if r.Test != test || r.Size != size || r.Iters != iters {
		t.Errorf("result %v %d B %d iterations, want %v %d B %d", r.Test, r.Size, r.Iters, test, size, iters)
	}
	if r.Elapsed <= 0 {
		t.Errorf("elapsed %v", r.Elapsed)
	}
	if test.Bandwidth() {
		if !(r.MBps > 0 && r.Mpps > 0) {
			t.Errorf("bandwidth %v MB/s, %v Mpps", r.MBps, r.Mpps)
		}
		if want := r.Mpps * float64(size); abs(r.MBps-want) > 1e-6*want {
			t.Errorf("%v MB/s is not %v Mpps × %d B", r.MBps, r.Mpps, size)
		}
		return
	}
	if !(0 < r.LatMin && r.LatMin <= r.LatP50 && r.LatP50 <= r.LatP99 && r.LatMin <= r.LatAvg) {
		t.Errorf("latencies out of order: min %v avg %v p50 %v p99 %v", r.LatMin, r.LatAvg, r.LatP50, r.LatP99)
	}
}

func abs(x float64) float64 { return max(x, -x) }

// TestEveryTestRunsInLoopback runs each test briefly under several
// connection settings and checks that the results are sane.
func TestEveryTestRunsInLoopback(t *testing.T) {
	settings := []struct {
		name string
		c    ConnOptions
	}{
		{"default", ConnOptions{}},
		{"crc-rev1-acked", ConnOptions{CRC: true, MPARevision: 1, Completion: gowarp.Acked}},
		{"async-fpdu-poll", ConnOptions{AsyncOnly: true, MaxFPDU: 1000, Poll: true}},
	}
	lb, _ := startLoopback(t, &Server{})
	for _, s := range settings {
		for _, test := range AllTests() {
			if test.TCP() && s.name != "default" {
				continue
			}
			t.Run(s.name+"/"+test.String(), func(t *testing.T) {
				iters, size := 50, 3000
				if test.Bandwidth() {
					iters = 300
				}
				r, err := lb.Client.Run(context.Background(), test, Options{ConnOptions: s.c, Size: size, Depth: 16, Iters: iters})
				if err != nil {
					t.Fatal(err)
				}
				checkSane(t, r, test, size, iters)
			})
		}
	}
}

func TestDurationBoundsARun(t *testing.T) {
	lb, _ := startLoopback(t, &Server{})
	for _, test := range []Test{WriteBW, WriteLat} {
		start := time.Now()
		r, err := lb.Client.Run(context.Background(), test, Options{Size: 64, Duration: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 2*time.Second || r.Iters == 0 {
			t.Errorf("%v: a 50ms run took %v and ran %d iterations", test, d, r.Iters)
		}
	}
}

// TestDataArrives checks the buffers at the end of runs: what the client
// wrote or sent is in the server's buffer, what it read is in its own.
func TestDataArrives(t *testing.T) {
	const size = 100003 // several FPDUs, an odd tail
	clientPattern, serverPattern := make([]byte, size), make([]byte, size)
	pattern(clientPattern, clientSeed)
	pattern(serverPattern, serverSeed)
	sessions := newSessionLog()
	lb, _ := startLoopback(t, &Server{sessionDone: sessions.done})
	var mu sync.Mutex
	var clientBuf []byte
	lb.Client.runDone = func(_ Test, buf []byte) {
		mu.Lock()
		clientBuf = buf
		mu.Unlock()
	}
	for _, tc := range []struct {
		test           Test
		server, client []byte // the buffers' expected contents
	}{
		{WriteBW, clientPattern, clientPattern},
		{ReadBW, serverPattern, serverPattern},
		{SendBW, clientPattern, clientPattern},
		{WriteLat, clientPattern, clientPattern},
		{ReadLat, serverPattern, serverPattern},
		{SendLat, clientPattern, clientPattern},
	} {
		t.Run(tc.test.String(), func(t *testing.T) {
			for _, crc := range []bool{false, true} {
				_, err := lb.Client.Run(context.Background(), tc.test, Options{ConnOptions: ConnOptions{CRC: crc}, Size: size, Depth: 4, Iters: 7})
				if err != nil {
					t.Fatal(err)
				}
				end := sessions.wait(t, 1)
				if end.test != tc.test || end.size != size {
					t.Fatalf("server session %v %d", end.test, end.size)
				}
				if i := firstDiff(end.buf, tc.server); i >= 0 {
					t.Errorf("crc %v: server buffer differs from the expected at byte %d", crc, i)
				}
				mu.Lock()
				if i := firstDiff(clientBuf, tc.client); i >= 0 {
					t.Errorf("crc %v: client buffer differs from the expected at byte %d", crc, i)
				}
				mu.Unlock()
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestServerSurvivesBadClients serves two good clients at once while
// others send garbage, connect with bad private data, or vanish midway;
// the server then still serves a good client, and freed every session.
func TestServerSurvivesBadClients(t *testing.T) {
	sessions := newSessionLog()
	lb, logs := startLoopback(t, &Server{sessionDone: sessions.done})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addr := lb.Addr
	dev := gowarp.Open()

	var wg sync.WaitGroup
	errs := make(chan error, 16)
	good := func(test Test, size int) {
		wg.Go(func() {
			c := &Client{Addr: addr}
			r, err := c.Run(ctx, test, Options{Size: size, Depth: 8, Iters: 400})
			if err == nil && r.Iters != 400 {
				err = fmt.Errorf("%v ran %d iterations", test, r.Iters)
			}
			if err != nil {
				errs <- fmt.Errorf("good client: %w", err)
			}
		})
	}
	good(WriteBW, 8192)
	good(SendLat, 32)

	// Garbage private data: refused, with the reason.
	wg.Go(func() {
		err := connectRaw(ctx, dev, addr, []byte("hello, server"), nil)
		if !errors.Is(err, gowarp.ErrRejected) {
			errs <- fmt.Errorf("garbage private data: got %v, want a rejection", err)
			return
		}
		var rej *gowarp.RejectedError
		if errors.As(err, &rej) && !strings.Contains(rejectionReason(rej.PrivateData), "malformed control message") {
			errs <- fmt.Errorf("rejection reason %q", rejectionReason(rej.PrivateData))
		}
	})
	// A valid header asking for too much.
	wg.Go(func() {
		req := request{test: ReadBW, size: MaxSize + 1, depth: 1}
		err := connectRaw(ctx, dev, addr, req.append(nil), nil)
		if !errors.Is(err, gowarp.ErrRejected) {
			errs <- fmt.Errorf("oversized request: got %v, want a rejection", err)
		}
	})
	// Not MPA at all, on both ports.
	for _, a := range []string{addr, lb.Client.TCPAddr} {
		wg.Go(func() {
			c, err := net.Dial("tcp", a)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.Write(bytes.Repeat([]byte("garbage!"), 100))
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			c.Read(make([]byte, 100)) // the server hangs up (or refuses)
		})
	}
	// Clients that vanish in the middle of a run, with work in flight.
	for _, test := range []Test{ReadBW, WriteBW, SendBW, WriteLat, SendLat} {
		wg.Go(func() {
			if err := vanishMidway(ctx, dev, addr, test); err != nil {
				errs <- fmt.Errorf("%v client vanishing midway: %w", test, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// 2 good sessions, 5 vanished ones; the refused ones never started.
	sessions.wait(t, 7)

	// The server still serves.
	r, err := (&Client{Addr: addr}).Run(ctx, ReadLat, Options{Size: 16, Iters: 20})
	if err != nil {
		t.Fatalf("server no longer serves: %v", err)
	}
	checkSane(t, r, ReadLat, 16, 20)
	sessions.wait(t, 1)
	if s := logs.String(); strings.Contains(s, `msg="perf: session failed"`) {
		t.Errorf("a session failed for another reason than its client leaving:\n%s", s)
	}
}

// connectRaw connects a queue pair with the given private data, posts
// work (if any) and returns the connection error.
func connectRaw(ctx context.Context, dev *gowarp.Device, addr string, pd []byte, work func(*gowarp.QP, *gowarp.MR, reply) error) error {
	cq := dev.NewCQ(1024)
	qp, err := dev.AllocPD().NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, SendDepth: 256})
	if err != nil {
		return err
	}
	defer qp.Close()
	if err := qp.Connect(ctx, addr, gowarp.ConnectOptions{PrivateData: pd, IRD: maxIRDORD, ORD: maxIRDORD}); err != nil {
		return err
	}
	if work == nil {
		return errors.New("connected")
	}
	rep, err := parseReply(qp.PeerPrivateData())
	if err != nil {
		return err
	}
	return work(qp, nil, rep)
}

// vanishMidway starts a run of test by hand, puts work in flight and
// closes the queue pair without a word.
func vanishMidway(ctx context.Context, dev *gowarp.Device, addr string, test Test) error {
	const size = 1 << 20
	pd := dev.AllocPD()
	buf := make([]byte, size)
	mr, err := pd.Register(buf, gowarp.LocalWrite|gowarp.RemoteWrite|gowarp.RemoteRead)
	if err != nil {
		return err
	}
	cq := dev.NewCQ(1024)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, SendDepth: 256})
	if err != nil {
		return err
	}
	defer qp.Close()
	req := request{test: test, size: size, depth: 64, bufSTag: uint32(mr.STag()), bufAddr: mr.Addr(), bufLen: size,
		creditSTag: uint32(mr.STag()), creditAddr: mr.Addr()}
	if err := qp.Connect(ctx, addr, gowarp.ConnectOptions{PrivateData: req.append(nil), IRD: maxIRDORD, ORD: maxIRDORD}); err != nil {
		return err
	}
	rep, err := parseReply(qp.PeerPrivateData())
	if err != nil {
		return err
	}
	wr := gowarp.SendWR{SGL: []gowarp.SGE{{MR: mr, Length: size}}, RemoteAddr: rep.bufAddr, RKey: gowarp.STag(rep.bufSTag)}
	switch test {
	case ReadBW:
		wr.Op = gowarp.OpRead
	case SendBW, SendLat:
		wr.Op = gowarp.OpSend
	default:
		wr.Op = gowarp.OpWrite
	}
	// The client keeps the protocol while it lasts: send_lat answers each
	// Send with one of the same size, which needs a receive here, and no
	// Send may find the server without a receive (it has recvDepth).
	// Otherwise either side rightly sends a Terminate, and a post after it
	// fails: the test would race with its own protocol error.
	sends := 20
	if test == SendBW || test == SendLat {
		sends = min(sends, int(rep.recvDepth))
	}
	if test == SendLat {
		for i := range sends {
			if err := qp.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: mr, Length: size}}}); err != nil {
				return err
			}
		}
	}
	for range sends {
		if err := qp.PostSend(&wr); err != nil {
			return err
		}
	}
	// Let some of it arrive, then leave in the middle.
	time.Sleep(2 * time.Millisecond)
	qp.Close()
	return mr.Deregister()
}

// TestSilentClientDelaysNobody: a connection that never sends its MPA
// request holds one acceptor until the MPA timeout, not the server.
func TestSilentClientDelaysNobody(t *testing.T) {
	lb, _ := startLoopback(t, &Server{})
	for range acceptors - 1 {
		c, err := net.Dial("tcp", lb.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	start := time.Now()
	if _, err := lb.Client.Run(context.Background(), ReadLat, Options{Size: 8, Iters: 10}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a client behind %d silent ones took %v", acceptors-1, d)
	}
}

// TestServerGoneSaysWhy: a run whose server goes away ends with the
// reason (the peer closed, the link broke), not a bare "work request
// flushed", which is all a flushed completion's status says.
func TestServerGoneSaysWhy(t *testing.T) {
	for _, test := range []Test{WriteBW, SendLat} {
		lb, err := StartLoopback(&Server{})
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := lb.Client.Run(context.Background(), test, Options{Size: 4096, Duration: 20 * time.Second})
			errc <- err
		}()
		time.Sleep(300 * time.Millisecond)
		lb.Close()
		select {
		case err := <-errc:
			if !errors.Is(err, gowarp.ErrPeerClosed) && !errors.Is(err, gowarp.ErrLinkLost) && !errors.Is(err, gowarp.ErrPeerTerminated) {
				t.Errorf("%v with its server gone: %v, want the queue pair's reason", test, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%v: the run went on after its server was gone", test)
		}
	}
}
