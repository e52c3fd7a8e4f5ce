package cache

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

var discard = slog.New(slog.DiscardHandler)

func serveT(t *testing.T, o ServerOptions) (string, *Server) {
	t.Helper()
	o.Dir, o.Logger, o.Device = t.TempDir(), discard, gowarp.Open(gowarp.WithLogger(discard))
	srv, err := NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close() })
	return ln.Addr().String(), srv
}

// rawPeer is a client that speaks the control path by hand.
type rawPeer struct {
	qp         *gowarp.QP
	cq         *gowarp.CQ
	pd         *gowarp.PD
	send, recv *gowarp.MR
	ctx        context.Context
	t          *testing.T
	wc         [8]gowarp.Completion
}

func dialRaw(t *testing.T, addr string, pd []byte) *rawPeer {
	dev := gowarp.Open(gowarp.WithLogger(discard))
	p := &rawPeer{t: t, pd: dev.AllocPD(), cq: dev.NewCQ(64)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	p.ctx = ctx
	var err error
	if p.qp, err = p.pd.NewQP(gowarp.QPConfig{SendCQ: p.cq, RecvCQ: p.cq}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.qp.Close() })
	p.send, _ = p.pd.Register(make([]byte, maxMsg), 0)
	p.recv, _ = p.pd.Register(make([]byte, 4*maxMsg), gowarp.LocalWrite)
	for i := range 4 {
		p.qp.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: p.recv, Offset: i * maxMsg, Length: maxMsg}}})
	}
	if err := p.qp.Connect(ctx, addr, gowarp.ConnectOptions{PrivateData: pd, ORD: 16}); err != nil {
		t.Fatal(err)
	}
	return p
}

// exchange sends raw bytes and returns the reply, or the error that ended
// the connection.
func (p *rawPeer) exchange(b []byte) (Msg, error) {
	copy(p.send.Bytes(), b)
	if err := p.qp.PostSend(&gowarp.SendWR{ID: 99, Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: p.send, Length: len(b)}}}); err != nil {
		return Msg{}, err
	}
	return p.reply()
}

func (p *rawPeer) reply() (Msg, error) {
	for {
		if err := p.cq.Wait(p.ctx); err != nil {
			return Msg{}, err
		}
		for _, w := range p.wc[:p.cq.Poll(p.wc[:])] {
			if err := w.Err(); err != nil {
				return Msg{}, errors.Join(err, p.qp.Err())
			}
			if w.Op == gowarp.CompRecv {
				var m Msg
				b := bytes.Clone(p.recv.Bytes()[int(w.ID)*maxMsg : int(w.ID)*maxMsg+w.Bytes])
				p.qp.PostRecv(&gowarp.RecvWR{ID: w.ID, SGL: []gowarp.SGE{{MR: p.recv, Offset: int(w.ID) * maxMsg, Length: maxMsg}}})
				return m, Decode(b, &m)
			}
		}
	}
}

func (p *rawPeer) call(m Msg) (Msg, error) { return p.exchange(m.Append(nil)) }

func goodHello() []byte { return hello{Version: Version, Slots: 4, MaxMsg: maxMsg}.append(nil) }

