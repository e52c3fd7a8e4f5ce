//go:build linux

package netns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Loss drops a share of the packets that leave one end of a link, at
// random, with an nftables rule in the end's namespace: the equivalent of
// `nft add rule inet gowarp_loss out oifname LINK numgen random mod 100 <
// PERCENT counter drop`, made over netlink (github.com/google/nftables),
// so it needs nf_tables with numgen in the kernel but neither sch_netem
// nor the nft command. A counter before the drop counts every packet the
// end sends, so a test can check that the loss it asked for happened.
type Loss struct {
	ns, link string
	fd       *os.File
	conn     *nftables.Conn
	table    *nftables.Table
	chain    *nftables.Chain
}

// AddLoss makes link (an end of a veth pair in namespace ns) drop percent
// percent (1 to 99) of the packets it sends, at random; the rule goes
// with the namespace. It skips the test, saying why, where the kernel has
// no nf_tables.
func AddLoss(tb testing.TB, ns, link string, percent int) *Loss {
	tb.Helper()
	if percent < 1 || percent > 99 {
		tb.Fatalf("netns: loss of %d%%, want 1 to 99", percent)
	}
	fd, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { fd.Close() })
	conn, err := nftables.New(nftables.WithNetNSFd(int(fd.Fd())))
	if err != nil {
		tb.Fatalf("netns: nftables in %s: %v", ns, err)
	}
	l := &Loss{ns: ns, link: link, fd: fd, conn: conn}
	l.table = conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "gowarp_loss_" + link})
	prio := nftables.ChainPriorityFilter
	l.chain = conn.AddChain(&nftables.Chain{Name: "out", Table: l.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: prio})
	oif := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(link)},
	}
	// Every packet out of the link, counted.
	conn.AddRule(&nftables.Rule{Table: l.table, Chain: l.chain, Exprs: append(oif[:2:2], &expr.Counter{})})
	// numgen random mod 100, in host order, made big-endian (as nft does
	// before an ordered comparison), < percent: counted and dropped.
	var lt [4]byte
	binary.BigEndian.PutUint32(lt[:], uint32(percent))
	conn.AddRule(&nftables.Rule{Table: l.table, Chain: l.chain, Exprs: append(oif[:2:2],
		&expr.Numgen{Register: 1, Modulus: 100, Type: unix.NFT_NG_RANDOM},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Cmp{Op: expr.CmpOpLt, Register: 1, Data: lt[:]},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop})})
	if err := conn.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
			tb.Skipf("netns: cannot add an nf_tables loss rule in %s (is nf_tables, with numgen, not in this kernel?): %v", ns, err)
		}
		tb.Fatalf("netns: nftables loss rule on %s in %s: %v", link, ns, err)
	}
	return l
}

// Counts returns how many packets the link has sent since AddLoss (the
// ones dropped included) and how many of them the rule dropped.
func (l *Loss) Counts() (sent, dropped uint64, err error) {
	rules, err := l.conn.GetRules(l.table, l.chain)
	if err != nil {
		return 0, 0, fmt.Errorf("netns: loss counters of %s in %s: %w", l.link, l.ns, err)
	}
	var n []uint64
	for _, r := range rules {
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				n = append(n, c.Packets)
			}
		}
	}
	if len(n) != 2 {
		return 0, 0, fmt.Errorf("netns: loss rules of %s in %s: %d counters, want 2", l.link, l.ns, len(n))
	}
	return n[0], n[1], nil
}

// ifname is an interface name as nf_tables compares it: IFNAMSIZ bytes,
// zero padded.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// Block drops every packet that leaves link (an end of a veth pair in
// namespace ns), with an nftables rule in the end's namespace, until the
// returned unblock removes the rule: unlike a link set down it leaves the
// routes, and so the sockets' retransmissions, alone. It skips the test
// where the kernel has no nf_tables.
func Block(tb testing.TB, ns, link string) (unblock func()) {
	tb.Helper()
	fd, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { fd.Close() })
	conn, err := nftables.New(nftables.WithNetNSFd(int(fd.Fd())))
	if err != nil {
		tb.Fatalf("netns: nftables in %s: %v", ns, err)
	}
	table := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "gowarp_block_" + link})
	chain := conn.AddChain(&nftables.Chain{Name: "out", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	conn.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(link)},
		&expr.Verdict{Kind: expr.VerdictDrop}}})
	if err := conn.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
			tb.Skipf("netns: cannot add an nf_tables rule in %s (is nf_tables not in this kernel?): %v", ns, err)
		}
		tb.Fatalf("netns: nftables block of %s in %s: %v", link, ns, err)
	}
	done := false
	return func() {
		tb.Helper()
		if done {
			return
		}
		done = true
		conn.DelTable(table)
		if err := conn.Flush(); err != nil {
			tb.Fatalf("netns: removing the block of %s in %s: %v", link, ns, err)
		}
	}
}
