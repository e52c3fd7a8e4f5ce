//go:build linux

package gowarp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/internal/netns"
)

// A table migration across two network namespaces joined by a veth pair:
// node 1 in A, node 2 and the client in B (the far end of the link from
// node 1). The client writes and reads node 1's regions with the STags it
// holds; the table moves to node 2 under that load; the client, refused
// by the frozen table, reconnects to node 2 and carries on with the same
// STags. An operation is acknowledged when the Read that follows its
// Write returns its bytes; every acknowledged one must be found on node 2.

// serveTable accepts connections on ln, each on a new queue pair of pd,
// until ctx ends; it closes the queue pairs when it returns.
func serveTable(ctx context.Context, ln *gowarp.Listener, pd *gowarp.PD) (closeAll func()) {
	var mu sync.Mutex
	var qps []*gowarp.QP
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			req, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			cq := pd.Device().NewCQ(16)
			qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
			if err != nil {
				req.Reject(nil)
				continue
			}
			if err := req.Accept(ctx, qp, gowarp.ConnectOptions{}); err != nil {
				qp.Close()
				continue
			}
			mu.Lock()
			qps = append(qps, qp)
			mu.Unlock()
		}
	}()
	return func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, qp := range qps {
			qp.Close()
		}
	}
}

// migClient is the client: it holds the STags and addresses of the
// regions and runs Write-then-Read operations on them, reconnecting to
// wherever target says when its queue pair fails.
type migClient struct {
	dev    *gowarp.Device
	pd     *gowarp.PD
	cq     *gowarp.CQ
	qp     *gowarp.QP
	src    *gowarp.MR
	back   *gowarp.MR
	stags  []uint32
	addrs  []uint64
	size   int // of each region
	target atomic.Pointer[string]
	dial   func(ctx context.Context, addr string) (net.Conn, error)

	acked      atomic.Int64 // operations acknowledged
	reconnects int
	last       map[[2]int]uint64 // the last acknowledged value of each slot
}

const migSlot = 64 // bytes each operation writes and reads back

func (c *migClient) connect(ctx context.Context) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c.qp != nil {
			c.qp.Close()
		}
		var err error
		if c.qp, err = c.pd.NewQP(gowarp.QPConfig{SendCQ: c.cq, RecvCQ: c.cq}); err != nil {
			return err
		}
		var conn net.Conn
		if conn, err = c.dial(ctx, *c.target.Load()); err == nil {
			if err = c.qp.ConnectConn(ctx, conn, gowarp.ConnectOptions{Tenant: "acme"}); err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("reconnect to %s: %w", *c.target.Load(), err)
		}
		time.Sleep(5 * time.Millisecond) // node 2 listens once the import is done
	}
}

// op writes value v to slot (r, off) and reads it back; it returns an
// error if the queue pair failed on the way.
func (c *migClient) op(ctx context.Context, r, off int, v uint64) error {
	b := c.src.Bytes()
	for i := 0; i < migSlot; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], v)
	}
	clear(c.back.Bytes())
	raddr, rkey := c.addrs[r]+uint64(off), c.stags[r]
	if err := c.qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: c.src, Length: migSlot}},
		RemoteAddr: raddr, RKey: gowarp.STag(rkey)}); err != nil {
		return err
	}
	if err := c.qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled,
		SGL: []gowarp.SGE{{MR: c.back, Length: migSlot}}, RemoteAddr: raddr, RKey: gowarp.STag(rkey)}); err != nil {
		return err
	}
	var wc [4]gowarp.Completion
	for {
		n := c.cq.Poll(wc[:])
		for _, w := range wc[:n] {
			if w.QP != c.qp {
				// An earlier queue pair's, left in the CQ they share when
				// an error ended op before its Read completed: that Read
				// may have succeeded, into the buffer this op cleared.
				continue
			}
			if w.Err() != nil {
				return w.Err()
			}
			if w.ID == 2 {
				got := binary.LittleEndian.Uint64(c.back.Bytes())
				if got != v {
					return fmt.Errorf("read back %#x after writing %#x to region %d offset %d", got, v, r, off)
				}
				return nil
			}
		}
		if n == 0 {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := c.cq.Wait(wctx)
			cancel()
			if err != nil {
				return fmt.Errorf("waiting for the Read: %w (QP: %v)", err, c.qp.Err())
			}
		}
	}
}

// run does operations until stop is closed, retrying the one under way
// after a reconnect until it is acknowledged.
func (c *migClient) run(ctx context.Context, stop <-chan struct{}) error {
	c.last = map[[2]int]uint64{}
	slots := c.size / migSlot
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		r, off := i%len(c.stags), (i/len(c.stags))%slots*migSlot
		v := uint64(i+1)<<8 | uint64(r)
		for {
			err := c.op(ctx, r, off, v)
			if err == nil {
				break
			}
			if c.qp.State() == gowarp.StateReady && !errors.Is(err, gowarp.WRFlushError) && !errors.Is(err, gowarp.RemoteAccessError) {
				return err // a wrong value or a hang: not a migration's doing
			}
			c.reconnects++
			if err := c.connect(ctx); err != nil {
				return err
			}
		}
		c.last[[2]int{r, off}] = v
		c.acked.Add(1)
	}
}