// TestBadInput: malformed messages, unknown keys and ops, a value over
// the limit, commits of nothing, forged and stale addresses, a client
// that leaves in the middle of a put: each gets its client a clear error
// (or its connection ended, for a one-sided access that names no block),
// and the server serves everyone else, with nothing lost.
func TestBadInput(t *testing.T) {
	addr, srv := serveT(t, ServerOptions{BlockSize: 64 << 10, MaxValue: 1 << 20})
	good := dialRaw(t, addr, goodHello())
	if r, err := good.call(Msg{Op: OpPut, ID: 1, Key: []byte("keep"), Value: []byte("safe")}); err != nil || r.Status != StatusOK {
		t.Fatalf("put: %v %v", r.Status, err)
	}
	check := func() {
		t.Helper()
		r, err := good.call(Msg{Op: OpGet, ID: 2, Key: []byte("keep")})
		if err != nil || r.Status != StatusOK || string(r.Value) != "safe" {
			t.Fatalf("the good client's value: %q %v %v", r.Value, r.Status, err)
		}
	}
	bad := dialRaw(t, addr, goodHello())
	cases := []struct {
		name string
		b    []byte
		want Status
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\n\r\n garbage garbage"), StatusMalformed},
		{"short", []byte{1, 2}, StatusMalformed},
		{"version", append([]byte{9}, (&Msg{Op: OpGet, Key: []byte("k")}).Append(nil)[1:]...), StatusVersion},
		{"unknown key", (&Msg{Op: OpGet, ID: 3, Key: []byte("nope")}).Append(nil), StatusNotFound},
		{"empty key", (&Msg{Op: OpGet, ID: 3}).Append(nil), StatusBadRequest},
		{"delete unknown", (&Msg{Op: OpDelete, ID: 3, Key: []byte("nope")}).Append(nil), StatusNotFound},
		{"over the limit", (&Msg{Op: OpAlloc, ID: 4, Key: []byte("big"), Size: 1<<20 + 1}).Append(nil), StatusTooLarge},
		{"commit of nothing", (&Msg{Op: OpCommit, ID: 5, Key: []byte("keep"), Gen: 12345}).Append(nil), StatusBadRequest},
		{"request with a status", (&Msg{Op: OpGet, ID: 6, Status: StatusFull, Key: []byte("keep")}).Append(nil), StatusBadRequest},
	}
	for _, c := range cases {
		r, err := bad.exchange(c.b)
		if err != nil || r.Status != c.want || len(r.Value) == 0 {
			t.Errorf("%s: status %v (%q), %v; want %v with a text", c.name, r.Status, r.Value, err, c.want)
		}
		check()
	}

	// A client that allocates and leaves without committing.
	mid := dialRaw(t, addr, goodHello())
	r, err := mid.call(Msg{Op: OpAlloc, ID: 7, Key: []byte("keep"), Size: 200 << 10})
	if err != nil || r.Status != StatusOK || len(r.Addrs) != 4 {
		t.Fatalf("alloc: %v %v %v", r.Status, r.Addrs, err)
	}
	// It writes half, then vanishes.
	src, _ := mid.pd.Register(bytes.Repeat([]byte{0xee}, 64<<10), 0)
	mid.qp.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: int(r.Addrs[0].Len)}}, RemoteAddr: r.Addrs[0].Off + HeaderLen, RKey: gowarp.STag(r.Addrs[0].STag)})
	mid.qp.Close()
	check()

	// A forged address: a one-sided Read through an STag the server never
	// gave fails that client's connection only.
	lk, err := good.call(Msg{Op: OpLookup, ID: 8, Key: []byte("keep")})
	if err != nil || len(lk.Addrs) != 1 {
		t.Fatalf("lookup: %v %v", lk.Addrs, err)
	}
	for _, a := range []Addr{{STag: lk.Addrs[0].STag ^ 0x55, Off: lk.Addrs[0].Off, Len: 4}, {STag: lk.Addrs[0].STag, Off: lk.Addrs[0].Off + 1<<20, Len: 4}} {
		forger := dialRaw(t, addr, goodHello())
		sink, _ := forger.pd.Register(make([]byte, 64), gowarp.LocalWrite)
		forger.qp.PostSend(&gowarp.SendWR{Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: sink, Length: 36}}, RemoteAddr: a.Off, RKey: gowarp.STag(a.STag)})
		if _, err := forger.reply(); err == nil {
			t.Fatalf("a Read through forged address %+v succeeded", a)
		}
		check()
	}

	// A client whose hello is garbage is refused.
	dev := gowarp.Open(gowarp.WithLogger(discard))
	pd := dev.AllocPD()
	cq := dev.NewCQ(8)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer qp.Close()
	if err := qp.Connect(good.ctx, addr, gowarp.ConnectOptions{PrivateData: []byte("hello?")}); !errors.Is(err, gowarp.ErrRejected) {
		t.Fatalf("garbage hello: %v, want rejected", err)
	}
	check()
	// Not found is an answer, not an error (a Get's is a miss).
	errs := 0
	for _, c := range cases {
		if c.want != StatusNotFound {
			errs++
		}
	}
	if n := srv.Stats().Errors; n < uint64(errs) {
		t.Fatalf("%d errors counted, want at least %d", n, errs)
	}
}
