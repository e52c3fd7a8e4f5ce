//go:build linux

package gowarp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/netns"
)

// nsAdapter adds to dev an adapter with address addr whose sockets live
// in network namespace ns.
func nsAdapter(t testing.TB, dev *gowarp.Device, ns, name string, addr netip.Addr) *gowarp.Adapter {
	t.Helper()
	a, err := dev.AddAdapter(gowarp.AdapterConfig{Name: name, LocalAddr: addr,
		Dial: func(ctx context.Context, local, remote netip.AddrPort, timeout time.Duration) (c net.Conn, err error) {
			err = netns.Do(ns, func() (err error) {
				d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local), Timeout: timeout}
				c, err = d.DialContext(ctx, "tcp", remote.String())
				return err
			})
			return c, err
		},
		Listen: func(local netip.AddrPort) (ln net.Listener, err error) {
			err = netns.Do(ns, func() (err error) {
				ln, err = net.Listen("tcp", local.String())
				return err
			})
			return ln, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// ipCmd runs ip with args, failing the test on an error.
func ipCmd(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// txBytes returns the bytes link has sent in namespace ns.
func txBytes(t testing.TB, ns, link string) uint64 {
	t.Helper()
	var st []struct {
		Stats64 struct {
			TX struct {
				Bytes uint64 `json:"bytes"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(ipCmd(t, "-n", ns, "-j", "-s", "link", "show", "dev", link)), &st); err != nil || len(st) != 1 {
		t.Fatalf("link statistics of %s: %v", link, err)
	}
	return st[0].Stats64.TX.Bytes
}

// acceptLoop accepts every request on ln onto a fresh queue pair of pd
// and hands the queue pairs out on the channel.
func acceptLoop(t testing.TB, pd *gowarp.PD, cq *gowarp.CQ, ln *gowarp.Listener) <-chan *gowarp.QP {
	qps := make(chan *gowarp.QP, 16)
	go func() {
		for {
			req, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
			if err != nil {
				t.Error(err)
				return
			}
			if err := req.Accept(context.Background(), qp, gowarp.ConnectOptions{}); err != nil {
				t.Error(err)
				qp.Close()
				continue
			}
			qps <- qp
		}
	}()
	return qps
}

// TestAdapterPlacement: across two namespaces joined by two links, a
// queue pair to a peer address is placed on the adapter whose topology row
// reaches it most directly, dials from that adapter's address, and both
// ends report their adapters; rows of equal length are taken in turn.
func TestAdapterPlacement(t *testing.T) {
	n := netns.NewLinks(t, 1500, 2)
	srv, cli := gowarp.Open(), gowarp.Open()
	spd, cpd := srv.AllocPD(), cli.AllocPD()
	scq, ccq := srv.NewCQ(64), cli.NewCQ(64)
	var sa, ca [2]*gowarp.Adapter
	var lns [2]*gowarp.Listener
	var qps [2]<-chan *gowarp.QP
	for k, l := range n.Links {
		sa[k] = nsAdapter(t, srv, n.A, fmt.Sprint("srv", k), l.AddrA)
		ca[k] = nsAdapter(t, cli, n.B, fmt.Sprint("cli", k), l.AddrB)
		ln, err := sa[k].Listen(0)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		lns[k], qps[k] = ln, acceptLoop(t, spd, scq, ln)
	}
	wide := netip.MustParsePrefix("10.0.0.0/8")
	if err := cli.SetTopology(gowarp.Topology{
		{Adapter: "cli0", Remote: netip.PrefixFrom(n.Links[0].AddrA, 32)},
		{Adapter: "cli1", Remote: netip.PrefixFrom(n.Links[1].AddrA, 32)},
		{Adapter: "cli0", Remote: wide}, {Adapter: "cli1", Remote: wide},
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for round := range 2 {
		for k := range n.Links {
			qp, err := cpd.NewQP(gowarp.QPConfig{SendCQ: ccq, RecvCQ: ccq})
			if err != nil {
				t.Fatal(err)
			}
			defer qp.Close()
			if err := qp.Connect(ctx, lns[k].Addr().String(), gowarp.ConnectOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := qp.Adapter(); got != ca[k] {
				t.Errorf("round %d: queue pair to link %d's peer placed on %v, want %v", round, k, got, ca[k])
			}
			peer := nextQP(t, qps[k])
			defer peer.Close()
			if got := peer.Adapter(); got != sa[k] {
				t.Errorf("accepted queue pair on %v, want %v", got, sa[k])
			}
		}
	}
	for k := range ca {
		if ca[k].Placed() != 2 || sa[k].Placed() != 2 {
			t.Errorf("adapter %d placed %d and %d queue pairs, want 2 each", k, ca[k].Placed(), sa[k].Placed())
		}
	}
	// A peer both rows of /8 reach equally: the adapters in turn.
	var seen [2]int
	for range 6 {
		switch cli.Place(netip.MustParseAddr("10.99.0.1")) {
		case ca[0]:
			seen[0]++
		case ca[1]:
			seen[1]++
		default:
			t.Fatal("no adapter for a peer two rows reach")
		}
	}
	if seen != [2]int{3, 3} {
		t.Errorf("6 placements on two equally direct adapters went %v, want 3 and 3", seen)
	}
	if a := cli.Place(netip.MustParseAddr("192.168.1.1")); a != nil {
		t.Errorf("a peer no row reaches placed on %v, want none", a)
	}
}

// TestAdapterSpread: a peer address reached over either of two links
// (policy routing sends what leaves each adapter's address over that
// adapter's link) gets its queue pairs spread over both: each link
// carries its share of the Writes.
func TestAdapterSpread(t *testing.T) {
	n := netns.NewLinks(t, 1500, 2)
	svc := netip.AddrFrom4([4]byte{10, 250, n.AddrA.As4()[2], 1})
	ipCmd(t, "-n", n.A, "addr", "add", svc.String()+"/32", "dev", "lo")
	for k, l := range n.Links {
		table := fmt.Sprint(100 + k)
		ipCmd(t, "-n", n.B, "rule", "add", "from", l.AddrB.String(), "table", table)
		ipCmd(t, "-n", n.B, "route", "add", svc.String()+"/32", "dev", l.LinkB, "table", table)
	}
	dev := gowarp.Open()
	pd := dev.AllocPD()
	scq, ccq := dev.NewCQ(64), dev.NewCQ(64)
	var ln *gowarp.Listener
	if err := netns.Do(n.A, func() (err error) {
		ln, err = dev.Listen(netip.AddrPortFrom(svc, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peers := acceptLoop(t, pd, scq, ln)
	var ca [2]*gowarp.Adapter
	var top gowarp.Topology
	for k, l := range n.Links {
		ca[k] = nsAdapter(t, dev, n.B, fmt.Sprint("b", k), l.AddrB)
		top = append(top, gowarp.DirectLink{Adapter: ca[k].Name(), Remote: netip.PrefixFrom(svc, 32)})
	}
	if err := dev.SetTopology(top); err != nil {
		t.Fatal(err)
	}
	const size = 1 << 20
	buf := make([]byte, size)
	src, _ := pd.Register(buf, gowarp.LocalWrite)
	const qps = 4
	dst, _ := pd.Register(make([]byte, qps*size), gowarp.RemoteWrite) // a part for each
	var before [2]uint64
	for k, l := range n.Links {
		before[k] = txBytes(t, n.B, l.LinkB)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range qps {
		qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: ccq, RecvCQ: ccq})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Close()
		if err := qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{}); err != nil {
			t.Fatal(err)
		}
		defer nextQP(t, peers).Close()
		if qp.Adapter() != ca[i%2] {
			t.Errorf("queue pair %d on %v, want %v (in turn)", i, qp.Adapter(), ca[i%2])
		}
		if err := qp.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: dst.Addr() + uint64(i*size), RKey: dst.STag()}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, ccq); c.Err() != nil {
			t.Fatal(c.Err())
		}
	}
	if err := dst.WaitPlaced(ctx, qps*size); err != nil {
		t.Fatal(err)
	}
	for k, l := range n.Links {
		// Each link carried its two queue pairs' Writes: 2 MiB and headers.
		if sent := txBytes(t, n.B, l.LinkB) - before[k]; sent < 2*size {
			t.Errorf("link %d sent %d bytes, want at least its two queue pairs' %d", k, sent, 2*size)
		}
	}
}

// TestAdapterBadConfig: adapters and topology rows that cannot work are
// refused with ErrBadConfig and change nothing.
func TestAdapterBadConfig(t *testing.T) {
	dev := gowarp.Open()
	ok := gowarp.AdapterConfig{Name: "a", LocalAddr: netip.MustParseAddr("127.0.0.1")}
	if _, err := dev.AddAdapter(ok); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]gowarp.AdapterConfig{
		"twice":   ok,
		"no name": {LocalAddr: ok.LocalAddr},
		"no addr": {Name: "b"},
		"kind":    {Name: "c", LocalAddr: ok.LocalAddr, Kind: 99},
	} {
		if _, err := dev.AddAdapter(c); !errors.Is(err, gowarp.ErrBadConfig) {
			t.Errorf("%s: %v, want ErrBadConfig", name, err)
		}
	}
	if err := dev.SetTopology(gowarp.Topology{{Adapter: "nope", Remote: netip.MustParsePrefix("10.0.0.0/8")}}); !errors.Is(err, gowarp.ErrBadConfig) {
		t.Errorf("row of an unknown adapter: %v, want ErrBadConfig", err)
	}
	if len(dev.Adapters()) != 1 || len(dev.Topology()) != 0 {
		t.Errorf("%d adapters, %d rows after refusals, want 1 and 0", len(dev.Adapters()), len(dev.Topology()))
	}
	// No row reaches 127.0.0.1: Connect dials as the system routes.
	p := newPairOn(t, gowarp.ConnectOptions{}, "127.0.0.1:0", nil, nil)
	if p.a.Adapter() != nil {
		t.Errorf("queue pair of a device without adapters on %v", p.a.Adapter())
	}
}

// TestAdapterPlacementSharedMemory: a peer on this host reached by a
// shared-memory adapter's row and a TCP adapter's row of the same length
// is placed on the shared-memory one, and both ends of its queue pair run
// over shared memory; a queue pair put on the TCP adapter runs over TCP.
func TestAdapterPlacementSharedMemory(t *testing.T) {
	dev := gowarp.Open()
	pd := dev.AllocPD()
	shm, err := dev.AddAdapter(gowarp.AdapterConfig{Name: "shm", Kind: gowarp.AdapterSharedMemory, LocalAddr: netip.MustParseAddr("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := dev.AddAdapter(gowarp.AdapterConfig{Name: "lo", LocalAddr: netip.MustParseAddr("127.0.0.2")})
	if err != nil {
		t.Fatal(err)
	}
	host := netip.MustParsePrefix("127.0.0.0/8")
	if err := dev.SetTopology(gowarp.Topology{{Adapter: "lo", Remote: host}, {Adapter: "shm", Remote: host}}); err != nil {
		t.Fatal(err)
	}
	ln, err := shm.Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	scq, ccq := dev.NewCQ(16), dev.NewCQ(16)
	peers := acceptLoop(t, pd, scq, ln)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src, _ := pd.Register([]byte("over shared memory"), gowarp.LocalWrite)
	for _, tc := range []struct {
		via  *gowarp.Adapter // nil: as the topology places it
		want *gowarp.Adapter
		tr   gowarp.Transport
	}{{nil, shm, gowarp.TransportSharedMemory}, {tcp, tcp, gowarp.TransportTCP}} {
		qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: ccq, RecvCQ: ccq})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Close()
		if tc.via == nil {
			err = qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{})
		} else {
			err = qp.ConnectVia(ctx, tc.via, ln.Addr().String(), gowarp.ConnectOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		peer := nextQP(t, peers)
		defer peer.Close()
		if qp.Adapter() != tc.want || qp.Transport() != tc.tr || peer.Adapter() != shm || peer.Transport() != tc.tr {
			t.Errorf("placed on %v over %v, the peer on %v over %v; want %v over %v, the peer on %v",
				qp.Adapter(), qp.Transport(), peer.Adapter(), peer.Transport(), tc.want, tc.tr, shm)
		}
		dst, _ := pd.Register(make([]byte, src.Len()), gowarp.RemoteWrite)
		if err := qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			SGL: []gowarp.SGE{{MR: src, Length: src.Len()}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
			t.Fatal(err)
		}
		if err := dst.WaitPlaced(ctx, uint64(src.Len())); err != nil {
			t.Fatal(err)
		}
		if string(dst.Bytes()) != "over shared memory" {
			t.Errorf("placed %q", dst.Bytes())
		}
		if c := wait(t, ccq); c.Err() != nil {
			t.Fatal(c.Err())
		}
	}
}
