package gowarp_test

import (
	"context"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestHotPathAllocs: posting, transmitting, receiving, placing and
// completing Writes, Reads and Sends, signaled or not, allocates nothing in
// steady state, on either side of the connection; and so do RFC 7306's
// Writes and Sends with immediate data and atomics.
func TestHotPathAllocs(t *testing.T) { hotPathAllocs(t, gowarp.ConnectOptions{}) }

// hotPathAllocs is TestHotPathAllocs over connections made with o, with
// CRC off and on.
func hotPathAllocs(t *testing.T, o gowarp.ConnectOptions) { hotPathAllocsOf(t, o, false) }

// hotPathAllocsOf is hotPathAllocs with regions from PD.Alloc if alloc.
func hotPathAllocsOf(t *testing.T, o gowarp.ConnectOptions, alloc bool) {
	if testing.Short() {
		t.Skip("allocation counts are meaningless under -short")
	}
	for _, crc := range []bool{false, true} {
		o.CRC, o.Extensions = crc, true
		p := newPair(t, o)
		p.alloc = alloc
		wantTransport(t, p, o)
		src, _ := p.reg(t, 256<<10, gowarp.LocalWrite)
		dst, _ := p.reg(t, 256<<10, gowarp.RemoteWrite|gowarp.RemoteRead|gowarp.LocalWrite|gowarp.RemoteAtomic)
		recv, _ := p.reg(t, 256<<10, gowarp.LocalWrite)
		// One context for every wait (each queue pair registers it
		// once), bounding them: a lost wake-up fails the test, it does
		// not hang it.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var wc [4]gowarp.Completion
		waitOne := func(cq *gowarp.CQ) {
			for cq.Poll(wc[:1]) == 0 {
				if err := cq.Wait(ctx); err != nil {
					t.Fatalf("waiting for a completion: %v", err)
				}
			}
			if wc[0].Status != gowarp.Success {
				t.Fatalf("completion %+v", wc[0])
			}
		}
		for _, size := range []int{8, 64 << 10, 200 << 10} {
			sgl := []gowarp.SGE{{MR: src, Length: size / 2}, {MR: src, Offset: size / 2, Length: size - size/2}}
			rsgl := []gowarp.SGE{{MR: recv, Length: size}}
			for _, tc := range []struct {
				name string
				wr   gowarp.SendWR
			}{
				{"write", gowarp.SendWR{Op: gowarp.OpWrite, SGL: sgl, RemoteAddr: dst.Addr(), RKey: dst.STag()}},
				{"read", gowarp.SendWR{Op: gowarp.OpRead, SGL: []gowarp.SGE{{MR: recv, Length: size}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}},
				{"send", gowarp.SendWR{Op: gowarp.OpSend, SGL: sgl}},
				{"write-imm", gowarp.SendWR{Op: gowarp.OpWriteImm, SGL: sgl, RemoteAddr: dst.Addr(), RKey: dst.STag(), Imm: 7}},
				{"send-imm", gowarp.SendWR{Op: gowarp.OpSendImm, SGL: sgl, Imm: 8}},
				{"fetch-add", gowarp.SendWR{Op: gowarp.OpFetchAdd, SGL: []gowarp.SGE{{MR: recv, Length: 8}}, RemoteAddr: dst.Addr(), RKey: dst.STag(), CompareAdd: 1}},
				{"cmp-swap", gowarp.SendWR{Op: gowarp.OpCmpSwap, SGL: []gowarp.SGE{{MR: recv, Length: 8}}, RemoteAddr: dst.Addr(), RKey: dst.STag(), Swap: 2}},
			} {
				for _, signaled := range []bool{true, false} {
					wr := tc.wr
					run := func() {
						consumes := wr.Op == gowarp.OpSend || wr.Op == gowarp.OpWriteImm || wr.Op == gowarp.OpSendImm
						if consumes {
							p.b.PostRecv(&gowarp.RecvWR{SGL: rsgl})
							if !signaled {
								p.b.PostRecv(&gowarp.RecvWR{SGL: rsgl})
							}
						}
						if !signaled {
							// An unsignaled request, then a signaled one to know when it is done.
							wr.Flags = 0
							if err := p.a.PostSend(&wr); err != nil {
								t.Fatal(err)
							}
						}
						wr.Flags = gowarp.Signaled
						if err := p.a.PostSend(&wr); err != nil {
							t.Fatal(err)
						}
						waitOne(p.acq)
						if consumes {
							waitOne(p.bcq)
							if !signaled {
								waitOne(p.bcq)
							}
						}
					}
					for range 20 {
						run() // warm up: buffers, timers and goroutine stacks settle
					}
					if n := testing.AllocsPerRun(200, run); n != 0 {
						t.Errorf("crc %v %s %d bytes signaled %v: %.2f allocations per operation", crc, tc.name, size, signaled, n)
					}
				}
			}
		}
	}
}

// TestPreparedAndProgressAllocs: posting a prepared request (one and many
// per doorbell) and waiting for a one-sided Write with QP.Progress
// allocate nothing either.
func TestPreparedAndProgressAllocs(t *testing.T) {
	preparedAndProgressAllocs(t, gowarp.ConnectOptions{})
}

func preparedAndProgressAllocs(t *testing.T, o gowarp.ConnectOptions) {
	if testing.Short() {
		t.Skip("allocation counts are meaningless under -short")
	}
	p := newPair(t, o)
	wantTransport(t, p, o)
	src, _ := p.reg(t, 4096, 0)
	dst, _ := p.reg(t, 4096, gowarp.RemoteWrite)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // see hotPathAllocsOf
	defer cancel()
	pre, err := p.a.Prepare(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 64}}, RemoteAddr: dst.Addr(), RKey: dst.STag()})
	if err != nil {
		t.Fatal(err)
	}
	defer pre.Release()
	var wc [4]gowarp.Completion
	want := uint64(0)
	run := func() {
		if _, err := pre.PostN(1, 8, true); err != nil {
			t.Fatal(err)
		}
		want += 8 * 64
		for p.acq.Poll(wc[:1]) == 0 {
			if err := p.acq.Wait(ctx); err != nil {
				t.Fatalf("waiting for a completion: %v", err)
			}
		}
		// The target side waits for the Writes to land by receiving inline.
		for dst.Placed() < want {
			if err := p.b.Progress(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 20 {
		run()
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Errorf("%.2f allocations per prepared post and Progress wait", n)
	}
}
