package rpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

var quiet = slog.New(slog.DiscardHandler)

// pair starts a server with the test methods and dials a session to it.
func pair(t testing.TB, o Options) (*Server, *Client, string) {
	t.Helper()
	o.Logger = quiet
	dev := gowarp.Open(gowarp.WithLogger(quiet))
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(dev, o)
	registerTest(srv)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ctx, ln)
	}()
	cl, err := Dial(context.Background(), dev, ln.Addr().String(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.Close()
		cancel()
		ln.Close()
		<-served
		srv.Close()
	})
	return srv, cl, ln.Addr().String()
}

func registerTest(srv *Server) {
	srv.RegisterFunc("echo", func(ctx context.Context, arg []byte) ([]byte, error) { return arg, nil })
	srv.RegisterNonBlocking("echo.fast", func(ctx context.Context, c *ServerCall) error { return c.Reply(c.Arg()) })
	srv.RegisterFunc("fail", func(ctx context.Context, arg []byte) ([]byte, error) {
		return nil, fmt.Errorf("no luck with %q", arg)
	})
	srv.Register("big", func(ctx context.Context, c *ServerCall) error { return c.Reply(make([]byte, 1<<20)) })
	srv.Register("panic", func(ctx context.Context, c *ServerCall) error { panic("boom") })
	// wait blocks until its context ends and says why.
	srv.Register("wait", func(ctx context.Context, c *ServerCall) error {
		<-ctx.Done()
		return ctx.Err()
	})
	// sum adds every byte of reference 0, reading in 4 KiB steps of the
	// fraction (in percent) the argument's first byte says.
	srv.Register("sum", func(ctx context.Context, c *ServerCall) error {
		r, err := c.Ref(0)
		if err != nil {
			return err
		}
		pct := int64(100)
		if len(c.Arg()) > 0 {
			pct = int64(c.Arg()[0])
		}
		end := r.Len() * pct / 100
		var buf [4096]byte
		var sum uint64
		for off := int64(0); off < end; {
			n, err := r.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
			for _, b := range buf[:n] {
				sum += uint64(b)
			}
			off += int64(n)
			if err != nil && err != io.EOF {
				return err
			}
		}
		return c.Reply(fmt.Appendf(nil, "%d", sum))
	})
	// upper writes reference 0's bytes, upper-cased, into reference 1.
	srv.Register("upper", func(ctx context.Context, c *ServerCall) error {
		in, err := c.Ref(0)
		if err != nil {
			return err
		}
		out, err := c.Ref(1)
		if err != nil {
			return err
		}
		b := make([]byte, in.Len())
		if _, err := in.ReadAt(b, 0); err != nil {
			return err
		}
		if _, err := out.WriteAt(bytes.ToUpper(b), 0); err != nil {
			return err
		}
		return nil
	})
	// churn reads reference 0 and writes it in 16 KiB steps, round and
	// round, until its context ends.
	srv.Register("churn", func(ctx context.Context, c *ServerCall) error {
		r, err := c.Ref(0)
		if err != nil {
			return err
		}
		buf := make([]byte, 16<<10)
		for off := int64(0); ctx.Err() == nil; off = (off + int64(len(buf))) % r.Len() {
			n, err := r.ReadAt(buf, off)
			if err != nil && err != io.EOF {
				return err
			}
			if _, err := r.WriteAt(buf[:n], off); err != nil {
				return err
			}
		}
		return ctx.Err()
	})
	// keep remembers its reference for "later" to use after the call.
	srv.Register("keep", func(ctx context.Context, c *ServerCall) error {
		r, err := c.Ref(0)
		if err != nil {
			return err
		}
		kept.Lock()
		kept.ref, kept.h = r, r.Handle()
		kept.Unlock()
		return nil
	})
	srv.Register("later", func(ctx context.Context, c *ServerCall) error {
		kept.Lock()
		r, h := kept.ref, kept.h
		kept.Unlock()
		var b [1]byte
		if _, err := r.ReadAt(b[:], 0); err == nil {
			return errors.New("a reference of an ended call still reads")
		} else if !errors.Is(err, ErrHandleExpired) {
			return fmt.Errorf("stale Ref: %w", err)
		}
		_, err := c.Open(h)
		return err
	})
	// open opens the handle in its argument.
	srv.Register("open", func(ctx context.Context, c *ServerCall) error {
		h, _, err := ParseHandle(c.Arg())
		if err != nil {
			return err
		}
		r, err := c.Open(h)
		if err != nil {
			return err
		}
		var b [8]byte
		n, err := r.ReadAt(b[:], 0)
		if err != nil && err != io.EOF {
			return err
		}
		return c.Reply(b[:n])
	})
}

