package gowarp_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// tenantServer is a device with two tenant tables, red and blue, serving
// on one listener: each accepted connection gets a queue pair of the
// table its request reaches.
type tenantServer struct {
	dev       *gowarp.Device
	red, blue *gowarp.Table
	redPD     *gowarp.PD
	bluePD    *gowarp.PD
	ln        *gowarp.Listener
	qps       chan *gowarp.QP
}

func newTenantServer(t testing.TB) *tenantServer {
	t.Helper()
	s := &tenantServer{dev: gowarp.Open(), qps: make(chan *gowarp.QP, 16)}
	var err error
	if s.red, err = s.dev.Table(gowarp.TenantIdentity("red")); err != nil {
		t.Fatal(err)
	}
	if s.blue, err = s.dev.Table(gowarp.TenantIdentity("blue")); err != nil {
		t.Fatal(err)
	}
	s.redPD, s.bluePD = s.red.AllocPD(), s.blue.AllocPD()
	if s.ln, err = s.dev.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	pds := map[*gowarp.Table]*gowarp.PD{s.red: s.redPD, s.blue: s.bluePD}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); s.ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			req, err := s.ln.Accept(ctx)
			if err != nil {
				return
			}
			tbl, err := req.Table()
			if err != nil || pds[tbl] == nil {
				req.Reject(nil)
				continue
			}
			cq := s.dev.NewCQ(64)
			qp, _ := pds[tbl].NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
			for range 4 {
				rb, _ := pds[tbl].Register(make([]byte, 64), gowarp.LocalWrite)
				qp.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: rb, Length: 64}}})
			}
			if err := req.Accept(ctx, qp, gowarp.ConnectOptions{Extensions: true}); err != nil {
				qp.Close()
				continue
			}
			select {
			case s.qps <- qp:
			case <-ctx.Done(): // the test ended without taking it
				qp.Close()
				return
			}
			t.Cleanup(func() { qp.Close() })
		}
	}()
	return s
}

// connect makes a client queue pair connected as tenant.
func (s *tenantServer) connect(t testing.TB, tenant string) (*gowarp.QP, *gowarp.CQ, *gowarp.PD) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := newIdlePair(t, 64) // its b stays idle
	t.Cleanup(func() { p.a.Close(); p.b.Close() })
	if err := p.a.Connect(ctx, s.ln.Addr().String(), gowarp.ConnectOptions{Tenant: tenant, Extensions: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.qps:
	case <-ctx.Done():
		t.Fatal("the server accepted nothing")
	}
	return p.a, p.acq, p.pd
}

