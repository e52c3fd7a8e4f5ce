package gowarp_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestRandomWork drives queue pairs as careless applications would, with
// random work requests (some malformed: bad offsets and lengths, no
// region, wrong keys, unknown opcodes and flags, too many SGEs),
// Deregister of regions in use, Disconnect and Close in the middle, and
// servers that post Writes, Reads and Sends at the client's region and
// close on their own, over TCP and shared-memory links, CRC
// and extensions on or off. Whatever happens: no panic; every signaled
// work request PostSend took completes exactly once, within 10 s; no
// other completes with success, and none completes twice; every error
// matches one of the package's errors or statuses; and the goroutines
// end with the queue pairs.
func TestRandomWork(t *testing.T) {
	workers, rounds, ops := 8, 6, 200
	if testing.Short() {
		rounds = 2
	}
	g0 := runtime.NumGoroutine()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var servers sync.WaitGroup
	servers.Add(1)
	go func() {
		defer servers.Done()
		for seq := uint64(1); ; seq++ {
			req, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			servers.Add(1)
			go func() {
				defer servers.Done()
				randomServer(ctx, t, dev, pd, req, rand.New(rand.NewPCG(seq, 1)))
			}()
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 2))
			for range rounds {
				if !randomClient(ctx, t, dev, pd, ln.Addr().String(), r, ops) {
					return
				}
			}
		}()
	}
	wg.Wait()
	cancel()
	ln.Close()
	servers.Wait()
	// The process-wide watcher and clocks may have started meanwhile.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > g0+4 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > g0+4 {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before, %d after everything closed:\n%s", g0, n, buf[:runtime.Stack(buf, true)])
	}
}

// Work request IDs outside the client's checked range: the server's own
// work at the client, and the client's receives.
const (
	serverWork = 1 << 50
	clientRecv = 1 << 40
)

// randomServer accepts req and serves a region: it keeps receives
// posted, posts random Writes, Reads and Sends at the client's region,
// and closes the queue pair on its own now and then.
func randomServer(ctx context.Context, t *testing.T, dev *gowarp.Device, pd *gowarp.PD, req *gowarp.ConnRequest, r *rand.Rand) {
	cq := dev.NewCQ(256)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, RecvDepth: 64})
	if err != nil {
		t.Error(err)
		return
	}
	defer qp.Close()
	mr, err := pd.Register(make([]byte, 64<<10), gowarp.LocalWrite|gowarp.RemoteRead|gowarp.RemoteWrite|gowarp.RemoteAtomic)
	if err != nil {
		t.Error(err)
		return
	}
	defer mr.Deregister()
	recv := func(id uint64) {
		qp.PostRecv(&gowarp.RecvWR{ID: id, SGL: []gowarp.SGE{{MR: mr, Offset: r.IntN(32 << 10), Length: r.IntN(8 << 10)}}})
	}
	for i := range 64 {
		recv(uint64(i))
	}
	// The client's region, where this side posts work of its own.
	var caddr uint64
	var ckey uint32
	var csize int
	fmt.Sscanf(string(req.PrivateData()), "%d %d %d", &caddr, &ckey, &csize)
	pdata := fmt.Appendf(nil, "%d %d", mr.Addr(), mr.STag())
	if err := req.Accept(ctx, qp, gowarp.ConnectOptions{PrivateData: pdata, Extensions: true, SharedMemory: true}); err != nil {
		return
	}
	var wc [32]gowarp.Completion
	for {
		wctx, c := context.WithTimeout(ctx, time.Duration(1+r.IntN(100))*time.Millisecond)
		err := cq.Wait(wctx)
		c()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return // ctx: the test ends
		}
		if qp.State() != gowarp.StateReady && cq.Len() == 0 {
			return
		}
		for k := 0; k < 4 && csize > 0; k++ {
			n := r.IntN(min(8<<10, csize) + 1)
			wr := gowarp.SendWR{ID: serverWork, Op: gowarp.OpWrite, RKey: gowarp.STag(ckey),
				RemoteAddr: caddr + uint64(r.IntN(csize-n+1)),
				SGL:        []gowarp.SGE{{MR: mr, Offset: r.IntN(32 << 10), Length: n}}}
			switch r.IntN(6) {
			case 1, 2:
				wr.Op, wr.Flags = gowarp.OpRead, gowarp.Signaled
			case 3:
				wr.Op, wr.SGL[0].Length = gowarp.OpSend, min(n, 4096)
			}
			qp.PostSend(&wr) // whatever becomes of it, the client's checks hold
		}
		for n := cq.Poll(wc[:]); n > 0; n = cq.Poll(wc[:]) {
			for _, c := range wc[:n] {
				if c.ID != serverWork && c.Status == gowarp.Success {
					recv(c.ID)
				}
			}
		}
		if r.IntN(1000) == 0 {
			return
		}
	}
}

