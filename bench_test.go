package gowarp_test

import (
	"context"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/gowarp/gowarp"
)

// benchWrite keeps depth Writes of size bytes in flight, signaling one in
// every depth/2.
func benchWrite(b *testing.B, size, depth int, o gowarp.ConnectOptions) {
	benchWriteOn(b, newPair(b, o), size, depth)
}

func benchWriteOn(b *testing.B, p *pair, size, depth int) { benchWriteHook(b, p, size, depth, nil) }

// benchWriteHook is benchWriteOn calling each, if not nil, before the
// i-th post with the Writes' target.
func benchWriteHook(b *testing.B, p *pair, size, depth int, each func(i int, dst *gowarp.MR)) {
	src, _ := p.reg(b, size, 0)
	dst, _ := p.reg(b, size, gowarp.RemoteWrite)
	wr := gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}
	var wc [64]gowarp.Completion
	sig := max(1, depth/2)
	outstanding := 0
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		wr.Flags = 0
		if i%sig == sig-1 || i == b.N-1 {
			wr.Flags = gowarp.Signaled
		}
		for outstanding >= depth {
			n := p.acq.Poll(wc[:])
			if n == 0 {
				p.acq.Wait(context.Background())
			}
			outstanding -= n * sig
		}
		if each != nil {
			each(i, dst)
		}
		if err := p.a.PostSend(&wr); err != nil {
			b.Fatal(err)
		}
		outstanding++
	}
	for outstanding > 0 && p.a.Err() == nil {
		n := p.acq.Poll(wc[:])
		if n == 0 {
			p.acq.Wait(context.Background())
		}
		outstanding -= n * sig
	}
	b.StopTimer()
	// The last Writes must have landed for the figure to be honest.
	for dst.Placed() < uint64(size)*uint64(b.N) && p.b.Err() == nil {
		runtime.Gosched()
	}
}

func BenchmarkWrite64K(b *testing.B)    { benchWrite(b, 64<<10, 32, gowarp.ConnectOptions{}) }
func BenchmarkWrite64KCRC(b *testing.B) { benchWrite(b, 64<<10, 32, gowarp.ConnectOptions{CRC: true}) }
func BenchmarkWrite64(b *testing.B)     { benchWrite(b, 64, 64, gowarp.ConnectOptions{}) }

// BenchmarkWriteAcked: Writes in Acked mode, one at a time (each waited
// for before the next, as an application that reuses its buffer does)
// and 32 in flight. One at a time, each completion waits for the
// transmit goroutine's look at the acknowledgements; with the runtime's
// timers, which sleep a whole millisecond where 50 µs is asked for, 4 KiB
// went at 1.1 k/s (see finetimer.go).
func BenchmarkWriteAcked(b *testing.B) {
	for _, c := range []struct {
		name        string
		size, depth int
	}{{"4K", 4 << 10, 1}, {"1M", 1 << 20, 1}, {"64Kx32", 64 << 10, 32}} {
		b.Run(c.name, func(b *testing.B) {
			p := newIdlePairMode(b, 1024, gowarp.Acked, false)
			b.Cleanup(func() { p.a.Close(); p.b.Close() })
			p.connect(b, gowarp.ConnectOptions{}, gowarp.ConnectOptions{})
			benchWriteOn(b, p, c.size, c.depth)
		})
	}
}

// BenchmarkWrite64KSnapshot is BenchmarkWrite64K with a snapshot of the
// target open (its pages are copied by the first Write, then written in
// place); BenchmarkWrite64KSnapshots takes a new snapshot every 16
// Writes, each of whose pages the next Write copies.
func BenchmarkWrite64KSnapshot(b *testing.B)  { benchWriteSnap(b, 64<<10, 0) }
func BenchmarkWrite64KSnapshots(b *testing.B) { benchWriteSnap(b, 64<<10, 16) }
func BenchmarkWrite64Snapshot(b *testing.B)   { benchWriteSnap(b, 64, 0) }

// benchWriteSnap runs benchWrite with a snapshot of the target open,
// replaced by a new one every every Writes (0: never).
func benchWriteSnap(b *testing.B, size, every int) {
	var s *gowarp.Snapshot
	take := func(dst *gowarp.MR) {
		if s != nil {
			s.Close()
		}
		var err error
		if s, err = dst.Snapshot(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	depth := 32
	if size < 1024 {
		depth = 64
	}
	benchWriteHook(b, newPair(b, gowarp.ConnectOptions{}), size, depth, func(i int, dst *gowarp.MR) {
		if i == 0 || every > 0 && i%every == 0 {
			take(dst)
		}
	})
	if s != nil {
		s.Close()
	}
}

// BenchmarkTCP64K is the floor: one plain TCP write of 64 KiB per message.
func BenchmarkTCP64K(b *testing.B) { benchTCP(b, 64<<10) }
func BenchmarkTCP64(b *testing.B)  { benchTCP(b, 64) }

func benchTCP(b *testing.B, size int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	benchTCPOn(b, ln, c, size)
}

// benchTCPOn streams size-byte writes over c to the listener's one
// connection.
func benchTCPOn(b *testing.B, ln net.Listener, c net.Conn, size int) {
	defer ln.Close()
	done := make(chan int64)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, size)
		var n int64
		for {
			k, err := io.ReadFull(c, buf)
			n += int64(k)
			if err != nil {
				done <- n
				return
			}
		}
	}()
	msg := make([]byte, size)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	<-done
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mmsg/s")
	c.Close()
}

