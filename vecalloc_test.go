package gowarp_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestManyBuffers: Writes, Sends and Reads from and into regions of many
// buffers (RegisterBuffers) carry the right bytes and allocate nothing in
// steady state, small ones (copied into the queue pair's own batch) and
// large ones (whose FPDUs need more vectors than a batch holds) alike.
func TestManyBuffers(t *testing.T) { manyBuffers(t, gowarp.ConnectOptions{}) }

// TestAdapterSharedMemoryManyBuffers is TestManyBuffers over a
// shared-memory link.
func TestAdapterSharedMemoryManyBuffers(t *testing.T) {
	manyBuffers(t, gowarp.ConnectOptions{SharedMemory: true})
}

func manyBuffers(t *testing.T, o gowarp.ConnectOptions) {
	if testing.Short() {
		t.Skip("allocation counts are meaningless under -short")
	}
	pieces := func(n, size int) [][]byte {
		bufs := make([][]byte, n)
		for i := range bufs {
			bufs[i] = make([]byte, size)
		}
		return bufs
	}
	flat := func(bufs [][]byte) []byte { return bytes.Join(bufs, nil) }
	fill := func(b []byte, seed int) {
		for i := range b {
			b[i] = byte(i*7 + i/251 + seed)
		}
	}
	for _, crc := range []bool{false, true} {
		o.CRC = crc
		p := newPair(t, o)
		wantTransport(t, p, o)
		const acc = gowarp.LocalWrite | gowarp.RemoteRead | gowarp.RemoteWrite
		small, big := pieces(64, 4), pieces(4096, 16) // 256 B and 64 KiB
		smr, err := p.pd.RegisterBuffers(small, acc, gowarp.RegisterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		bmr, err := p.pd.RegisterBuffers(big, acc, gowarp.RegisterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		one, onebuf := p.reg(t, 64<<10, acc) // one buffer
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var wc [1]gowarp.Completion
		waitOne := func(cq *gowarp.CQ) {
			t.Helper()
			for cq.Poll(wc[:]) == 0 {
				if err := cq.Wait(ctx); err != nil {
					t.Fatalf("waiting for a completion: %v", err)
				}
			}
			if wc[0].Status != gowarp.Success {
				t.Fatalf("completion %+v", wc[0])
			}
		}
		sge := func(mr *gowarp.MR, off, n int) []gowarp.SGE { return []gowarp.SGE{{MR: mr, Offset: off, Length: n}} }
		for _, tc := range []struct {
			name     string
			wr       gowarp.SendWR
			byB      bool     // b posts it (a Read of a's memory)
			recv     bool     // b posts this receive first
			src, dst [][]byte // the memory it copies from and into
			soff     int      // at these offsets
			doff, n  int
		}{
			{name: "write", wr: gowarp.SendWR{Op: gowarp.OpWrite, SGL: sge(smr, 2, 150), RemoteAddr: one.Addr(), RKey: one.STag()},
				src: small, soff: 2, dst: [][]byte{onebuf}, n: 150},
			{name: "send", wr: gowarp.SendWR{Op: gowarp.OpSend, SGL: sge(smr, 2, 150)}, recv: true,
				src: small, soff: 2, dst: [][]byte{onebuf}, n: 150},
			{name: "read", wr: gowarp.SendWR{Op: gowarp.OpRead, SGL: sge(one, 0, 150), RemoteAddr: smr.Addr() + 2, RKey: smr.STag()}, byB: true,
				src: small, soff: 2, dst: [][]byte{onebuf}, n: 150},
			{name: "big-write", wr: gowarp.SendWR{Op: gowarp.OpWrite, SGL: sge(bmr, 0, 64<<10), RemoteAddr: one.Addr(), RKey: one.STag()},
				src: big, dst: [][]byte{onebuf}, n: 64 << 10},
			{name: "big-send", wr: gowarp.SendWR{Op: gowarp.OpSend, SGL: sge(bmr, 8, 60<<10)}, recv: true,
				src: big, soff: 8, dst: [][]byte{onebuf}, n: 60 << 10},
			{name: "big-read", wr: gowarp.SendWR{Op: gowarp.OpRead, SGL: sge(one, 0, 64<<10), RemoteAddr: bmr.Addr(), RKey: bmr.STag()}, byB: true,
				src: big, dst: [][]byte{onebuf}, n: 64 << 10},
			// Into regions of many buffers: placement scatters.
			{name: "write-into", wr: gowarp.SendWR{Op: gowarp.OpWrite, SGL: sge(one, 0, 150), RemoteAddr: smr.Addr() + 2, RKey: smr.STag()},
				src: [][]byte{onebuf}, dst: small, doff: 2, n: 150},
			{name: "big-write-into", wr: gowarp.SendWR{Op: gowarp.OpWrite, SGL: sge(one, 0, 64<<10), RemoteAddr: bmr.Addr(), RKey: bmr.STag()},
				src: [][]byte{onebuf}, dst: big, n: 64 << 10},
			{name: "big-read-into", wr: gowarp.SendWR{Op: gowarp.OpRead, SGL: sge(bmr, 4, 60<<10), RemoteAddr: one.Addr(), RKey: one.STag()}, byB: true,
				src: [][]byte{onebuf}, dst: big, doff: 4, n: 60 << 10},
		} {
			from, fromCQ := p.a, p.acq
			if tc.byB {
				from, fromCQ = p.b, p.bcq
			}
			// A Write's completion says the socket took it: b waits for
			// its target's bytes to land, receiving inline.
			var target *gowarp.MR
			if tc.wr.Op == gowarp.OpWrite {
				target = one
				if tc.name == "write-into" {
					target = smr
				} else if tc.name == "big-write-into" {
					target = bmr
				}
			}
			run := func() {
				if tc.recv {
					if err := p.b.PostRecv(&gowarp.RecvWR{SGL: sge(one, 0, 64<<10)}); err != nil {
						t.Fatal(err)
					}
				}
				var want uint64
				if target != nil {
					want = target.Placed() + uint64(tc.n) // Read Responses count too
				}
				wr := tc.wr
				wr.Flags = gowarp.Signaled
				if err := from.PostSend(&wr); err != nil {
					t.Fatal(err)
				}
				waitOne(fromCQ)
				if tc.recv {
					waitOne(p.bcq)
				}
				for target != nil && target.Placed() < want {
					if err := p.b.Progress(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			// The bytes: fresh ones in the source, none in the target.
			for i, b := range tc.src {
				fill(b, i)
			}
			for _, b := range tc.dst {
				clear(b)
			}
			run()
			if got, want := flat(tc.dst)[tc.doff:tc.doff+tc.n], flat(tc.src)[tc.soff:tc.soff+tc.n]; !bytes.Equal(got, want) {
				t.Fatalf("crc %v %s: the target's %d bytes differ from the source's", crc, tc.name, tc.n)
			}
			for range 20 {
				run()
			}
			if n := testing.AllocsPerRun(200, run); n != 0 {
				t.Errorf("crc %v %s of %d bytes: %.2f allocations per operation", crc, tc.name, tc.n, n)
			}
		}
	}
}