// randomClient connects, posts ops random work requests and checks what
// completes; it reports false after a failure that ends the test.
func randomClient(ctx context.Context, t *testing.T, dev *gowarp.Device, pd *gowarp.PD, addr string, r *rand.Rand, ops int) bool {
	cq := dev.NewCQ(512)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, SendDepth: 64})
	if err != nil {
		t.Error(err)
		return false
	}
	defer qp.Close()
	size := 8 + r.IntN(128<<10)
	mr, err := pd.Register(make([]byte, size), gowarp.LocalWrite|gowarp.RemoteWrite|gowarp.RemoteRead)
	if err != nil {
		t.Error(err)
		return false
	}
	defer mr.Deregister()
	rbuf, err := pd.Register(make([]byte, 8*4096), gowarp.LocalWrite)
	if err != nil {
		t.Error(err)
		return false
	}
	defer rbuf.Deregister()
	recv := func(id uint64) error {
		return qp.PostRecv(&gowarp.RecvWR{ID: id, SGL: []gowarp.SGE{{MR: rbuf, Offset: int(id-clientRecv) * 4096, Length: 4096}}})
	}
	for i := range uint64(8) {
		if err := recv(clientRecv + i); err != nil {
			t.Error(err)
			return false
		}
	}
	o := gowarp.ConnectOptions{CRC: r.IntN(2) == 0, Extensions: r.IntN(2) == 0, SharedMemory: r.IntN(2) == 0,
		PrivateData: fmt.Appendf(nil, "%d %d %d", mr.Addr(), mr.STag(), size)}
	cctx, c := context.WithTimeout(ctx, 10*time.Second)
	err = qp.Connect(cctx, addr, o)
	c()
	if err != nil {
		t.Errorf("Connect: %v", err)
		return false
	}
	var raddr uint64
	var rkey uint32
	if _, err := fmt.Sscanf(string(qp.PeerPrivateData()), "%d %d", &raddr, &rkey); err != nil {
		t.Errorf("private data %q: %v", qp.PeerPrivateData(), err)
		return false
	}
	bad := func(n int) bool { return r.IntN(n) == 0 } // malformed one time in n
	signaled, done := map[uint64]bool{}, map[uint64]bool{}
	outstanding := 0
	var wc [64]gowarp.Completion
	check := func(what string, err error) bool {
		if err != nil && !matchable(err) {
			t.Errorf("%s: %v (%T) matches none of the package's errors", what, err, err)
			return false
		}
		return true
	}
	poll := func(wait bool) bool {
		if wait {
			wctx, c := context.WithTimeout(ctx, 10*time.Second)
			err := cq.Wait(wctx)
			c()
			if errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("no completion in 10 s with %d signaled outstanding (%v, %v)", outstanding, qp.State(), qp.Err())
				return false
			}
			if err != nil && ctx.Err() == nil {
				// An overrun: Wait would return at once from now on.
				t.Errorf("waiting with %d signaled outstanding: %v", outstanding, err)
				return false
			}
		}
		for _, c := range wc[:cq.Poll(wc[:])] {
			if c.ID >= clientRecv {
				if !check("receive", c.Err()) {
					return false
				}
				if c.Status == gowarp.Success && !check("PostRecv", recv(c.ID)) {
					return false
				}
				continue
			}
			if done[c.ID] {
				t.Errorf("work request %d completed twice: %+v", c.ID, c)
				return false
			}
			done[c.ID] = true
			if !signaled[c.ID] && c.Status == gowarp.Success {
				t.Errorf("unsignaled work request %d completed: %+v", c.ID, c)
				return false
			}
			if signaled[c.ID] {
				outstanding--
			}
			if !check("completion", c.Err()) {
				return false
			}
		}
		return true
	}
	for id := uint64(1); id <= uint64(ops); id++ {
		wr := gowarp.SendWR{ID: id, RemoteAddr: raddr, RKey: gowarp.STag(rkey)}
		off, n := r.IntN(size), r.IntN(16<<10)
		switch k := r.IntN(8); {
		case k < 3:
			wr.Op = gowarp.OpWrite
		case k < 6:
			wr.Op = gowarp.OpRead
		case k == 6:
			wr.Op, n = gowarp.OpSend, r.IntN(4<<10)
		default:
			wr.Op = gowarp.OpWriteImm
		}
		n = min(n, size-off)
		if bad(4) {
			wr.Op, off, n = gowarp.OpFetchAdd, (size-8)&^7, 8
		}
		if r.IntN(4) != 0 {
			wr.Flags |= gowarp.Signaled
		}
		wr.SGL = []gowarp.SGE{{MR: mr, Offset: off, Length: n}}
		switch {
		case bad(100):
			wr.Op = gowarp.WROp(r.IntN(40))
		case bad(100):
			wr.Flags |= gowarp.WRFlags(1 << r.IntN(8))
		case bad(100):
			wr.SGL[0].Offset, wr.SGL[0].Length = r.IntN(2*size)-size/2, r.IntN(1<<20)-100
		case bad(100):
			wr.SGL[0].MR = nil
		case bad(100):
			wr.RKey ^= gowarp.STag(1 + r.IntN(1<<20))
		case bad(100):
			wr.RemoteAddr += uint64(r.IntN(1 << 17))
		case bad(100):
			wr.SGL = make([]gowarp.SGE, 1+r.IntN(12))
			for k := range wr.SGL {
				wr.SGL[k] = gowarp.SGE{MR: mr, Offset: r.IntN(size), Length: r.IntN(64)}
			}
		case bad(100):
			wr.Op, wr.SGL[0].Length = gowarp.OpSend, 8<<10+r.IntN(8<<10) // longer than any receive
		}
		if err := qp.PostSend(&wr); err != nil {
			if !check("PostSend", err) {
				return false
			}
			if errors.Is(err, gowarp.ErrQueueFull) && !poll(outstanding > 0) {
				return false
			}
		} else if wr.Flags&gowarp.Signaled != 0 {
			signaled[id] = true
			outstanding++
		}
		if !poll(false) {
			return false
		}
		switch r.IntN(200) {
		case 0:
			check("Close", qp.Close())
		case 1:
			check("Deregister", mr.Deregister())
		case 2:
			dctx, c := context.WithTimeout(ctx, 5*time.Second)
			check("Disconnect", qp.Disconnect(dctx))
			c()
		}
	}
	for outstanding > 0 {
		if !poll(true) {
			return false
		}
	}
	return true
}