// migrateUnderLoad runs the scenario with regions regions of size bytes
// and returns the pause: from the start of the export (the freeze) to the
// end of the import on node 2.
func migrateUnderLoad(tb testing.TB, regions, size int) (pause time.Duration, st gowarp.ExportStats, c *migClient) {
	n := netns.New(tb, 1500)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	inA := func(f func() error) error { return netns.Do(n.A, f) }
	inB := func(f func() error) error { return netns.Do(n.B, f) }

	// Node 1: the table, its regions, a listener in A.
	node1 := gowarp.Open()
	t1, err := node1.Table(gowarp.TenantIdentity("acme"))
	if err != nil {
		tb.Fatal(err)
	}
	pd1 := t1.AllocPD()
	c = &migClient{size: size}
	for range regions {
		mr, err := pd1.Register(make([]byte, size), gowarp.RemoteWrite|gowarp.RemoteRead)
		if err != nil {
			tb.Fatal(err)
		}
		c.stags, c.addrs = append(c.stags, uint32(mr.STag())), append(c.addrs, mr.Addr())
	}
	var ln1 *gowarp.Listener
	if err := inA(func() (err error) {
		ln1, err = node1.Listen(netip.AddrPortFrom(n.AddrA, 0).String())
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	close1 := serveTable(ctx, ln1, pd1)
	defer close1()

	// Node 2: a listener for the export stream in B; the gowarp listener
	// comes once the import is done.
	node2 := gowarp.Open()
	t2, err := node2.Table(gowarp.TenantIdentity("acme"))
	if err != nil {
		tb.Fatal(err)
	}
	var streamLn net.Listener
	if err := inB(func() (err error) {
		streamLn, err = net.Listen("tcp", netip.AddrPortFrom(n.AddrB, 0).String())
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	defer streamLn.Close()
	// Node 2's gowarp listener exists from the start, but nothing is
	// accepted before the import is done: a client that comes early waits
	// for its MPA reply.
	var ln2 *gowarp.Listener
	if err := inB(func() (err error) {
		ln2, err = t2.Listen(netip.AddrPortFrom(n.AddrB, 0).String())
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	defer ln2.Close()
	node2Addr := ln2.Addr().String()
	type imported struct {
		at    time.Time
		close func()
		err   error
	}
	importDone := make(chan imported, 1)
	go func() {
		conn, err := streamLn.Accept()
		if err != nil {
			importDone <- imported{err: err}
			return
		}
		defer conn.Close()
		imp, err := t2.Import(ctx, conn, gowarp.ImportOptions{})
		at := time.Now()
		if err != nil {
			importDone <- imported{err: err}
			return
		}
		importDone <- imported{at: at, close: serveTable(ctx, ln2, imp.PD(gowarp.STag(c.stags[0])))}
	}()

	// The client, in B, connects to node 1 across the link.
	c.dev = gowarp.Open()
	c.pd = c.dev.AllocPD()
	c.cq = c.dev.NewCQ(16)
	c.src, _ = c.pd.Register(make([]byte, migSlot), 0)
	c.back, _ = c.pd.Register(make([]byte, migSlot), gowarp.LocalWrite)
	c.dial = func(ctx context.Context, addr string) (conn net.Conn, err error) {
		err = inB(func() error {
			var d net.Dialer
			conn, err = d.DialContext(ctx, "tcp", addr)
			return err
		})
		return conn, err
	}
	first := netip.AddrPortFrom(n.AddrA, uint16(ln1.Addr().(*net.TCPAddr).Port)).String()
	c.target.Store(&first)
	if err := c.connect(ctx); err != nil {
		tb.Fatal(err)
	}
	defer func() { c.qp.Close() }()
	stop := make(chan struct{})
	runErr := make(chan error, 1)
	go func() { runErr <- c.run(ctx, stop) }()

	waitAcked := func(n int64) {
		for c.acked.Load() < n {
			select {
			case err := <-runErr:
				tb.Fatalf("client stopped after %d operations: %v", c.acked.Load(), err)
			case <-time.After(time.Millisecond):
			}
		}
	}
	waitAcked(100)
	before := c.acked.Load()

	// Migrate: node 1 exports over TCP from A to node 2 in B.
	c.target.Store(&node2Addr)
	var stream net.Conn
	if err := inA(func() (err error) { stream, err = net.Dial("tcp", streamLn.Addr().String()); return err }); err != nil {
		tb.Fatal(err)
	}
	t0 := time.Now()
	st, err = t1.Export(ctx, stream)
	stream.Close()
	if err != nil {
		tb.Fatal(err)
	}
	im := <-importDone
	if im.err != nil {
		tb.Fatal(im.err)
	}
	defer im.close()
	pause = im.at.Sub(t0)
	close1() // node 1 lets its clients go: the table lives on node 2 now

	waitAcked(c.acked.Load() + 100)
	close(stop)
	if err := <-runErr; err != nil {
		tb.Fatal(err)
	}
	after := c.acked.Load() - before
	if c.reconnects == 0 || before == 0 || after < 100 {
		tb.Fatalf("%d operations before the move, %d after, %d reconnects", before, after, c.reconnects)
	}
	// Every acknowledged operation is on node 2, unless a later one
	// overwrote its slot; and node 1's copy was frozen in time.
	for slot, v := range c.last {
		mr := t2.Lookup(gowarp.STag(c.stags[slot[0]]))
		if mr == nil || mr.Addr() != c.addrs[slot[0]] {
			tb.Fatalf("node 2 has no region %d under STag %#x", slot[0], c.stags[slot[0]])
		}
		for i := 0; i < migSlot; i += 8 {
			if got := binary.LittleEndian.Uint64(mr.Bytes()[slot[1]+i:]); got != v {
				tb.Fatalf("region %d offset %d on node 2 holds %#x, the client's last acknowledged write there was %#x", slot[0], slot[1]+i, got, v)
			}
		}
	}
	return pause, st, c
}

// TestMigrateUnderLoad: 16 regions of 64 KiB move from node 1 to node 2
// while the client writes and reads them; the client's operations after
// its reconnect, with the STags it held, succeed and see the data, and no
// acknowledged one is lost.
func TestMigrateUnderLoad(t *testing.T) {
	pause, st, c := migrateUnderLoad(t, 16, 64<<10)
	t.Logf("moved %d regions, %d bytes: pause %v (drain %v, export %v); %d operations, %d reconnects",
		st.Regions, st.Bytes, pause, st.Drain, st.Copy, c.acked.Load(), c.reconnects)
}

// BenchmarkMigrate64MiB is the migration of 64 MiB in 16 regions across
// the veth link under the client's load: pause-ms is from the freeze to
// the end of the import on node 2.
func BenchmarkMigrate64MiB(b *testing.B) {
	for range b.N {
		pause, st, _ := migrateUnderLoad(b, 16, 4<<20)
		b.ReportMetric(float64(pause.Microseconds())/1000, "pause-ms")
		b.ReportMetric(float64(st.Drain.Microseconds())/1000, "drain-ms")
		b.ReportMetric(float64(st.Copy.Microseconds())/1000, "export-ms")
	}
}

// TestMigrateBadImport: through the API, a truncated or corrupt stream
// and an import over STags in use register nothing; an exported table
// refuses local writes and registrations until Thaw, and keeps serving
// its regions' bytes.
func TestMigrateBadImport(t *testing.T) {
	ctx := context.Background()
	dev := gowarp.Open()
	src := dev.DefaultTable()
	pd := dev.AllocPD()
	mr, err := pd.Register([]byte("the table's only region"), gowarp.RemoteRead|gowarp.RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	st, err := src.Export(ctx, &b)
	if err != nil || st.Regions != 1 || st.PDs != 1 {
		t.Fatalf("export: %+v, %v", st, err)
	}
	stream := b.Bytes()
	if _, err := mr.WriteAt([]byte("x"), 0); !errors.Is(err, gowarp.ErrTableFrozen) {
		t.Errorf("WriteAt on an exported table: %v", err)
	}
	if _, err := pd.Register(make([]byte, 8), gowarp.RemoteRead); !errors.Is(err, gowarp.ErrTableFrozen) {
		t.Errorf("Register on an exported table: %v", err)
	}
	if err := mr.Deregister(); !errors.Is(err, gowarp.ErrTableFrozen) {
		t.Errorf("Deregister on an exported table: %v", err)
	}
	for _, c := range []struct {
		name   string
		stream []byte
	}{
		{"truncated", stream[:len(stream)-5]},
		{"corrupt", append(bytes.Clone(stream[:40]), append([]byte{stream[40] ^ 1}, stream[41:]...)...)},
		{"empty", nil},
	} {
		other := gowarp.Open()
		if _, err := other.DefaultTable().Import(ctx, bytes.NewReader(c.stream), gowarp.ImportOptions{}); !errors.Is(err, gowarp.ErrBadExport) || other.DefaultTable().Len() != 0 {
			t.Errorf("%s stream: %v, %d regions", c.name, err, other.DefaultTable().Len())
		}
	}
	dst, _ := gowarp.Open().Table(gowarp.TenantIdentity("t"))
	imp, err := dst.Import(ctx, bytes.NewReader(stream), gowarp.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := imp.MR(mr.STag()); got == nil || string(got.Bytes()) != "the table's only region" || imp.PD(mr.STag()) == nil || imp.From != "default" {
		t.Fatalf("imported %+v", imp)
	}
	if _, err := dst.Import(ctx, bytes.NewReader(stream), gowarp.ImportOptions{}); !errors.Is(err, gowarp.ErrIndexInUse) || dst.Len() != 1 {
		t.Errorf("import over an STag in use: %v, %d regions", err, dst.Len())
	}
	src.Thaw()
	if _, err := mr.WriteAt([]byte("T"), 0); err != nil {
		t.Errorf("WriteAt after Thaw: %v", err)
	}
}