// TestTenantIsolation: a peer connected as tenant blue tries every kind
// of access to a region of tenant red, with red's STag and address: each
// meets the invalid-STag Terminate, and nothing is placed, read,
// invalidated or changed. The same access to blue's own region works, so
// the test can tell.
func TestTenantIsolation(t *testing.T) {
	s := newTenantServer(t)
	const secret = "red's secret, never to leave red"
	mk := func(pd *gowarp.PD) *gowarp.MR {
		buf := make([]byte, 64)
		copy(buf, secret)
		mr, err := pd.Register(buf, gowarp.RemoteRead|gowarp.RemoteWrite|gowarp.RemoteAtomic|gowarp.RemoteInvalidate)
		if err != nil {
			t.Fatal(err)
		}
		return mr
	}
	red := mk(s.redPD)
	// rdma posts wr, signaled, from n bytes of l at target m.
	rdma := func(wr gowarp.SendWR, n int) func(qp *gowarp.QP, l, m *gowarp.MR) error {
		return func(qp *gowarp.QP, l, m *gowarp.MR) error {
			wr.ID, wr.Flags, wr.SGL = 1, gowarp.Signaled, []gowarp.SGE{{MR: l, Length: n}}
			wr.RemoteAddr, wr.RKey = m.Addr(), m.STag()
			return qp.PostSend(&wr)
		}
	}
	for _, tt := range []struct {
		name string
		want *wire.TermError // what an STag unknown to the table gets
		post func(qp *gowarp.QP, local *gowarp.MR, target *gowarp.MR) error
	}{
		{"Write", wire.ErrDDPInvalidSTag, rdma(gowarp.SendWR{Op: gowarp.OpWrite}, 16)},
		{"WriteImm", wire.ErrDDPInvalidSTag, rdma(gowarp.SendWR{Op: gowarp.OpWriteImm, Imm: 5}, 16)},
		{"Read", wire.ErrRDMAPInvalidSTag, rdma(gowarp.SendWR{Op: gowarp.OpRead}, 32)},
		{"SendInv", wire.ErrRDMAPCannotInvalidate, func(qp *gowarp.QP, l, m *gowarp.MR) error {
			return qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpSendInv, Flags: gowarp.Signaled,
				SGL: []gowarp.SGE{{MR: l, Length: 8}}, InvalidateSTag: m.STag()})
		}},
		{"FetchAdd", wire.ErrRDMAPInvalidSTag, rdma(gowarp.SendWR{Op: gowarp.OpFetchAdd, CompareAdd: 1}, 8)},
		{"CmpSwap", wire.ErrRDMAPInvalidSTag, func(qp *gowarp.QP, l, m *gowarp.MR) error {
			v, _ := m.AtomicLoad(0) // the swap would succeed, were the STag known
			return rdma(gowarp.SendWR{Op: gowarp.OpCmpSwap, CompareAdd: v, Swap: 1}, 8)(qp, l, m)
		}},
		{"AtomicWrite", wire.ErrRDMAPInvalidSTag, rdma(gowarp.SendWR{Op: gowarp.OpAtomicWrite, Swap: 1}, 8)},
		{"Flush", wire.ErrRDMAPInvalidSTag, func(qp *gowarp.QP, l, m *gowarp.MR) error {
			return qp.PostFlush(&gowarp.FlushWR{ID: 1, Flags: gowarp.Signaled, Type: gowarp.FlushVisibility,
				RemoteAddr: m.Addr(), RKey: m.STag()})
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Blue on its own region: the access works.
			blue := mk(s.bluePD)
			qp, cq, pd := s.connect(t, "blue")
			local, err := pd.Register(bytes.Repeat([]byte{0xee}, 64), gowarp.LocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			if err := tt.post(qp, local, blue); err != nil {
				t.Fatal(err)
			}
			if c := wait(t, cq); c.Err() != nil {
				t.Fatalf("blue's %s of its own region: %v", tt.name, c.Err())
			}
			// Blue on red's region: refused.
			qp, cq, pd = s.connect(t, "blue")
			local, _ = pd.Register(bytes.Repeat([]byte{0xee}, 64), gowarp.LocalWrite)
			placed := red.Placed()
			if err := tt.post(qp, local, red); err != nil {
				t.Fatal(err)
			}
			// A Write or Send completes once the socket took it (Handed):
			// the Terminate tells.
			wait(t, cq)
			waitState(t, qp, gowarp.StateError)
			if err := qp.Err(); !errors.Is(err, gowarp.ErrPeerTerminated) || !errors.Is(err, tt.want) {
				t.Fatalf("blue's QP: %v, want the Terminate of an unknown STag, %v", err, tt.want)
			}
			switch {
			case !strings.HasPrefix(string(red.Bytes()), secret) || red.Placed() != placed:
				t.Fatalf("red's region changed: %q, placed %d", red.Bytes(), red.Placed()-placed)
			case !red.Valid():
				t.Fatal("red's region was invalidated")
			case bytes.Contains(local.Bytes(), []byte("red")) || !bytes.Equal(local.Bytes(), bytes.Repeat([]byte{0xee}, 64)):
				t.Fatalf("blue's buffer holds %q", local.Bytes())
			}
		})
	}
}

