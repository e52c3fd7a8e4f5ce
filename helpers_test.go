package gowarp_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// Test helpers shared by the package's tests: connected pairs of queue
// pairs, waiting for completions and states.

// pair is two connected queue pairs over loopback, each with its own CQ.
type pair struct {
	dev      *gowarp.Device
	pd       *gowarp.PD
	a, b     *gowarp.QP
	acq, bcq *gowarp.CQ
	alloc    bool // reg uses PD.Alloc
}

// newIdlePair makes two unconnected queue pairs a and b, each with a CQ of
// the given depth, in one protection domain.
func newIdlePair(t testing.TB, cqDepth int) *pair {
	t.Helper()
	return newIdlePairMode(t, cqDepth, gowarp.Handed, false)
}

// newIdlePairMode is newIdlePair with both QPs completing in mode m, and
// reg taking PD.Alloc memory if alloc.
func newIdlePairMode(t testing.TB, cqDepth int, m gowarp.CompletionMode, alloc bool) *pair {
	t.Helper()
	p := &pair{dev: gowarp.Open(), alloc: alloc}
	p.pd = p.dev.AllocPD()
	p.acq, p.bcq = p.dev.NewCQ(cqDepth), p.dev.NewCQ(cqDepth)
	var err error
	if p.a, err = p.pd.NewQP(gowarp.QPConfig{SendCQ: p.acq, RecvCQ: p.acq, Completion: m}); err != nil {
		t.Fatal(err)
	}
	if p.b, err = p.pd.NewQP(gowarp.QPConfig{SendCQ: p.bcq, RecvCQ: p.bcq, Completion: m}); err != nil {
		t.Fatal(err)
	}
	return p
}

func newPair(t testing.TB, o gowarp.ConnectOptions) *pair {
	t.Helper()
	return newPairOn(t, o, "127.0.0.1:0", nil, nil)
}

// newPairOn connects two QPs; the listener is made on listenAddr inside
// inA and the connection dialled inside inB (nil: the current namespace).
func newPairOn(t testing.TB, o gowarp.ConnectOptions, listenAddr string, inA, inB func(func() error) error) *pair {
	t.Helper()
	p := newIdlePair(t, 1024)
	// Before connecting: a connect that fails may have started one side.
	t.Cleanup(func() { closeBounded(t, p.a, p.b) })
	p.connectOn(t, o, o, listenAddr, inA, inB)
	return p
}

// boundedCtx is a context for a test's waits that ends with the test or
// after a minute, whichever comes first: a wake-up lost in the code under
// test then fails the wait with a deadline rather than hanging the
// package until go test's timeout.
func boundedCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// closeBounded closes the queue pairs, failing the test with every
// goroutine's stack if that takes over 30 s (Close waits for the queue
// pair's goroutines), rather than hanging the package.
func closeBounded(t testing.TB, qps ...*gowarp.QP) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, qp := range qps {
			qp.Close()
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		buf := make([]byte, 1<<20)
		t.Errorf("Close still waiting after 30 s:\n%s", buf[:runtime.Stack(buf, true)])
	}
}

func (p *pair) reg(t testing.TB, n int, acc gowarp.Access) (*gowarp.MR, []byte) {
	t.Helper()
	if p.alloc {
		mr, err := p.pd.Alloc(n, acc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mr.Deregister() })
		return mr, mr.Bytes()
	}
	buf := make([]byte, n)
	mr, err := p.pd.Register(buf, acc)
	if err != nil {
		t.Fatal(err)
	}
	return mr, buf
}

func wait(t testing.TB, cq *gowarp.CQ) gowarp.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]gowarp.Completion
	for {
		if cq.Poll(wc[:]) == 1 {
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
	}
}

