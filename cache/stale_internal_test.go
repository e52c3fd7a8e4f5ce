package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestStaleReadKeepsConnection: a Read through the address of a block
// that was reused since fails with ErrStale for that call alone: the
// connection it went over, which other calls share, lives on (the old
// key is retired, not revoked: an invalid STag's Terminate ended it).
func TestStaleReadKeepsConnection(t *testing.T) {
	const bs = 64 << 10
	addr, _ := serveT(t, ServerOptions{BlockSize: bs, Budget: 2 * bs})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, ClientOptions{Logger: discard, Conns: 1, Lookup: LookupControl})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	v := bytes.Repeat([]byte{0x5a}, 40<<10)
	if err := c.Put(ctx, "a", v, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	e, err := c.Lookup(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// "a" paged out, then replaced, and its block filled again with
	// other values (as in TestStaleAfterPaging).
	for i := range 4 {
		k := fmt.Sprintf("f%d", i)
		if err := c.Put(ctx, k, bytes.Repeat([]byte{byte(i + 10)}, 40<<10), PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Lookup(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Put(ctx, "a", []byte("small now"), PutOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		k := fmt.Sprintf("g%d", i)
		if err := c.Put(ctx, k, bytes.Repeat([]byte{byte(i)}, 40<<10), PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Lookup(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	cc, err := c.conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dst, _ := c.PD().Register(make([]byte, len(v)), gowarp.LocalWrite)
	for range 3 {
		if _, err := c.ReadEntry(ctx, e, dst, 0, len(v), 0); !errors.Is(err, ErrStale) {
			t.Fatalf("read through a reused block: %v, want ErrStale", err)
		}
		if bytes.Equal(dst.Bytes()[:100], v[:100]) {
			t.Fatal("a stale read returned the old value's bytes")
		}
	}
	if got, err := c.conn(ctx); err != nil || got != cc || cc.failed() {
		t.Fatalf("the connection after stale reads: same %v, failed %v, %v", got == cc, cc.failed(), err)
	}
	if got, err := c.Get(ctx, "a"); err != nil || string(got) != "small now" {
		t.Fatalf("get a: %q, %v", got, err)
	}
}

// TestFailedDialsLeaveNothing: dials that fail (the server gone) leave
// no region registered, nor do the calls that redial after it left.
func TestFailedDialsLeaveNothing(t *testing.T) {
	addr, srv := serveT(t, ServerOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dev := gowarp.Open(gowarp.WithLogger(discard))
	c, err := Dial(ctx, addr, ClientOptions{Device: dev, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, "k", []byte("v"), PutOptions{}); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	for range 5 {
		if _, err := c.Get(ctx, "k"); err == nil {
			t.Fatal("a get after the server closed succeeded")
		}
		if _, err := Dial(ctx, addr, ClientOptions{Device: dev, Logger: discard}); err == nil {
			t.Fatal("a dial after the server closed succeeded")
		}
	}
	c.Close()
	if n := dev.DefaultTable().Len(); n != 0 {
		t.Fatalf("%d regions left registered", n)
	}
}
