package gowarp_test

import (
	"context"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// Shared-memory link against TCP loopback, between two queue pairs of
// one process (cmd/gowarp perf -shm measures two processes).

var shmOpts = gowarp.ConnectOptions{SharedMemory: true}

func BenchmarkSharedMemoryWrite64K(b *testing.B) { benchWrite(b, 64<<10, 32, shmOpts) }
func BenchmarkSharedMemoryWrite1M(b *testing.B)  { benchWrite(b, 1<<20, 8, shmOpts) }
func BenchmarkSharedMemoryWriteLat(b *testing.B) { benchWriteLat(b, shmOpts) }

// BenchmarkSharedMemoryVsTCP runs the same Writes and ping-pong over
// both links in one run.
func BenchmarkSharedMemoryVsTCP(b *testing.B) {
	for _, l := range []struct {
		name string
		o    gowarp.ConnectOptions
	}{{"tcp", gowarp.ConnectOptions{}}, {"shm", shmOpts}} {
		b.Run("write64K/"+l.name, func(b *testing.B) { benchWrite(b, 64<<10, 32, l.o) })
		b.Run("write1M/"+l.name, func(b *testing.B) { benchWrite(b, 1<<20, 8, l.o) })
		b.Run("writeLat8/"+l.name, func(b *testing.B) { benchWriteLat(b, l.o) })
	}
}

// benchWriteLat is a ping-pong of 8-byte RDMA Writes, each side watching
// its target's Placed count with QP.Progress (as write_lat does); ns/op
// is one round trip.
func benchWriteLat(b *testing.B, o gowarp.ConnectOptions) {
	p := newPair(b, o)
	am, _ := p.reg(b, 8, gowarp.RemoteWrite)
	bm, _ := p.reg(b, 8, gowarp.RemoteWrite)
	ctx := context.Background()
	wait := func(qp *gowarp.QP, mr *gowarp.MR, n uint64) {
		for mr.Placed() < n {
			if err := qp.Progress(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	}
	write := func(qp *gowarp.QP, from, to *gowarp.MR) {
		wr := gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: from, Length: 8}}, RemoteAddr: to.Addr(), RKey: to.STag()}
		if err := qp.PostSend(&wr); err != nil {
			b.Error(err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range b.N {
			wait(p.b, bm, uint64(i+1)*8)
			write(p.b, bm, am)
		}
	}()
	b.ResetTimer()
	for i := range b.N {
		write(p.a, am, bm)
		wait(p.a, am, uint64(i+1)*8)
	}
	b.StopTimer()
	<-done
}

// BenchmarkSharedMemoryIdle reports the CPU two connected, idle queue
// pairs use (both sides' readers asleep on the connection), per second
// idle, after one Write each way, against TCP's.
func BenchmarkSharedMemoryIdle(b *testing.B) {
	for _, l := range []struct {
		name string
		o    gowarp.ConnectOptions
	}{{"tcp", gowarp.ConnectOptions{}}, {"shm", shmOpts}} {
		b.Run(l.name, func(b *testing.B) {
			p := newPair(b, l.o)
			am, _ := p.reg(b, 8, gowarp.RemoteWrite)
			bm, _ := p.reg(b, 8, gowarp.RemoteWrite)
			ctx := context.Background()
			p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: am, Length: 8}}, RemoteAddr: bm.Addr(), RKey: bm.STag()})
			p.b.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: bm, Length: 8}}, RemoteAddr: am.Addr(), RKey: am.STag()})
			am.WaitPlaced(ctx, 8)
			bm.WaitPlaced(ctx, 8)
			time.Sleep(10 * time.Millisecond) // past the spinning
			b.ResetTimer()
			cpu0 := cpuTime()
			for range b.N {
				time.Sleep(100 * time.Millisecond)
			}
			cpu := cpuTime() - cpu0
			b.ReportMetric(float64(cpu.Microseconds())/(float64(b.N)/10), "cpu-µs/s-idle")
		})
	}
}
