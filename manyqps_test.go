package gowarp_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// BenchmarkManyQPs runs N client queue pairs in one process, each with its
// own CQ and a goroutine waiting on it (CQ.Wait with a cancellable
// context, as an application that can be shut down waits), each keeping
// eight signaled 4 KiB operations in flight, Writes and Reads alternately,
// against N server queue pairs. ops/s is the aggregate rate; it should
// hold as N grows (issue 7, defect 8). cpu-ns/op is the process's CPU time
// (both sides) per operation.
func BenchmarkManyQPs(b *testing.B) {
	for _, n := range benchNs([]int{1, 16, 64, 256}) {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchManyQPs(b, n, gowarp.ConnectOptions{}) })
	}
}

// BenchmarkManyQPsBusyPoll is BenchmarkManyQPs with a 10 µs busy poll on
// every queue pair (ConnectOptions.BusyPoll). On the 2-CPU VM this was
// measured on, N=256 lost 19-20 % of the best count's rate without it,
// as plain TCP did (BenchmarkManyTCP), most of it to idle CPU (11-12 %
// for both): a P that runs dry while another thread polls the network
// parks its thread (the runtime's sched.pollingNet), and Linux queued the
// woken thread on the busy CPU, where it waited up to a 4 ms tick (see
// README). A waiter that yields and reads again instead of parking keeps
// its P busy; the busy poll buys that with CPU where the peer is slow to
// answer, hence off by default.
func BenchmarkManyQPsBusyPoll(b *testing.B) {
	for _, n := range []int{16, 64, 256} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			benchManyQPs(b, n, gowarp.ConnectOptions{BusyPoll: 10 * time.Microsecond})
		})
	}
}

func benchManyQPs(b *testing.B, n int, o gowarp.ConnectOptions) { benchManyQPsWith(b, n, o, false) }

func benchManyQPsWith(b *testing.B, n int, o gowarp.ConnectOptions, loop bool) {
	const (
		size  = 4 << 10
		depth = 8
		warm  = 16 * depth // operations per queue pair before the timer
	)
	type client struct {
		p        *pair
		src, dst *gowarp.MR
		wr       [2]gowarp.SendWR
		loop     func() // posts and completes operations until left runs out
	}
	cs := make([]client, n)
	for i := range cs {
		c := &cs[i]
		c.p = newPair(b, o)
		c.src, _ = c.p.reg(b, size, gowarp.LocalWrite)
		c.dst, _ = c.p.reg(b, size, gowarp.RemoteWrite|gowarp.RemoteRead)
		c.wr[0] = gowarp.SendWR{Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: c.src, Length: size}}, RemoteAddr: c.dst.Addr(), RKey: c.dst.STag()}
		c.wr[1] = gowarp.SendWR{Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: c.src, Length: size}}, RemoteAddr: c.dst.Addr(), RKey: c.dst.STag()}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var left atomic.Int64 // operations still to post, over all clients
	var failed atomic.Value
	var wg sync.WaitGroup
	run := func() {
		for i := range cs {
			c := &cs[i]
			wg.Add(1)
			go c.loop()
		}
		wg.Wait()
	}
	for i := range cs {
		c := &cs[i]
		c.loop = func() {
			defer wg.Done()
			var wc [depth]gowarp.Completion
			inflight, k := 0, 0
			post := func() bool {
				if left.Add(-1) < 0 {
					return false
				}
				if err := c.p.a.PostSend(&c.wr[k&1]); err != nil {
					failed.Store(err)
					return false
				}
				k++
				inflight++
				return true
			}
			for inflight < depth && post() {
			}
			if loop {
				// The same, posting from the wait (QP.ProgressFunc).
				err := c.p.a.ProgressFunc(ctx, func() bool {
					for {
						m := c.p.acq.Poll(wc[:])
						if m == 0 {
							return inflight > 0
						}
						for _, w := range wc[:m] {
							if w.Status != gowarp.Success {
								failed.Store(fmt.Errorf("completion %v", w.Status))
								return false
							}
						}
						inflight -= m
						for range m {
							if !post() {
								break
							}
						}
					}
				})
				if err != nil {
					failed.Store(err)
				}
				return
			}
			for inflight > 0 {
				m := c.p.acq.Poll(wc[:])
				if m == 0 {
					if err := c.p.acq.Wait(ctx); err != nil {
						failed.Store(err)
						return
					}
					continue
				}
				for _, w := range wc[:m] {
					if w.Status != gowarp.Success {
						failed.Store(fmt.Errorf("completion %v", w.Status))
						return
					}
				}
				inflight -= m
				for range m {
					if !post() {
						break
					}
				}
			}
		}
	}
	// Warm-up, untimed: the free lists of every queue pair grow to what
	// depth operations in flight on all of them need (tens of MB at
	// N=256), and the heap to its steady size, so the timed run measures
	// the steady state and not those page faults and collections.
	measureMany(b, warm*n, &left, &failed, run)
}