// benchSend streams size-byte Sends in bursts of burst work requests
// posted with one doorbell (PostSendList, or Prepared.PostN when prepared),
// the last of each burst signaled, at most depth bursts in flight; the
// receiver reposts its receives as they complete.
func benchSend(b *testing.B, size, burst int, prepared bool) {
	const depth = 4
	p := newPair(b, gowarp.ConnectOptions{})
	src, _ := p.reg(b, size, 0)
	rdepth := 2 * depth * burst
	rmr, _ := p.reg(b, size*rdepth, gowarp.LocalWrite)
	ctx := context.Background()
	for i := range rdepth {
		p.b.PostRecv(&gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: rmr, Offset: i * size, Length: size}}})
	}
	wrs := make([]gowarp.SendWR, burst)
	for i := range wrs {
		wrs[i] = gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: src, Length: size}}}
	}
	wrs[burst-1].Flags = gowarp.Signaled
	pre, err := p.a.Prepare(&wrs[0])
	if err != nil {
		b.Fatal(err)
	}
	defer pre.Release()
	// The receiver reposts each receive as it completes and counts, so the
	// sender never has more Sends unreceived than receives are posted
	// (iWARP has no flow control of its own: a Send without a receive is
	// fatal).
	var received atomic.Int64
	n := (b.N + burst - 1) / burst * burst
	done := make(chan int)
	go func() {
		var wc [64]gowarp.Completion
		var re [64]gowarp.RecvWR
		got := 0
		for got < n {
			k := p.bcq.Poll(wc[:])
			if k == 0 {
				if p.bcq.Wait(ctx) != nil {
					break
				}
				continue
			}
			for j, c := range wc[:k] {
				if c.Status != gowarp.Success {
					done <- got
					return
				}
				re[j] = gowarp.RecvWR{ID: c.ID, SGL: []gowarp.SGE{{MR: rmr, Offset: int(c.ID) * size, Length: size}}}
			}
			p.b.PostRecvList(re[:k])
			got += k
			received.Store(int64(got))
		}
		done <- got
	}()
	var wc [64]gowarp.Completion
	outstanding := 0
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < n; i += burst {
		for outstanding >= depth {
			k := p.acq.Poll(wc[:])
			if k == 0 {
				p.acq.Wait(ctx)
			}
			outstanding -= k
		}
		for int64(i+burst)-received.Load() > int64(rdepth) {
			runtime.Gosched()
		}
		if prepared {
			_, err = pre.PostN(uint64(i), burst, true)
		} else {
			_, err = p.a.PostSendList(wrs)
		}
		if err != nil {
			b.Fatal(err)
		}
		outstanding++
	}
	if got := <-done; got != n {
		b.Fatalf("received %d of %d (%v)", got, n, p.b.Err())
	}
	b.StopTimer()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds()/1e6, "Mmsg/s")
}

func BenchmarkSend64(b *testing.B)            { benchSend(b, 64, 1, false) }
func BenchmarkSend64x16(b *testing.B)         { benchSend(b, 64, 16, false) }
func BenchmarkSend64x16Prepared(b *testing.B) { benchSend(b, 64, 16, true) }

// BenchmarkSendLat is a Send/Receive ping-pong of 8 bytes between two QPs
// of one process; ns/op is one round trip.
func BenchmarkSendLat(b *testing.B) {
	p := newPair(b, gowarp.ConnectOptions{})
	am, _ := p.reg(b, 8, gowarp.LocalWrite)
	bm, _ := p.reg(b, 8, gowarp.LocalWrite)
	ctx := context.Background()
	p.a.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: am, Length: 8}}})
	p.b.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: bm, Length: 8}}})
	recvOne := func(qp *gowarp.QP, cq *gowarp.CQ, mr *gowarp.MR) {
		var wc [1]gowarp.Completion
		for cq.Poll(wc[:]) == 0 {
			cq.Wait(ctx)
		}
		qp.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: mr, Length: 8}}})
	}
	go func() {
		send := gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: bm, Length: 8}}}
		for range b.N {
			recvOne(p.b, p.bcq, bm)
			p.b.PostSend(&send)
		}
	}()
	send := gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: am, Length: 8}}}
	b.ResetTimer()
	for range b.N {
		p.a.PostSend(&send)
		recvOne(p.a, p.acq, am)
	}
}

// BenchmarkTCPLat is the plain TCP ping-pong of 8 bytes.
func BenchmarkTCPLat(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.(*net.TCPConn).SetNoDelay(true)
		buf := make([]byte, 8)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			c.Write(buf)
		}
	}()
	c, _ := net.Dial("tcp", ln.Addr().String())
	defer c.Close()
	buf := make([]byte, 8)
	b.ResetTimer()
	for range b.N {
		c.Write(buf)
		io.ReadFull(c, buf)
	}
}

// BenchmarkWriteLat is perftest's ib_write_lat over TCP loopback: an 8-byte
// Write each way, each side receiving in its own goroutine (QP.Progress);
// ns/op is one round trip. Compare BenchmarkTCPLat.
func BenchmarkWriteLat(b *testing.B) { benchWriteLat(b, gowarp.ConnectOptions{}) }
