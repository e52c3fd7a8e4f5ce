package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gowarp/gowarp"
)

func init() {
	register("qpmem", "memory and goroutines per connected queue pair, idle and after traffic", qpmemMain)
}

const qpmemUsage = `usage: gowarp qpmem [-n QPs] [-size bytes] [-depth n] [-c workers] [-crc] [-json]

Connects -n queue pairs (-n/2 pairs, both ends in this process) over
loopback, then has every one of them do one RDMA Write of -size bytes and
one 64-byte Send to its peer, which receives it. It reports the process's
resident memory (VmRSS), live Go heap (after a GC), goroutine stacks and
goroutines, divided by the queue pairs: once connected and idle, and
again after the traffic. The figures are the growth over the process
before any queue pair existed, so they include everything a queue pair
costs: its socket's descriptor and Go's poller entry, its rings, its
buffers and its goroutines (not the kernel's socket buffers).

It needs about -n descriptors; the soft limit is raised to the hard one.

flags:
`

// qpmemConfig says what qpmem runs.
type qpmemConfig struct {
	qps     int // queue pairs in all: qps/2 pairs
	size    int // bytes of each queue pair's Write
	workers int // goroutines connecting and driving the pairs
	depth   int // send and receive queue depths; 0: the default
	crc     bool
}

// qpmemSample is the process's memory at one moment.
type qpmemSample struct {
	RSS        int64 `json:"rss_bytes"`   // VmRSS
	Heap       int64 `json:"heap_bytes"`  // live heap objects after a GC
	Stacks     int64 `json:"stack_bytes"` // goroutine stacks in use
	Goroutines int   `json:"goroutines"`
}

// qpmemPerQP is a sample's growth over the base, per queue pair.
type qpmemPerQP struct {
	RSS        float64 `json:"rss_bytes"`
	Heap       float64 `json:"heap_bytes"`
	Stacks     float64 `json:"stack_bytes"`
	Goroutines float64 `json:"goroutines"`
}

// qpmemReport is what qpmem measured.
type qpmemReport struct {
	QPs        int         `json:"qps"`
	Depth      int         `json:"depth"`
	WriteBytes int         `json:"write_bytes"`
	CRC        bool        `json:"crc"`
	Base       qpmemSample `json:"base"`
	Idle       qpmemSample `json:"idle"`
	Traffic    qpmemSample `json:"after_traffic"`
	IdlePerQP  qpmemPerQP  `json:"idle_per_qp"`
	AfterPerQP qpmemPerQP  `json:"after_traffic_per_qp"`
}

func qpmemMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("qpmem", qpmemUsage, stderr)
	var c qpmemConfig
	var asJSON bool
	fs.IntVar(&c.qps, "n", 1000, "queue pairs in all (even: n/2 connected pairs)")
	fs.IntVar(&c.size, "size", 64<<10, "bytes of the RDMA Write each queue pair makes")
	fs.IntVar(&c.workers, "c", 16, "goroutines that connect and drive the pairs")
	fs.IntVar(&c.depth, "depth", 0, "send and receive queue depth of every queue pair (0: the default, 128)")
	fs.BoolVar(&c.crc, "crc", false, "MPA CRC on")
	fs.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gowarp qpmem: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if c.qps < 2 || c.qps%2 != 0 || c.size < 1 || c.workers < 1 {
		fmt.Fprintln(stderr, "gowarp qpmem: -n must be even and at least 2, -size and -c at least 1")
		return exitUsage
	}
	if err := raiseNoFile(c.qps + 64); err != nil {
		fmt.Fprintf(stderr, "gowarp qpmem: %v\n", err)
		return exitFailure
	}
	r, err := measureQPMem(ctx, c)
	if err != nil {
		fmt.Fprintf(stderr, "gowarp qpmem: %v\n", err)
		return exitFailure
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(stderr, "gowarp qpmem: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	writeQPMem(stdout, r)
	return exitOK
}

func writeQPMem(w io.Writer, r *qpmemReport) {
	depth := "default"
	if r.Depth > 0 {
		depth = strconv.Itoa(r.Depth)
	}
	fmt.Fprintf(w, "%d queue pairs (%d connected pairs) over loopback, queue depths %s, one %d-byte Write and one 64-byte Send each, CRC %v\n",
		r.QPs, r.QPs/2, depth, r.WriteBytes, r.CRC)
	fmt.Fprintf(w, "%-15s %12s %12s %12s %12s\n", "per queue pair", "RSS KiB", "heap KiB", "stacks KiB", "goroutines")
	for _, row := range []struct {
		name string
		p    qpmemPerQP
	}{{"idle", r.IdlePerQP}, {"after traffic", r.AfterPerQP}} {
		fmt.Fprintf(w, "%-15s %12.1f %12.1f %12.1f %12.2f\n", row.name, row.p.RSS/1024, row.p.Heap/1024, row.p.Stacks/1024, row.p.Goroutines)
	}
	fmt.Fprintf(w, "process: RSS %d MiB, heap %d MiB, %d goroutines after traffic (%d MiB, %d MiB, %d before any queue pair)\n",
		r.Traffic.RSS>>20, r.Traffic.Heap>>20, r.Traffic.Goroutines, r.Base.RSS>>20, r.Base.Heap>>20, r.Base.Goroutines)
}

// qpmemPair is one connected pair and its buffers' places.
type qpmemPair struct {
	a, b *gowarp.QP
}

// measureQPMem connects the queue pairs, samples, drives the traffic,
// samples again and closes them.
func measureQPMem(ctx context.Context, c qpmemConfig) (*qpmemReport, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	dev := gowarp.Open()
	pd := dev.AllocPD()
	// The memory the queue pairs send from, and, for each worker, the
	// memory its pairs' Writes and Sends land in: shared, so the figures
	// are the queue pairs' own.
	src, err := pd.Register(make([]byte, c.size), gowarp.LocalWrite)
	if err != nil {
		return nil, err
	}
	workers := min(c.workers, c.qps/2)
	cqs := make([]*gowarp.CQ, workers)
	sinks := make([]qpmemSinks, workers)
	for i := range cqs {
		cqs[i] = dev.NewCQ(64)
		for k := range 2 {
			if sinks[i].dst[k], err = pd.Register(make([]byte, c.size), gowarp.LocalWrite|gowarp.RemoteWrite); err != nil {
				return nil, err
			}
			if sinks[i].recv[k], err = pd.Register(make([]byte, 64), gowarp.LocalWrite); err != nil {
				return nil, err
			}
		}
	}
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()

	r := &qpmemReport{QPs: c.qps, Depth: c.depth, WriteBytes: c.size, CRC: c.crc}
	r.Base = sampleMem()

	pairs := make([]qpmemPair, c.qps/2)
	defer func() {
		for _, p := range pairs {
			if p.a != nil {
				p.a.Close()
			}
			if p.b != nil {
				p.b.Close()
			}
		}
	}()
	for i := range pairs {
		cq := cqs[i%workers]
		qc := gowarp.QPConfig{SendCQ: cq, RecvCQ: cq, SendDepth: c.depth, RecvDepth: c.depth}
		if pairs[i].a, err = pd.NewQP(qc); err != nil {
			return nil, err
		}
		if pairs[i].b, err = pd.NewQP(qc); err != nil {
			return nil, err
		}
	}
	opts := gowarp.ConnectOptions{CRC: c.crc}

	// Accept: the private data names the pair. The first failure on
	// either side cancels the other's waits (an acceptor left in Accept,
	// or Connects to an acceptor that gave up, would wait for ctx).
	setup, cancel := context.WithCancel(ctx)
	defer cancel()
	var accWG sync.WaitGroup
	accErr := make(chan error, workers)
	var accepted atomic.Int64
	for range workers {
		accWG.Add(1)
		go func() {
			defer accWG.Done()
			for accepted.Add(1) <= int64(len(pairs)) {
				req, err := ln.Accept(setup)
				if err != nil {
					accErr <- err
					cancel()
					return
				}
				pd := req.PrivateData()
				i := -1
				if len(pd) == 4 {
					i = int(binary.BigEndian.Uint32(pd))
				}
				if i < 0 || i >= len(pairs) {
					req.Reject(nil)
					accErr <- fmt.Errorf("connection request with private data %x", pd)
					cancel()
					return
				}
				if err := req.Accept(setup, pairs[i].b, opts); err != nil {
					accErr <- fmt.Errorf("accepting pair %d: %w", i, err)
					cancel()
					return
				}
			}
		}()
	}
	err = forPairs(workers, len(pairs), func(w, i int) error {
		o := opts
		o.PrivateData = binary.BigEndian.AppendUint32(nil, uint32(i))
		if err := pairs[i].a.Connect(setup, ln.Addr().String(), o); err != nil {
			cancel()
			return fmt.Errorf("connecting pair %d: %w", i, err)
		}
		return nil
	})
	accWG.Wait()
	close(accErr)
	aerr := <-accErr
	if err == nil || aerr != nil && errors.Is(err, context.Canceled) {
		err = aerr // the side that failed first, not the one it canceled
	}
	if err != nil {
		return nil, err
	}
	ln.Close()
	r.Idle = sampleMem()

	err = forPairs(workers, len(pairs), func(w, i int) error {
		return qpmemTraffic(ctx, cqs[w], pairs[i], src, &sinks[w])
	})
	if err != nil {
		return nil, err
	}
	r.Traffic = sampleMem()
	r.IdlePerQP = perQP(r.Idle, r.Base, c.qps)
	r.AfterPerQP = perQP(r.Traffic, r.Base, c.qps)
	return r, nil
}

// forPairs runs f for every pair index in [0, n) on w goroutines; worker k
// takes the indexes equal to k modulo w. It returns the first error.
func forPairs(w, n int, f func(w, i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, w)
	for k := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < n; i += w {
				if err := f(k, i); err != nil {
					errs[k] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// qpmemSinks is where a worker's pairs' Writes and Sends land: in dst[k]
// and recv[k] those to the pair's queue pair k.
type qpmemSinks struct {
	dst, recv [2]*gowarp.MR
}

// qpmemTraffic has both queue pairs of p Write src to the other's sink and
// Send 64 bytes, which the other receives, and waits for the six
// completions on cq, which only this goroutine polls.
func qpmemTraffic(ctx context.Context, cq *gowarp.CQ, p qpmemPair, src *gowarp.MR, s *qpmemSinks) error {
	qps := [2]*gowarp.QP{p.a, p.b}
	for k, q := range qps {
		if err := q.PostRecv(&gowarp.RecvWR{ID: 3, SGL: []gowarp.SGE{{MR: s.recv[k], Length: 64}}}); err != nil {
			return err
		}
	}
	for k, q := range qps {
		dst := s.dst[1-k]
		wrs := []gowarp.SendWR{
			{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: src.Len()}}, RemoteAddr: dst.Addr(), RKey: dst.STag()},
			{ID: 2, Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: min(64, src.Len())}}},
		}
		if _, err := q.PostSendList(wrs); err != nil {
			return err
		}
	}
	var wc [8]gowarp.Completion
	for left := 6; left > 0; {
		n := cq.Poll(wc[:])
		for _, c := range wc[:n] {
			if c.Status != gowarp.Success {
				return fmt.Errorf("completion %v of work request %d: %v", c.Op, c.ID, c.Status)
			}
		}
		left -= n
		if n == 0 {
			if err := cq.Wait(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// perQP returns s's growth over base divided by n.
func perQP(s, base qpmemSample, n int) qpmemPerQP {
	f := float64(n)
	return qpmemPerQP{
		RSS:        float64(s.RSS-base.RSS) / f,
		Heap:       float64(s.Heap-base.Heap) / f,
		Stacks:     float64(s.Stacks-base.Stacks) / f,
		Goroutines: float64(s.Goroutines-base.Goroutines) / f,
	}
}

// sampleMem collects garbage and reads the process's memory.
func sampleMem() qpmemSample {
	runtime.GC()
	runtime.GC() // the second frees what the first's finalizers let go
	ms := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(ms)
	return qpmemSample{
		RSS:        readRSS(),
		Heap:       int64(ms[0].Value.Uint64()),
		Stacks:     int64(ms[1].Value.Uint64()),
		Goroutines: runtime.NumGoroutine(),
	}
}

// readRSS returns VmRSS from /proc/self/status, 0 where there is none.
func readRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