// TestTenantAcceptChecks: Accept refuses a queue pair of another table
// than the request's (the request may then be accepted on the right
// one), and a request naming a tenant the device lacks; a listener bound
// to a table takes no request naming another tenant.
func TestTenantAcceptChecks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev := gowarp.Open()
	red, _ := dev.Table(gowarp.TenantIdentity("red"))
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	newQP := func(pd *gowarp.PD) *gowarp.QP {
		cq := dev.NewCQ(8)
		qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { qp.Close() })
		return qp
	}
	dial := func(addr, tenant string) chan error {
		errc := make(chan error, 1)
		go func() {
			errc <- newQP(gowarp.Open().AllocPD()).Connect(ctx, addr, gowarp.ConnectOptions{Tenant: tenant})
		}()
		return errc
	}
	errc := dial(ln.Addr().String(), "red")
	req, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if req.Tenant() != "red" {
		t.Fatalf("Tenant() = %q", req.Tenant())
	}
	if tb, err := req.Table(); err != nil || tb != red {
		t.Fatalf("Table() = %v, %v", tb, err)
	}
	if err := req.Accept(ctx, newQP(dev.AllocPD()), gowarp.ConnectOptions{}); !errors.Is(err, gowarp.ErrWrongTable) {
		t.Fatalf("Accept on a default-table QP: %v", err)
	}
	if err := req.Accept(ctx, newQP(red.AllocPD()), gowarp.ConnectOptions{}); err != nil {
		t.Fatalf("Accept on red's QP after the refusal: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	errc = dial(ln.Addr().String(), "green")
	req, err = ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := req.Table(); !errors.Is(err, gowarp.ErrNoTable) {
		t.Fatalf("Table() of an unknown tenant: %v", err)
	}
	if err := req.Accept(ctx, newQP(dev.AllocPD()), gowarp.ConnectOptions{}); !errors.Is(err, gowarp.ErrNoTable) {
		t.Fatalf("Accept of an unknown tenant: %v", err)
	}
	req.Reject(nil)
	if err := <-errc; !errors.Is(err, gowarp.ErrRejected) {
		t.Fatalf("client of an unknown tenant: %v", err)
	}

	bound, err := red.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer bound.Close()
	errc = dial(bound.Addr().String(), "blue")
	req, err = bound.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.Accept(ctx, newQP(red.AllocPD()), gowarp.ConnectOptions{}); !errors.Is(err, gowarp.ErrWrongTable) {
		t.Fatalf("bound listener, request for another tenant: %v", err)
	}
	req.Reject(nil)
	<-errc
	errc = dial(bound.Addr().String(), "")
	if req, err = bound.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	if err := req.Accept(ctx, newQP(red.AllocPD()), gowarp.ConnectOptions{}); err != nil {
		t.Fatalf("bound listener, unnamed request: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestTenantName: names too long or not printable are refused by
// Device.Table and by Connect, before anything is sent.
func TestTenantName(t *testing.T) {
	dev := gowarp.Open()
	for _, name := range []string{strings.Repeat("n", gowarp.MaxTenantLen+1), "two words", "é"} {
		if _, err := dev.Table(gowarp.TenantIdentity(name)); !errors.Is(err, gowarp.ErrBadTenant) {
			t.Errorf("Table(%q): %v", name, err)
		}
		pd := dev.AllocPD()
		cq := dev.NewCQ(4)
		qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{Tenant: name})
		cancel()
		ln.Close()
		if !errors.Is(err, gowarp.ErrBadTenant) {
			t.Errorf("Connect as %q: %v", name, err)
		}
	}
	if tb, err := dev.Table(gowarp.TenantIdentity(strings.Repeat("n", gowarp.MaxTenantLen))); err != nil || tb.Identity().Tenant() == "" {
		t.Errorf("longest name: %v", err)
	}
	if tb, _ := dev.Table(gowarp.Identity{}); tb != dev.DefaultTable() {
		t.Error("the zero Identity is not the default table")
	}
}

// TestTenantByLocalAddr: a table bound to a local address serves the
// connections that arrive on it (from an unbound listener on all
// addresses) and is where its queue pairs' connections leave from;
// connections on other addresses reach the default table.
func TestTenantByLocalAddr(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a2 := netip.MustParseAddr("127.0.0.2")
	probe, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	probe.Close()
	dev := gowarp.Open()
	tb, err := dev.Table(gowarp.AddrIdentity(a2))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := dev.Listen("0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, c := range []struct {
		to   string
		want *gowarp.Table
	}{{"127.0.0.2", tb}, {"127.0.0.1", dev.DefaultTable()}} {
		cdev := gowarp.Open()
		cl := cdev.AllocPD()
		cq := cdev.NewCQ(4)
		qp, _ := cl.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
		defer qp.Close()
		go qp.Connect(ctx, net.JoinHostPort(c.to, strconv.Itoa(port)), gowarp.ConnectOptions{})
		req, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := req.Table()
		if err != nil || got != c.want {
			t.Fatalf("connection to %s reaches the %v table, want %v (%v)", c.to, got.Identity(), c.want.Identity(), err)
		}
		req.Reject(nil)
	}
	// Leaving from it: a queue pair of the table dials from 127.0.0.2.
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	pd := tb.AllocPD()
	cq := dev.NewCQ(4)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer qp.Close()
	go qp.Connect(ctx, raw.Addr().String(), gowarp.ConnectOptions{})
	c, err := raw.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ap := netip.MustParseAddrPort(c.RemoteAddr().String()); ap.Addr() != a2 {
		t.Fatalf("the table's queue pair connected from %v", ap)
	}
}