var kept struct {
	sync.Mutex
	ref *Ref
	h   Handle
}

func TestEcho(t *testing.T) {
	_, cl, _ := pair(t, Options{})
	for _, m := range []string{"echo", "echo.fast"} {
		var reply []byte
		for i := range 100 {
			arg := fmt.Appendf(nil, "call %d", i)
			var err error
			reply, err = cl.Call(context.Background(), m, arg, reply)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(reply, arg) {
				t.Fatalf("%s: reply %q, want %q", m, reply, arg)
			}
		}
	}
}

func TestRemoteErrors(t *testing.T) {
	_, cl, _ := pair(t, Options{})
	ctx := context.Background()
	_, err := cl.Call(ctx, "fail", []byte("x"), nil)
	var re *Error
	if !errors.As(err, &re) || !errors.Is(err, ErrApplication) || re.Msg != `no luck with "x"` {
		t.Fatalf("fail: %v", err)
	}
	if _, err := cl.Call(ctx, "nope", nil, nil); !errors.Is(err, ErrUnknownMethod) {
		t.Fatalf("unknown method: %v", err)
	}
	if _, err := cl.Call(ctx, "panic", nil, nil); !errors.Is(err, ErrInternal) {
		t.Fatalf("panic: %v", err)
	}
	if _, err := cl.Call(ctx, "echo", make([]byte, 8192), nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("large by value: %v", err)
	}
	if _, err := cl.Call(ctx, "big", nil, nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("reply larger than a message: %v", err)
	}
	// The session goes on.
	if r, err := cl.Call(ctx, "echo", []byte("ok"), nil); err != nil || string(r) != "ok" {
		t.Fatalf("after errors: %q %v", r, err)
	}
}

func TestRefReadWrite(t *testing.T) {
	srv, cl, _ := pair(t, Options{})
	ctx := context.Background()
	const size = 1 << 20
	in, err := cl.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Free()
	var want uint64
	for i := range in.Bytes() {
		in.Bytes()[i] = byte(i * 7)
		want += uint64(byte(i * 7))
	}
	for _, pct := range []byte{1, 10, 100} {
		before := srv.Stats().ReadBytes
		cl2 := Call{Method: "sum", Arg: []byte{pct}, Refs: []Span{in.All()}}
		if err := cl.Do(ctx, &cl2); err != nil {
			t.Fatal(err)
		}
		var w uint64
		for _, b := range in.Bytes()[:size*int(pct)/100] {
			w += uint64(b)
		}
		if string(cl2.Reply) != fmt.Sprint(w) {
			t.Fatalf("%d %%: sum %s, want %d", pct, cl2.Reply, w)
		}
		moved := srv.Stats().ReadBytes - before
		touched := uint64(size) * uint64(pct) / 100
		if moved < touched || moved > touched+fetchChunk*2 {
			t.Fatalf("%d %%: fetched %d bytes to read %d", pct, moved, touched)
		}
	}
	_ = want

	src, _ := cl.Alloc(100000)
	dst, _ := cl.Alloc(100000)
	for i := range src.Bytes() {
		src.Bytes()[i] = 'a' + byte(i%26)
	}
	if err := cl.Do(ctx, &Call{Method: "upper", Refs: []Span{src.All(), dst.All().Writable()}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.Bytes(), bytes.ToUpper(src.Bytes())) {
		t.Fatal("written result differs")
	}
	// Without the right to write, the server cannot.
	if err := cl.Do(ctx, &Call{Method: "upper", Refs: []Span{src.All(), dst.All()}}); !errors.Is(err, ErrApplication) || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("write to a read-only span: %v", err)
	}
}