// measureMany runs warm operations untimed, then b.N timed, each time by
// storing the count in left and calling run, and reports the rate and
// the process's CPU time per operation: the machine may be shared, and
// that shows the cost of the path whatever share of the CPUs it got.
func measureMany(b *testing.B, warm int, left *atomic.Int64, failed *atomic.Value, run func()) {
	left.Store(int64(warm))
	run()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	left.Store(int64(b.N))
	b.ResetTimer()
	cpu0 := cpuTime()
	run()
	b.StopTimer()
	cpu := cpuTime() - cpu0
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkManyQPsLoop is BenchmarkManyQPs with each client posting
// from its wait (QP.ProgressFunc polling its CQ) instead of waiting in
// CQ.Wait and posting after it returns.
func BenchmarkManyQPsLoop(b *testing.B) {
	for _, n := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchManyQPsWith(b, n, gowarp.ConnectOptions{}, true) })
	}
}

// BenchmarkManyQPsSharedCQ is BenchmarkManyQPs with one CQ for all the
// client queue pairs and one goroutine polling it, for comparison: no
// waiter receives inline there, the receive goroutines hand everything
// over.
func BenchmarkManyQPsSharedCQ(b *testing.B) {
	for _, n := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchManyQPsShared(b, n) })
	}
}

func benchManyQPsShared(b *testing.B, n int) {
	const (
		size  = 4 << 10
		depth = 8
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(2 * n * depth)
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	type client struct {
		qp       *gowarp.QP
		wr       [2]gowarp.SendWR
		inflight int
		k        int
	}
	cs := make([]client, n)
	qpIndex := map[*gowarp.QP]int{}
	for i := range cs {
		c := &cs[i]
		if c.qp, err = pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, SendDepth: 2 * depth}); err != nil {
			b.Fatal(err)
		}
		qpIndex[c.qp] = i
		spd := dev.AllocPD()
		scq := dev.NewCQ(16)
		sqp, err := spd.NewQP(gowarp.QPConfig{SendCQ: scq, RecvCQ: scq})
		if err != nil {
			b.Fatal(err)
		}
		dst, err := spd.Register(make([]byte, size), gowarp.RemoteWrite|gowarp.RemoteRead)
		if err != nil {
			b.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			req, err := ln.Accept(ctx)
			if err != nil {
				errc <- err
				return
			}
			errc <- req.Accept(ctx, sqp, gowarp.ConnectOptions{})
		}()
		if err := c.qp.Connect(ctx, ln.Addr().String(), gowarp.ConnectOptions{}); err != nil {
			b.Fatal(err)
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.qp.Close(); sqp.Close() })
		src, err := pd.Register(make([]byte, size), gowarp.LocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		c.wr[0] = gowarp.SendWR{Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}
		c.wr[1] = gowarp.SendWR{Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: size}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}
	}
	left := b.N
	post := func(c *client) {
		if left == 0 {
			return
		}
		left--
		if err := c.qp.PostSend(&c.wr[c.k&1]); err != nil {
			b.Fatal(err)
		}
		c.k++
		c.inflight++
	}
	b.ResetTimer()
	cpu0 := cpuTime()
	inflight := 0
	for i := range cs {
		for cs[i].inflight < depth && left > 0 {
			post(&cs[i])
			inflight++
		}
	}
	wc := make([]gowarp.Completion, 64)
	for inflight > 0 {
		m := cq.Poll(wc)
		if m == 0 {
			if err := cq.Wait(ctx); err != nil {
				b.Fatal(err)
			}
			continue
		}
		for _, w := range wc[:m] {
			if w.Status != gowarp.Success {
				b.Fatalf("completion %v", w.Status)
			}
			c := &cs[qpIndex[w.QP]]
			c.inflight--
			inflight--
			if left > 0 {
				post(c)
				inflight++
			}
		}
	}
	b.StopTimer()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkManyTCP's messages: a 4 KiB operation, eight in flight per