// newPairOpts connects two QPs with different options on each side.
func newPairOpts(t testing.TB, client, server gowarp.ConnectOptions) *pair {
	t.Helper()
	p := &pair{dev: gowarp.Open()}
	p.pd = p.dev.AllocPD()
	p.acq, p.bcq = p.dev.NewCQ(64), p.dev.NewCQ(64)
	p.a, _ = p.pd.NewQP(gowarp.QPConfig{SendCQ: p.acq, RecvCQ: p.acq})
	p.b, _ = p.pd.NewQP(gowarp.QPConfig{SendCQ: p.bcq, RecvCQ: p.bcq})
	t.Cleanup(func() { p.a.Close(); p.b.Close() })
	p.connect(t, client, server)
	return p
}

// server is a gowarp listener whose accepted QPs the test can inspect.
type server struct {
	dev  *gowarp.Device
	pd   *gowarp.PD
	ln   *gowarp.Listener
	cq   *gowarp.CQ
	qps  chan *gowarp.QP
	opts gowarp.ConnectOptions
}

func newServer(t testing.TB, o gowarp.ConnectOptions) *server {
	t.Helper()
	s := &server{dev: gowarp.Open(), qps: make(chan *gowarp.QP, 16), opts: o}
	s.pd = s.dev.AllocPD()
	s.cq = s.dev.NewCQ(4096)
	var err error
	if s.ln, err = s.dev.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); s.ln.Close() })
	go func() {
		for {
			req, err := s.ln.Accept(ctx)
			if err != nil {
				return
			}
			qp, err := s.pd.NewQP(gowarp.QPConfig{SendCQ: s.cq, RecvCQ: s.cq, SendDepth: 16, RecvDepth: 16})
			if err != nil {
				t.Error(err)
				return
			}
			if err := req.Accept(ctx, qp, s.opts); err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(func() { qp.Close() })
			s.qps <- qp
		}
	}()
	return s
}

// nextQP takes the next queue pair acceptLoop accepted, failing the test
// if none comes within 10 s (the loop's Accept failed after the client's
// Connect succeeded, say) rather than hanging it.
func nextQP(t testing.TB, qps <-chan *gowarp.QP) *gowarp.QP {
	t.Helper()
	select {
	case qp := <-qps:
		return qp
	case <-time.After(10 * time.Second):
		t.Fatal("no queue pair accepted in 10 s")
		return nil
	}
}

func (s *server) accepted(t testing.TB) *gowarp.QP {
	t.Helper()
	return nextQP(t, s.qps)
}

func waitState(t testing.TB, qp *gowarp.QP, want gowarp.State) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); qp.State() != want; {
		if time.Now().After(deadline) {
			t.Fatalf("QP state %v, want %v", qp.State(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// connect connects the pair's idle QPs over loopback: a with client's
// options, b accepting with server's.
func (p *pair) connect(t testing.TB, client, server gowarp.ConnectOptions) {
	t.Helper()
	p.connectOn(t, client, server, "127.0.0.1:0", nil, nil)
}

// connectOn is connect with the listener made on listenAddr inside inA
// and the connection dialled inside inB (nil: the current namespace).
func (p *pair) connectOn(t testing.TB, client, server gowarp.ConnectOptions, listenAddr string, inA, inB func(func() error) error) {
	t.Helper()
	if inA == nil {
		inA = func(f func() error) error { return f() }
	}
	if inB == nil {
		inB = inA
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ln *gowarp.Listener
	err := inA(func() (err error) {
		ln, err = p.dev.Listen(listenAddr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err == nil {
			err = req.Accept(ctx, p.b, server)
		}
		errc <- err
	}()
	if err := inB(func() error { return p.a.Connect(ctx, ln.Addr().String(), client) }); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// waitFor waits up to a minute for cond.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: still not so after a minute", what)
		}
	}
}

func testSessionConfig() gowarp.SessionConfig {
	return gowarp.SessionConfig{HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: 500 * time.Millisecond,
		Deadline: 30 * time.Second, MaxMessage: 4096}
}
