package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// rawSession is a hand-made client: a QP that says hello and sends
// whatever a test wants.
type rawSession struct {
	pd    *gowarp.PD
	qp    *gowarp.QP
	cq    *gowarp.CQ
	buf   []byte
	mr    *gowarp.MR
	hello hello
}

func dialRaw(t *testing.T, addr string) *rawSession {
	t.Helper()
	dev := gowarp.Open(gowarp.WithLogger(quiet))
	pd := dev.AllocPD()
	r := &rawSession{pd: pd, cq: dev.NewCQ(64), buf: make([]byte, 2*defaultMsg)}
	var err error
	if r.qp, err = pd.NewQP(gowarp.QPConfig{SendCQ: r.cq, RecvCQ: r.cq}); err != nil {
		t.Fatal(err)
	}
	if r.mr, err = pd.Register(r.buf, gowarp.LocalWrite); err != nil {
		t.Fatal(err)
	}
	r.qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: r.mr, Offset: defaultMsg, Length: defaultMsg}}})
	hi := hello{Slots: 4, MaxMessage: defaultMsg}.append(nil)
	if err := r.qp.Connect(context.Background(), addr, gowarp.ConnectOptions{PrivateData: hi}); err != nil {
		t.Fatal(err)
	}
	if r.hello, err = parseHello(r.qp.PeerPrivateData()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.qp.Close() })
	return r
}

// send sends msg and returns the reply, or the error that ended the
// session.
func (r *rawSession) send(t *testing.T, msg []byte) (replyMsg, error) {
	t.Helper()
	n := copy(r.buf, msg)
	if err := r.qp.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: r.mr, Length: n}}}); err != nil {
		return replyMsg{}, err
	}
	var wc [4]gowarp.Completion
	for {
		if err := r.cq.Wait(context.Background()); err != nil {
			return replyMsg{}, err
		}
		for _, c := range wc[:r.cq.Poll(wc[:])] {
			if err := c.Err(); err != nil {
				return replyMsg{}, err
			}
			if c.Op == gowarp.CompRecv {
				return parseReply(r.buf[defaultMsg : defaultMsg+c.Bytes])
			}
		}
	}
}

// TestMalformedCalls: a call the server cannot decode is answered with
// ErrMalformed's status when it names a free slot, and ends only its own
// session when it does not; others are served on.
func TestMalformedCalls(t *testing.T) {
	srv, cl, addr := pair(t, Options{})
	_ = srv
	// A call whose lengths do not add up, in slot 1.
	bad := appendCallHeader(nil, 1<<16|1, 0, "echo", nil, 10) // says 10 bytes of argument, has none
	r := dialRaw(t, addr)
	rep, err := r.send(t, bad)
	if err != nil || rep.Status != statusBadCall || rep.ID != 1<<16|1 {
		t.Fatalf("malformed call: %+v %v", rep, err)
	}
	// A handle granted to another session is refused before any Read.
	reads := srv.Stats().Reads
	h := Handle{STag: 0x100, Addr: 0, Len: 10, Session: r.hello.Session + 2, Call: 2<<16 | 1}
	r.qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: r.mr, Offset: defaultMsg, Length: defaultMsg}}})
	rep, err = r.send(t, appendCallHeader(nil, 2<<16|1, 0, "sum", []Handle{h}, 0))
	if err != nil || rep.Status != statusBadHandle {
		t.Fatalf("foreign handle: %+v %v", rep, err)
	}
	if srv.Stats().Reads != reads {
		t.Fatal("the server read through a foreign handle")
	}
	// Garbage with no slot to answer in ends that session only.
	r2 := dialRaw(t, addr)
	if rep, err := r2.send(t, []byte{9, 9, 9}); err == nil {
		t.Fatalf("garbage answered: %+v", rep)
	}
	// A slot beyond the session's ends it too.
	r3 := dialRaw(t, addr)
	if rep, err := r3.send(t, appendCallHeader(nil, 1<<16|999, 0, "echo", nil, 0)); err == nil {
		t.Fatalf("call in slot 999 answered: %+v", rep)
	}
	if got, err := cl.Call(context.Background(), "echo", []byte("fine"), nil); err != nil || string(got) != "fine" {
		t.Fatalf("another session after: %q %v", got, err)
	}
}