// connection, each after a header of 16 bytes whose first says which.
const (
	tcpOpSize = 4 << 10
	tcpDepth  = 8
	tcpHdr    = 16
)

// BenchmarkManyTCP is BenchmarkManyQPs's load on plain TCP, to tell what
// of its fall with N is the kernel's: N loopback connections, each client
// goroutine keeping eight 4 KiB operations in flight, alternately a Write
// (a 4 KiB message, done once written, as a Write completes once sent)
// and a Read (a request the server goroutine answers with 4 KiB, done when
// the answer is read). Each message is one write(2); both sides read
// through a 64 KiB buffer, as gowarp's receive path does.
func BenchmarkManyTCP(b *testing.B) {
	for _, n := range benchNs([]int{1, 16, 64, 256}) {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchManyTCP(b, n) })
	}
}

func benchManyTCP(b *testing.B, n int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // the server side: store Writes, answer Reads
				defer c.Close()
				r := bufio.NewReaderSize(c, 64<<10)
				msg := make([]byte, tcpHdr+tcpOpSize)
				for {
					if _, err := io.ReadFull(r, msg[:tcpHdr]); err != nil {
						return
					}
					if msg[0] == 'W' {
						if _, err := io.ReadFull(r, msg[tcpHdr:]); err != nil {
							return
						}
						continue
					}
					if _, err := c.Write(msg[tcpHdr:]); err != nil {
						return
					}
				}
			}()
		}
	}()
	measureManyTCP(b, ln.Addr().String(), n)
}

// measureManyTCP dials n connections to the BenchmarkManyTCP server at
// addr and measures their clients (manyTCPClient) as measureMany does,
// after an untimed warm-up, as BenchmarkManyQPs's: the sockets' buffers
// and the heap grow to their steady size before the timer starts.
func measureManyTCP(b *testing.B, addr string, n int) {
	conns := make([]net.Conn, n)
	readers := make([]*bufio.Reader, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns[i], readers[i] = c, bufio.NewReaderSize(c, 64<<10)
	}
	var left atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	run := func() {
		for i, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				manyTCPClient(c, readers[i], &left, &failed)
			}()
		}
		wg.Wait()
	}
	measureMany(b, 16*tcpDepth*n, &left, &failed, run)
}

// manyTCPClient is the client of BenchmarkManyTCP's connection c, read
// through r: it keeps eight operations in flight, alternately a Write (a
// 4 KiB message, done once written, as a Write completes once sent) and
// a Read (a 16-byte request, done when its 4 KiB answer is read), until
// left runs out.
func manyTCPClient(c net.Conn, r *bufio.Reader, left *atomic.Int64, failed *atomic.Value) {
	write := make([]byte, tcpHdr+tcpOpSize)
	write[0] = 'W'
	read := make([]byte, tcpHdr)
	read[0] = 'R'
	answer := make([]byte, tcpOpSize)
	reads, k := 0, 0 // Reads in flight, operations posted
	for {
		// Writes are done once written; a Read holds its place in the
		// window until its answer is read.
		for reads < tcpDepth && left.Add(-1) >= 0 {
			m := write
			if k&1 == 1 {
				m = read
				reads++
			}
			k++
			if _, err := c.Write(m); err != nil {
				failed.Store(err)
				return
			}
		}
		if reads == 0 {
			return
		}
		if _, err := io.ReadFull(r, answer); err != nil {
			failed.Store(err)
			return
		}
		reads--
	}
}

// benchNs returns the queue pair counts BenchmarkManyQPs and
// BenchmarkManyTCP run: d, or those GOWARP_BENCH_N lists (comma
// separated), to find where a rate turns without editing the test.
func benchNs(d []int) []int {
	v := os.Getenv("GOWARP_BENCH_N")
	if v == "" {
		return d
	}
	var ns []int
	for _, f := range strings.Split(v, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			ns = append(ns, n)
		}
	}
	return ns
}
