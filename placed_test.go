package gowarp_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestWaitPlaced: waiters for several counts of a region's placed bytes
// wake as peers' Writes land, see the bytes, and a wait ends with its
// context or with the region's deregistration.
func TestWaitPlaced(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	dst, dbuf := p.reg(t, 8192, gowarp.RemoteWrite)
	src, sbuf := p.reg(t, 8192, 0)
	fillPattern(sbuf, 5)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	errs := make(chan error, 2)
	for _, n := range []uint64{1000, 3000} {
		go func() {
			err := dst.WaitPlaced(ctx, n)
			if err == nil && dst.Placed() < n {
				err = errors.New("woken early")
			}
			errs <- err
		}()
	}
	for i, w := range []struct{ off, n int }{{0, 1000}, {1000, 2000}} {
		if err := p.a.PostSend(&gowarp.SendWR{ID: uint64(i), Op: gowarp.OpWrite,
			SGL:        []gowarp.SGE{{MR: src, Offset: w.off, Length: w.n}},
			RemoteAddr: dst.Addr() + uint64(w.off), RKey: dst.STag()}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := dst.WaitPlaced(ctx, 3000); err != nil || !bytes.Equal(dbuf[:3000], sbuf[:3000]) {
		t.Fatalf("after the Writes: %v, bytes equal %v", err, bytes.Equal(dbuf[:3000], sbuf[:3000]))
	}

	cctx, ccancel := context.WithCancel(ctx)
	go func() { errs <- dst.WaitPlaced(cctx, 1<<20) }()
	ccancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer dcancel()
	if err := dst.WaitPlaced(dctx, 1<<20); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait past its deadline: %v", err)
	}

	go func() { errs <- dst.WaitPlaced(ctx, 1<<20) }()
	time.Sleep(5 * time.Millisecond) // let it wait (either order must end well)
	if err := dst.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; !errors.Is(err, gowarp.ErrRegionInvalid) {
		t.Fatalf("wait on a region deregistered meanwhile: %v", err)
	}
}