// TestHandleBeyondWindow: a client that lies about a handle's length
// gets its own session terminated by its own engine when the server's
// Read goes past the window it registered; nothing beyond is read, and
// the server serves others on.
func TestHandleBeyondWindow(t *testing.T) {
	srv, cl, addr := pair(t, Options{})
	r := dialRaw(t, addr)
	mem := make([]byte, 1<<20)
	copy(mem[16:], "beyond the window")
	win, err := r.pd.Register(mem[:16], gowarp.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	read := srv.Stats().ReadBytes
	id := uint64(1<<16 | 2)
	h := Handle{STag: uint32(win.STag()), Addr: win.Addr(), Len: 1 << 20, Session: r.hello.Session, Call: id}
	rep, err := r.send(t, appendCallHeader(nil, id, 0, "sum", []Handle{h}, 0))
	if err == nil {
		t.Fatalf("a read beyond the window was answered: %+v", rep)
	}
	if !errors.Is(r.qp.Err(), gowarp.ErrTerminated) {
		t.Fatalf("the lying client's session ended with %v, want its engine's Terminate", r.qp.Err())
	}
	if got := srv.Stats().ReadBytes - read; got != 0 {
		t.Fatalf("%d bytes were read", got)
	}
	if got, err := cl.Call(context.Background(), "echo", []byte("fine"), nil); err != nil || string(got) != "fine" {
		t.Fatalf("another session after: %q %v", got, err)
	}
}

// TestRefBounds: a handler's reads and writes outside its reference are
// refused before any RDMA operation.
func TestRefBounds(t *testing.T) {
	srv, cl, _ := pair(t, Options{})
	srv.Register("oob", func(ctx context.Context, c *ServerCall) error {
		r, err := c.Ref(0)
		if err != nil {
			return err
		}
		var b [8]byte
		if _, err := r.ReadAt(b[:], r.Len()+1); !errors.Is(err, ErrBadHandle) {
			return fmt.Errorf("read past the end: %v", err)
		}
		if _, err := r.ReadAt(b[:], -1); !errors.Is(err, ErrBadHandle) {
			return fmt.Errorf("read before the start: %v", err)
		}
		if _, err := r.WriteAt(b[:], r.Len()-4); !errors.Is(err, ErrBadHandle) {
			return fmt.Errorf("write across the end: %v", err)
		}
		if _, err := c.Ref(1); !errors.Is(err, ErrBadHandle) {
			return fmt.Errorf("reference 1 of 1: %v", err)
		}
		n, err := r.ReadAt(b[:], r.Len()-4) // short, as io.ReaderAt
		if n != 4 || err != io.EOF {
			return fmt.Errorf("read over the end: %d, %v", n, err)
		}
		return nil
	})
	b, _ := cl.Alloc(64)
	if err := cl.Do(context.Background(), &Call{Method: "oob", Refs: []Span{b.All().Writable()}}); err != nil {
		t.Fatal(err)
	}
	if got := srv.Stats().ReadBytes; got != 4 {
		t.Fatalf("%d bytes read, want the 4 asked for", got)
	}
}

// TestCallBeforeItsSlotsReply: a client that sends a slot's next call
// before that slot's reply has come breaks the protocol; the server may
// end its session for it, but never answers a call with another call's
// reply. Two calls per slot go out in one write, so that both often reach
// the server's poller together: the reply of the first was still to be
// posted from the slot's buffer when the second was accepted and
// overwrote it (both replies then carried the second's id). Every other
// try says more calls are in flight, so that the replies are the
// flusher's to post.
func TestCallBeforeItsSlotsReply(t *testing.T) {
	_, _, addr := pair(t, Options{})
	for try := range 50 {
		r := dialRaw(t, addr)
		slots := int(r.hello.Slots)
		n := 2 * slots
		mem := make([]byte, 2*n*defaultMsg)
		mr, err := r.pd.Register(mem, gowarp.LocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint64]string{}
		var wrs []gowarp.SendWR
		for k := range n {
			recv := (n + k) * defaultMsg
			r.qp.PostRecv(&gowarp.RecvWR{ID: uint64(recv), SGL: []gowarp.SGE{{MR: mr, Offset: recv, Length: defaultMsg}}})
			id := uint64(k/slots+1)<<16 | uint64(k%slots)
			arg := fmt.Sprintf("try %d call %#x", try, id)
			want[id] = arg
			m := appendCallHeader(mem[k*defaultMsg:k*defaultMsg], id, 0, "echo.fast", nil, len(arg))
			m = append(m, arg...)
			if try%2 == 1 { // the replies go through the flusher
				setCallFlags(m, callMore)
			}
			wrs = append(wrs, gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Offset: k * defaultMsg, Length: len(m)}}})
		}
		if _, err := r.qp.PostSendList(wrs); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wc [16]gowarp.Completion
		for got := 0; got < n; {
			if err := r.cq.Wait(ctx); err != nil {
				t.Fatalf("try %d: %d of %d replies: %v", try, got, n, err)
			}
			for _, c := range wc[:r.cq.Poll(wc[:])] {
				if c.Err() != nil {
					got = n // the server ended the session: allowed
					break
				}
				if c.Op != gowarp.CompRecv {
					continue
				}
				b := r.buf[defaultMsg:] // dialRaw's receive, ID 1
				if c.ID != 1 {
					b = mem[c.ID:]
				}
				rep, err := parseReply(b[:c.Bytes])
				if err != nil {
					t.Fatalf("try %d: %v", try, err)
				}
				arg, ok := want[rep.ID]
				if !ok {
					t.Fatalf("try %d: reply to call %#x, which is not outstanding (a second reply?)", try, rep.ID)
				}
				if string(rep.Payload) != arg {
					t.Fatalf("try %d: call %#x answered with %q, want %q", try, rep.ID, rep.Payload, arg)
				}
				delete(want, rep.ID)
				got++
			}
		}
		cancel()
		r.qp.Close()
	}
}
