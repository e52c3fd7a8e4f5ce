//go:build linux

package gowarp_test

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/netns"
)

// vethPair connects two QPs across a veth pair with MTU 1500 between two
// network namespaces: a real Ethernet-sized segment, as between two hosts.
func vethPair(tb testing.TB, o gowarp.ConnectOptions) (*pair, *netns.Pair) {
	n := netns.New(tb, 1500)
	inA := func(f func() error) error { return netns.Do(n.A, f) }
	inB := func(f func() error) error { return netns.Do(n.B, f) }
	return newPairOn(tb, o, netip.AddrPortFrom(n.AddrA, 0).String(), inA, inB), n
}

// TestVeth: across an Ethernet-sized link, FPDUs are sized to the
// 1448-byte TCP segment, as siw sizes them, and Writes, Reads and Sends of
// many segments arrive intact.
func TestVeth(t *testing.T) {
	p, _ := vethPair(t, gowarp.ConnectOptions{CRC: true})
	if got := p.a.FPDUSize(); got != 1448 {
		t.Errorf("FPDU size %d on a 1500-byte MTU link, want 1448 (the MSS)", got)
	}
	const n = 1 << 20
	src, sbuf := p.reg(t, n, gowarp.LocalWrite)
	fillPattern(sbuf, 5)
	dst, dbuf := p.reg(t, n, gowarp.RemoteWrite|gowarp.RemoteRead)
	back, bbuf := p.reg(t, n, gowarp.LocalWrite)
	recv, rbuf := p.reg(t, n, gowarp.LocalWrite)
	p.b.PostRecv(&gowarp.RecvWR{ID: 7, SGL: []gowarp.SGE{{MR: recv, Length: n}}})
	p.a.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())})
	p.a.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: back, Length: n}}, RemoteAddr: dst.Addr(), RKey: uint32(dst.STag())})
	p.a.PostSend(&gowarp.SendWR{ID: 3, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: n}}})
	for _, id := range []uint64{2, 3} {
		if c := wait(t, p.acq); c.ID != id || c.Err() != nil {
			t.Fatalf("completion %+v", c)
		}
	}
	if c := wait(t, p.bcq); c.ID != 7 || c.Bytes != n {
		t.Fatalf("receive %+v", c)
	}
	if dst.Placed() != n || !bytes.Equal(dbuf, sbuf) || !bytes.Equal(bbuf, sbuf) || !bytes.Equal(rbuf, sbuf) {
		t.Fatal("data differs across the veth link")
	}
}

// BenchmarkVethWrite64K is 64 KiB write_bw across the veth link (MTU 1500,
// 1448-byte FPDUs); BenchmarkVethTCP64K the plain TCP floor on the same link.
func BenchmarkVethWrite64K(b *testing.B) {
	p, _ := vethPair(b, gowarp.ConnectOptions{})
	benchWriteOn(b, p, 64<<10, 32)
}

func BenchmarkVethWrite64KCRC(b *testing.B) {
	p, _ := vethPair(b, gowarp.ConnectOptions{CRC: true})
	benchWriteOn(b, p, 64<<10, 32)
}

func BenchmarkVethTCP64K(b *testing.B) {
	n := netns.New(b, 1500)
	var ln net.Listener
	var c net.Conn
	if err := netns.Do(n.A, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(n.AddrA, 0).String())
		return err
	}); err != nil {
		b.Fatal(err)
	}
	if err := netns.Do(n.B, func() (err error) {
		c, err = net.Dial("tcp", ln.Addr().String())
		return err
	}); err != nil {
		b.Fatal(err)
	}
	benchTCPOn(b, ln, c, 64<<10)
}