// TestHeapAtFirstAlloc: a client's session heap is made at its first
// Alloc, so clients that pass everything by value hold none: 8 clients
// Dialed with the default 16 MiB heaps (and their server sessions, in
// this process too) grew the Go heap by about 21 MiB, where each had made
// its own heap at Dial (about 150 MiB).
func TestHeapAtFirstAlloc(t *testing.T) {
	_, cl, addr := pair(t, Options{})
	if cl.heap.mem != nil {
		t.Fatal("the heap was made at Dial")
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var cls []*Client
	for range 8 {
		c, err := Dial(context.Background(), gowarp.Open(gowarp.WithLogger(quiet)), addr, Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		cls = append(cls, c)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	for _, c := range cls {
		defer c.Close()
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 4*16<<20 {
		t.Errorf("8 clients that lent nothing grew the heap by %d MiB", grew>>20)
	}
	b, err := cl.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if len(cl.heap.mem) != 16<<20 || len(b.Bytes()) != 100 {
		t.Errorf("after Alloc: heap of %d bytes, buffer of %d", len(cl.heap.mem), len(b.Bytes()))
	}
}

// TestAllocHeapFull: a heap with no room says so with ErrHeapFull, a
// size no heap can hold (math.MaxInt, whose rounding would overflow)
// among them, and a Free makes room again.
func TestAllocHeapFull(t *testing.T) {
	_, cl, _ := pair(t, Options{HeapSize: 1 << 20})
	for _, n := range []int{1<<20 + 1, math.MaxInt, math.MaxInt - 10} {
		if b, err := cl.Alloc(n); !errors.Is(err, ErrHeapFull) {
			t.Fatalf("Alloc(%d) of a 1 MiB heap: %v, %v", n, b, err)
		}
	}
	a, err := cl.Alloc(1<<20 - 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Alloc(100); !errors.Is(err, ErrHeapFull) {
		t.Fatalf("Alloc past a full heap: %v", err)
	}
	a.Free()
	b, err := cl.Alloc(1 << 20)
	if err != nil {
		t.Fatalf("Alloc of the whole heap after Free: %v", err)
	}
	if len(b.Bytes()) != 1<<20 {
		t.Fatalf("buffer of %d bytes", len(b.Bytes()))
	}
}

// TestSpanBounds: Span takes any range inside its buffer and panics on
// one outside it, one whose end overflows an int among them (which
// passed the check before and panicked later, in the call).
func TestSpanBounds(t *testing.T) {
	_, cl, _ := pair(t, Options{})
	b, err := cl.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off, n int
		ok     bool
	}{
		{0, 100, true}, {100, 0, true}, {40, 60, true}, {0, 0, true},
		{-1, 10, false}, {0, -1, false}, {0, 101, false}, {101, 0, false}, {1, math.MaxInt, false}, {math.MaxInt, 1, false},
	} {
		func() {
			defer func() {
				if r := recover(); (r == nil) != c.ok {
					t.Errorf("Span(%d, %d): panic %v", c.off, c.n, r)
				}
			}()
			if sp := b.Span(c.off, c.n); sp.Len() != c.n {
				t.Errorf("Span(%d, %d).Len() = %d", c.off, c.n, sp.Len())
			}
		}()
	}
}

func TestRefAfterCall(t *testing.T) {
	srv, cl, _ := pair(t, Options{})
	ctx := context.Background()
	b, _ := cl.Alloc(64)
	if err := cl.Do(ctx, &Call{Method: "keep", Refs: []Span{b.All()}}); err != nil {
		t.Fatal(err)
	}
	reads := srv.Stats().Reads
	err := cl.Do(ctx, &Call{Method: "later"})
	if !errors.Is(err, ErrBadHandle) || !bytes.Contains([]byte(err.Error()), []byte("has ended")) {
		t.Fatalf("handle after its call: %v", err)
	}
	if srv.Stats().Reads != reads {
		t.Fatal("a stale handle was read")
	}
}

func TestForgedHandle(t *testing.T) {
	srv, cl, _ := pair(t, Options{})
	ctx := context.Background()
	b, _ := cl.Alloc(64)
	copy(b.Bytes(), "secret")
	reads := srv.Stats().Reads
	for _, h := range []Handle{
		{STag: 1, Addr: 0, Len: 8, Session: cl.Session() + 1},          // another session
		{STag: 1, Addr: 0, Len: 8, Session: cl.Session(), Call: 12345}, // no such call
	} {
		err := cl.Do(ctx, &Call{Method: "open", Arg: AppendHandle(nil, h)})
		if !errors.Is(err, ErrBadHandle) {
			t.Fatalf("forged %+v: %v", h, err)
		}
	}
	// A handle lent to one call, opened by another call of the session
	// while the first is still running, is refused too: it was granted to
	// that call only, and the server checks the grant.
	if srv.Stats().Reads != reads {
		t.Fatal("a forged handle was read")
	}
	if r, err := cl.Call(ctx, "echo", []byte("still here"), nil); err != nil || string(r) != "still here" {
		t.Fatalf("after forged handles: %q %v", r, err)
	}
}

func TestDeadline(t *testing.T) {
	srv, cl, _ := pair(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := cl.Call(ctx, "wait", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call past its deadline: %v", err)
	}
	// The server's handler saw the deadline (carried in the call) or the
	// cancel, and the slot came back: calls go on.
	for range 3 * defaultSlots {
		if _, err := cl.Call(context.Background(), "echo", []byte("x"), nil); err != nil {
			t.Fatal(err)
		}
	}
	_ = srv
}

func TestCancel(t *testing.T) {
	_, cl, _ := pair(t, Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	ctxs := make([]context.CancelFunc, 8)
	for i := range ctxs {
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[i] = cancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := cl.Call(ctx, "wait", nil, nil) // no deadline: only the cancel ends it
			errs <- err
		}()
	}
	// Let the calls reach the server, then cancel them.
	for cl.freeSlots() > defaultSlots-len(ctxs) {
		time.Sleep(time.Millisecond)
	}
	for _, c := range ctxs {
		c()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled call: %v", err)
		}
	}
	// The server's handlers were told (their slots come back only when
	// they reply), so the slots all come back.
	for cl.freeSlots() < defaultSlots {
		time.Sleep(time.Millisecond)
	}
	if _, err := cl.Call(context.Background(), "echo", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
}

func (c *Client) freeSlots() int { return len(c.free) }

// TestCancelMidTransfer gives up on calls while the server reads and
// writes their spans without pause: each fails with its context's error
// and nothing else does; the session carries on (the server's accesses in
// flight when the span left its reach must not end it), and the slots all
// come back.
func TestCancelMidTransfer(t *testing.T) {
	_, cl, _ := pair(t, Options{})
	b, err := cl.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- cl.Do(ctx, &Call{Method: "churn", Refs: []Span{b.All().Writable()}}) }()
		time.Sleep(time.Duration(1+i%4) * time.Millisecond)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: the call given up on: %v", i, err)
		}
		if _, err := cl.Call(context.Background(), "echo", []byte("x"), nil); err != nil {
			t.Fatalf("round %d: a call after: %v", i, err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); cl.freeSlots() < defaultSlots; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d slots came back", cl.freeSlots(), defaultSlots)
		}
		time.Sleep(time.Millisecond)
	}
	if err := cl.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentCalls(t *testing.T) {
	_, cl, _ := pair(t, Options{Slots: 16})
	var wg sync.WaitGroup
	const workers, calls = 64, 200
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var reply []byte
			method := "echo"
			if w%2 == 1 {
				method = "echo.fast"
			}
			for i := range calls {
				arg := fmt.Appendf(nil, "%d/%d", w, i)
				var err error
				if reply, err = cl.Call(context.Background(), method, arg, reply); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(reply, arg) {
					errs <- fmt.Errorf("reply %q to %q", reply, arg)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestServerClosedMidCall(t *testing.T) {
	srv, cl, _ := pair(t, Options{})
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Call(context.Background(), "wait", nil, nil)
		errc <- err
	}()
	for cl.freeSlots() == defaultSlots {
		time.Sleep(time.Millisecond)
	}
	srv.Close()
	if err := <-errc; !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("call when the server closed: %v", err)
	}
	if _, err := cl.Call(context.Background(), "echo", nil, nil); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("call after: %v", err)
	}
}

// TestCancelBehindQueuedCall cancels a call while it still waits in the
// combiner behind another poster, the race TestCancel catches only
// sometimes: a cancel that overtook its call reached the server before
// the call, the handler never heard of it and the slot never came back.
func TestCancelBehindQueuedCall(t *testing.T) {
	_, cl, _ := pair(t, Options{})
	release := make(chan struct{})
	unhold := sync.OnceFunc(func() { close(release) })
	defer unhold() // a failing test lets the held poster go
	var held atomic.Bool
	cl.sends.mu.Lock()
	cl.sends.postList = func(wrs []gowarp.SendWR) (int, error) {
		if held.CompareAndSwap(false, true) {
			<-release // the first poster stays in its system call
		}
		return cl.qp.PostSendList(wrs)
	}
	cl.sends.mu.Unlock()
	queued := func() int {
		cl.sends.mu.Lock()
		defer cl.sends.mu.Unlock()
		return len(cl.sends.q)
	}
	ctxA, cancelA := context.WithCancel(context.Background())
	errA := make(chan error, 1)
	go func() { _, err := cl.Call(ctxA, "wait", nil, nil); errA <- err }()
	for !held.Load() {
		time.Sleep(time.Millisecond)
	}
	ctxB, cancelB := context.WithCancel(context.Background())
	errB := make(chan error, 1)
	go func() { _, err := cl.Call(ctxB, "wait", nil, nil); errB <- err }()
	for queued() == 0 { // B's call waits behind A's poster
		time.Sleep(time.Millisecond)
	}
	cancelB()
	if err := <-errB; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled call B: %v", err)
	}
	if n := queued(); n != 2 {
		t.Fatalf("%d work requests queued, want B's call and its cancel", n)
	}
	unhold()
	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled call A: %v", err)
	}
	// Both handlers hear of their cancels and reply, so the slots come back.
	for cl.freeSlots() < defaultSlots {
		time.Sleep(time.Millisecond)
	}
}

// TestGiveUpAsReplyComes: callers whose deadlines pass as the server's
// handlers time out give up just as their replies come. A reply freed
// the slot before the caller that gave up had sent its cancel and
// revoked its windows, so it canceled the slot's next call and
// deregistered that call's windows (-race saw revoke against the next
// caller's lend). Every call must end by its own deadline.
func TestGiveUpAsReplyComes(t *testing.T) {
	_, cl, _ := pair(t, Options{Slots: 4})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(200+i%7*50)*time.Microsecond)
				_, err := cl.Call(ctx, "wait", nil, nil)
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("call with a deadline: %v", err)
	}
	for cl.freeSlots() < 4 {
		time.Sleep(time.Millisecond)
	}
}

// TestClosedSessionsFreeRegions: a session deregisters its buffers as it
// closes, on both sides: the STag tables are as empty after 20 sessions
// (each with a call by reference) as before.
func TestClosedSessionsFreeRegions(t *testing.T) {
	_, _, addr := pair(t, Options{})
	cdev := gowarp.Open(gowarp.WithLogger(quiet))
	for k := range 20 {
		cl, err := Dial(context.Background(), cdev, addr, Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := cl.Alloc(64 << 10)
		if err := cl.Do(context.Background(), &Call{Method: "sum", Refs: []Span{b.All()}}); err != nil {
			t.Fatalf("session %d: %v", k, err)
		}
		cl.Close()
	}
	if n := cdev.DefaultTable().Len(); n != 0 {
		t.Fatalf("%d regions left registered by 20 closed sessions", n)
	}
}
