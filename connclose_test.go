package gowarp_test

import (
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// closeRig is a device with a listener whose every connection request is
// accepted on a fresh queue pair, for tests that close queue pairs while
// they connect.
type closeRig struct {
	dev *gowarp.Device
	pd  *gowarp.PD
	cq  *gowarp.CQ
	ln  *gowarp.Listener
}

func newCloseRig(t *testing.T) *closeRig {
	t.Helper()
	r := &closeRig{dev: gowarp.Open()}
	r.pd = r.dev.AllocPD()
	r.cq = r.dev.NewCQ(1 << 16)
	var err error
	if r.ln, err = r.dev.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *closeRig) qp(t *testing.T) *gowarp.QP {
	t.Helper()
	qp, err := r.pd.NewQP(gowarp.QPConfig{SendCQ: r.cq, RecvCQ: r.cq, SendDepth: 4, RecvDepth: 4})
	if err != nil {
		t.Fatal(err)
	}
	return qp
}

// closedOK: a Connect or Accept that a Close overtook fails with ErrClosed;
// one that won the race succeeded. The first wrong error is reported, the
// rest counted, and the test carries on to look for races and leaks.
func closedOK(t *testing.T, bad *int, what string, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, gowarp.ErrClosed) {
		if *bad == 0 {
			t.Errorf("%s closed while connecting: %v, want nil or ErrClosed", what, err)
		}
		*bad++
	}
}

// settle waits for the goroutine count to fall back to base: a queue pair
// closed while connecting must leave nothing running.
func settle(t *testing.T, base int) {
	t.Helper()
	for range 500 {
		if runtime.NumGoroutine() <= base {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	t.Fatalf("%d goroutines left running, had %d:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
}

// spin delays a Close by a varying while (0 to 2 ms), so that over the
// iterations it lands in every step of connection setup.
func spin(i int) {
	if i%2 == 0 {
		for range i % 64 {
			runtime.Gosched()
		}
		return
	}
	time.Sleep(time.Duration(i) * 10 * time.Microsecond)
}

// TestCloseDuringAccept: a server closes its queue pair from another
// goroutine while accepting a connection on it. Accept must succeed or
// fail with ErrClosed, Close must return, and nothing may keep running.
// Before the fix the race detector reported Close against Start (the
// WaitGroup and the link) and an Accept overtaken in its MPA exchange
// failed with a bare state error.
func TestCloseDuringAccept(t *testing.T) {
	base := runtime.NumGoroutine()
	r := newCloseRig(t)
	ctx := boundedCtx(t)
	bad := 0
	for i := range 200 {
		cli, srv := r.qp(t), r.qp(t)
		cerr := make(chan error, 1)
		go func() { cerr <- cli.Connect(ctx, r.ln.Addr().String(), gowarp.ConnectOptions{}) }()
		req, err := r.ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		aerr := make(chan error, 1)
		go func() { aerr <- req.Accept(ctx, srv, gowarp.ConnectOptions{}) }()
		spin(i)
		srv.Close()
		closedOK(t, &bad, "Accept", <-aerr)
		cli.Close()
		<-cerr // it may fail in any way: its peer went
	}
	r.ln.Close()
	if bad > 0 {
		t.Errorf("%d of 200 Accepts failed with another error", bad)
	}
	settle(t, base)
}

// TestCloseDuringConnect: a client closes its queue pair from another
// goroutine while Connect is in flight, against a gowarp listener and
// against a peer that never answers the MPA request (Connect waited for
// the reply's 10 s timeout, then failed with a timeout, not ErrClosed).
func TestCloseDuringConnect(t *testing.T) {
	base := runtime.NumGoroutine()
	r := newCloseRig(t)
	ctx := boundedCtx(t)
	bad := 0
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the server side: accept whatever comes
		defer wg.Done()
		for {
			req, err := r.ln.Accept(ctx)
			if err != nil {
				return
			}
			srv := r.qp(t)
			req.Accept(ctx, srv, gowarp.ConnectOptions{})
			srv.Close()
		}
	}()
	for i := range 200 {
		cli := r.qp(t)
		cerr := make(chan error, 1)
		go func() { cerr <- cli.Connect(ctx, r.ln.Addr().String(), gowarp.ConnectOptions{}) }()
		spin(i)
		cli.Close()
		closedOK(t, &bad, "Connect", <-cerr)
	}
	r.ln.Close()
	wg.Wait()
	if bad > 0 {
		t.Errorf("%d of 200 Connects failed with another error", bad)
	}

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	conns := make(chan net.Conn, 1)
	go func() {
		c, err := silent.Accept()
		if err == nil {
			conns <- c
		}
	}()
	cli := r.qp(t)
	cerr := make(chan error, 1)
	go func() { cerr <- cli.Connect(ctx, silent.Addr().String(), gowarp.ConnectOptions{}) }()
	c := <-conns
	defer c.Close()
	for cli.State() != gowarp.StateConnecting {
		runtime.Gosched()
	}
	cli.Close()
	if err := <-cerr; !errors.Is(err, gowarp.ErrClosed) {
		t.Errorf("Connect to a silent peer, closed: %v, want ErrClosed", err)
	}
	// The socket is closed: the peer reads at most the MPA request, then
	// EOF.
	if b, err := io.ReadAll(c); err != nil || len(b) > 1<<10 {
		t.Fatalf("peer read %d bytes, %v; want the request at most, then EOF", len(b), err)
	}
	settle(t, base)
}

// TestConnectAcceptAfterClose: Connect and Accept on a queue pair already
// closed fail at once with ErrClosed.
func TestConnectAcceptAfterClose(t *testing.T) {
	r := newCloseRig(t)
	defer r.ln.Close()
	ctx := boundedCtx(t)
	qp := r.qp(t)
	qp.Close()
	if err := qp.Connect(ctx, r.ln.Addr().String(), gowarp.ConnectOptions{}); !errors.Is(err, gowarp.ErrClosed) || !errors.Is(err, gowarp.ErrBadState) {
		t.Errorf("Connect after Close: %v, want ErrClosed and ErrBadState", err)
	}
	cli := r.qp(t)
	defer cli.Close()
	cerr := make(chan error, 1)
	go func() { cerr <- cli.Connect(ctx, r.ln.Addr().String(), gowarp.ConnectOptions{}) }()
	req, err := r.ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.Accept(ctx, qp, gowarp.ConnectOptions{}); !errors.Is(err, gowarp.ErrClosed) || !errors.Is(err, gowarp.ErrBadState) {
		t.Errorf("Accept after Close: %v, want ErrClosed and ErrBadState", err)
	}
	// The request is still the caller's to answer.
	req.Reject(nil)
	if err := <-cerr; err == nil {
		t.Error("Connect succeeded against a rejecting peer")
	}
}