// matchable reports whether err matches one of the package's errors or a
// completion status.
func matchable(err error) bool {
	var st gowarp.Status
	if errors.As(err, &st) {
		return true
	}
	for _, e := range []error{
		gowarp.ErrNotReady, gowarp.ErrQueueFull, gowarp.ErrTooManySGE, gowarp.ErrBadOp,
		gowarp.ErrZeroORD, gowarp.ErrNotSupported, gowarp.ErrBadAtomic, gowarp.ErrTooLong,
		gowarp.ErrLocalAccess, gowarp.ErrPeerTerminated, gowarp.ErrTerminated,
		gowarp.ErrPeerClosed, gowarp.ErrClosed, gowarp.ErrLinkLost, gowarp.ErrLinkTimeout,
		gowarp.ErrCQOverrun, gowarp.ErrBadState, gowarp.ErrBadConfig, gowarp.ErrRegionBusy,
		gowarp.ErrNotRegistered, gowarp.ErrRegionInvalid, gowarp.ErrOutOfBounds,
		gowarp.ErrReleased, context.DeadlineExceeded, context.Canceled,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// TestOverlappingWork: a Write whose payload is the very memory a Read in
// flight at the same time lands in is the application's race, which RDMA
// leaves to it, as a NIC's reads and writes of the memory are; the link's
// own copies of it stay out of the race detector's sight over shared
// memory as over TCP (under -race a shared-memory link's copy into its
// ring was reported against the Read's placement, in TestRandomWork).
func TestOverlappingWork(t *testing.T) {
	const size = 32 << 10
	for _, o := range []gowarp.ConnectOptions{{}, {SharedMemory: true}} {
		p := newPair(t, o)
		local, _ := p.reg(t, size, gowarp.LocalWrite)
		remote, _ := p.reg(t, size, gowarp.RemoteWrite|gowarp.RemoteRead)
		sge := []gowarp.SGE{{MR: local, Length: size}}
		for i := range 100 {
			for k := range 8 {
				op := []gowarp.WROp{gowarp.OpRead, gowarp.OpWrite}[k%2]
				wr := gowarp.SendWR{ID: uint64(i), Op: op, Flags: gowarp.Signaled, SGL: sge, RemoteAddr: remote.Addr(), RKey: remote.STag()}
				if err := p.a.PostSend(&wr); err != nil {
					t.Fatal(err)
				}
			}
			for range 8 {
				if c := wait(t, p.acq); c.Status != gowarp.Success {
					t.Fatalf("%v: completion %+v", p.a.Transport(), c)
				}
			}
		}
	}
}
