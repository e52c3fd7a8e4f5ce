package cache

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// gatedConn is a connection whose reads wait while the gate is shut: the
// peer's transmit backs up behind it as behind a reader that is slow.
type gatedConn struct {
	net.Conn
	open chan struct{} // closed: reads go through
	shut chan struct{} // closed: reads wait for open
}

func (c *gatedConn) Read(b []byte) (int, error) {
	select {
	case <-c.shut:
		<-c.open
	default:
	}
	return c.Conn.Read(b)
}

// TestReuseWaitsForReads: a block freed while Reads through its old key
// are still being answered (their reader slow to take the bytes) is not
// reused until they end, so the reader gets the old value's bytes, never
// the new value's under the old header.
func TestReuseWaitsForReads(t *testing.T) {
	const bs = 1 << 20
	addr, srv := serveT(t, ServerOptions{BlockSize: bs})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := Dial(ctx, addr, ClientOptions{Logger: discard, Lookup: LookupControl})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	size := bs - HeaderLen
	a := bytes.Repeat([]byte{0xaa}, size)
	if err := cl.Put(ctx, "a", a, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	ea, err := cl.Lookup(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(ea.Addrs) != 1 {
		t.Fatalf("%d pieces", len(ea.Addrs))
	}
	pa := ea.Addrs[0]

	// The slow reader: its own queue pair over a connection whose reads
	// stop once it is connected.
	dev := gowarp.Open(gowarp.WithLogger(discard))
	pd := dev.AllocPD()
	cq := dev.NewCQ(128)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	gc := &gatedConn{Conn: raw, open: make(chan struct{}), shut: make(chan struct{})}
	if err := qp.ConnectConn(ctx, gc, gowarp.ConnectOptions{PrivateData: goodHello(), ORD: 16}); err != nil {
		t.Fatal(err)
	}
	const reads = 16 // 16 MiB: more than the sockets' buffers hold
	dst, err := pd.Register(make([]byte, reads*size), gowarp.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	close(gc.shut)
	for i := range reads {
		wr := gowarp.SendWR{ID: uint64(i), Op: gowarp.OpRead, Flags: gowarp.Signaled,
			RemoteAddr: pa.Off + HeaderLen, RKey: gowarp.STag(pa.STag),
			SGL: []gowarp.SGE{{MR: dst, Offset: i * size, Length: size}}}
		if err := qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	// The server's transmit fills the sockets and waits, holding the
	// block: wait until it does, so that the reuse below meets a Read
	// under way however slow the host.
	srv.st.mu.Lock()
	var mr *gowarp.MR
	for _, b := range srv.st.blocks {
		if b.stag()>>8 == pa.STag>>8 {
			mr = b.mr
		}
	}
	srv.st.mu.Unlock()
	if mr == nil {
		t.Fatalf("no block of STag %#x", pa.STag)
	}
	for !mr.InUse() {
		if ctx.Err() != nil {
			t.Fatal("the server never began answering the Reads")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // and let the sockets fill

	// a's block is freed, and a value as large wants a block.
	if err := cl.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	b := bytes.Repeat([]byte{0xbb}, size)
	if err := cl.Put(ctx, "b", b, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	eb, err := cl.Lookup(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if eb.Addrs[0].STag>>8 == pa.STag>>8 {
		t.Errorf("b went into a's block (STag index %#x) while Reads of a were under way", pa.STag>>8)
	}

	close(gc.open)
	var wc [16]gowarp.Completion
	for got := 0; got < reads; {
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("after %d of %d Reads: %v", got, reads, err)
		}
		for _, w := range wc[:cq.Poll(wc[:])] {
			got++
			if w.Err() != nil {
				continue // a Read that failed is allowed; one that brings b's bytes is not
			}
			if v := dst.Bytes()[int(w.ID)*size : (int(w.ID)+1)*size]; !bytes.Equal(v, a) {
				n := 0
				for _, c := range v {
					if c != 0xaa {
						n++
					}
				}
				t.Errorf("Read %d of a's block brought %d bytes that are not a's", w.ID, n)
			}
		}
	}
}
