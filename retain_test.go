package gowarp_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestClosedQPHoldsNoMemory: a closed queue pair, which the device's
// events name (and an application may keep in a map), holds none of the
// memory its work used once the regions are deregistered: a server whose
// events nobody reads would otherwise keep its last 256 clients' buffers.
func TestClosedQPHoldsNoMemory(t *testing.T) {
	var freed atomic.Int32
	var which [4]atomic.Bool
	nreg := 0
	kept := func() (*gowarp.QP, *gowarp.QP) {
		p := newPair(t, gowarp.ConnectOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		const n = 1 << 20
		var mrs []*gowarp.MR
		reg := func(acc gowarp.Access) *gowarp.MR {
			b := make([]byte, n)
			w := &which[nreg]
			nreg++
			runtime.AddCleanup(&b[0], func(w *atomic.Bool) { freed.Add(1); w.Store(true) }, w)
			mr, err := p.pd.Register(b, acc)
			if err != nil {
				t.Fatal(err)
			}
			mrs = append(mrs, mr)
			return mr
		}
		src, dst := reg(gowarp.LocalWrite), reg(gowarp.RemoteWrite|gowarp.RemoteRead)
		recv, sink := reg(gowarp.LocalWrite), reg(gowarp.LocalWrite)
		p.b.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: recv, Length: n}}})
		p.b.PostRecv(&gowarp.RecvWR{ID: 2, SGL: []gowarp.SGE{{MR: recv, Length: n}}}) // left to be flushed
		for _, wr := range []gowarp.SendWR{
			{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: n}}, RemoteAddr: dst.Addr(), RKey: dst.STag()},
			{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: sink, Length: n}}, RemoteAddr: dst.Addr(), RKey: dst.STag()},
			{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: src, Length: 1000}}},
		} {
			wr.Flags = gowarp.Signaled
			if err := p.a.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			if c := wait(t, p.acq); c.Status != gowarp.Success {
				t.Fatal(c.Status)
			}
		}
		if c := wait(t, p.bcq); c.Status != gowarp.Success {
			t.Fatal(c.Status)
		}
		if err := p.a.Disconnect(ctx); err != nil {
			t.Fatal(err)
		}
		p.a.Close()
		p.b.Close()
		for p.b.State() != gowarp.StateError {
			time.Sleep(time.Millisecond)
		}
		for _, mr := range mrs {
			for mr.Deregister() != nil {
				time.Sleep(time.Millisecond)
			}
		}
		return p.a, p.b
	}
	a, b := kept()
	for deadline := time.Now().Add(5 * time.Second); freed.Load() < 4; time.Sleep(10 * time.Millisecond) {
		runtime.GC()
		if time.Now().After(deadline) {
			var kept []string
			for i, name := range []string{"Write source", "Write target and Read source", "receive", "Read sink"} {
				if !which[i].Load() {
					kept = append(kept, name)
				}
			}
			t.Fatalf("%d of 4 buffers freed while their closed queue pairs are kept: kept %v", freed.Load(), kept)
		}
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}

// TestLiveQPForgetsDeregistered: a region deregistered after a queue pair
// posted work on it is not kept by the queue pair (its cache of
// work-request shapes keeps no region), while the queue pair lives on.
func TestLiveQPForgetsDeregistered(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	dst, _ := p.reg(t, 4096, gowarp.RemoteWrite)
	var freed atomic.Bool
	func() {
		b := make([]byte, 1<<20)
		runtime.AddCleanup(&b[0], func(f *atomic.Bool) { f.Store(true) }, &freed)
		src, err := p.pd.Register(b, gowarp.LocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		wr := gowarp.SendWR{Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 4096}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}
		if err := p.a.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, p.acq); c.Status != gowarp.Success {
			t.Fatal(c.Status)
		}
		if err := src.Deregister(); err != nil {
			t.Fatal(err)
		}
	}()
	for deadline := time.Now().Add(5 * time.Second); !freed.Load(); time.Sleep(10 * time.Millisecond) {
		runtime.GC()
		if time.Now().After(deadline) {
			t.Fatal("a deregistered region's memory is kept by the queue pair that used it")
		}
	}
	if p.a.State() != gowarp.StateReady {
		t.Fatal(p.a.State())
	}
}
