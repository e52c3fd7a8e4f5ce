package rpcbench

import (
	"context"
	"fmt"
	"runtime"
	"testing"
)

// startBoth starts the rpc and the gRPC-go server and client with c, both
// closed when b ends.
func startBoth(b *testing.B, c Config) (*gowarpSide, *grpcSide) {
	b.Helper()
	g, err := startGowarp(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(g.close)
	gr, err := startGRPC(c)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(gr.close)
	return g, gr
}

// BenchmarkSmall is 64-byte calls with 64-byte replies at concurrency
// 1, 16 and 64 (GOMAXPROCS×parallelism callers), rpc and gRPC-go side
// by side.
func BenchmarkSmall(b *testing.B) {
	c := Config{Small: 64, Large: 1 << 20, Touch: []int{1}, LargeConc: 1}
	g, gr := startBoth(b, c)
	arg := make([]byte, c.Small)
	for _, conc := range []int{1, 16, 64} {
		for _, sys := range []struct {
			name string
			mk   func() caller
		}{
			{"grpc-go", gr.small(arg)},
			{"gowarp-rpc", g.small("echo", arg)},
			{"gowarp-rpc-nonblocking", g.small("echo.nb", arg)},
		} {
			b.Run(fmt.Sprintf("%s/c=%d", sys.name, conc), func(b *testing.B) { parallel(b, conc, sys.mk) })
		}
	}
}

// BenchmarkLarge is calls with a 1 MiB argument of which the server
// reads 1, 10 or 100 %: by reference with rpc, by value with gRPC-go.
func BenchmarkLarge(b *testing.B) {
	c := Config{Small: 64, Large: 1 << 20, Touch: []int{1, 10, 100}, LargeConc: 1}
	g, gr := startBoth(b, c)
	for _, t := range c.Touch {
		b.Run(fmt.Sprintf("grpc-go/touch=%d%%", t), func(b *testing.B) { parallel(b, 1, gr.large(t)) })
		b.Run(fmt.Sprintf("gowarp-rpc/touch=%d%%", t), func(b *testing.B) {
			before := g.srv.Stats()
			parallel(b, 1, g.large(t))
			after := g.srv.Stats()
			b.ReportMetric(float64(after.ReadBytes-before.ReadBytes+after.MessageBytes-before.MessageBytes)/float64(after.Calls-before.Calls), "moved-B/op")
		})
	}
}

// parallel runs b.N calls from conc goroutines.
func parallel(b *testing.B, conc int, mk func() caller) {
	ctx := context.Background()
	if conc == 1 {
		call := mk()
		for b.Loop() {
			if err := call(ctx); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.SetParallelism(max(1, conc/testingProcs()))
	b.RunParallel(func(pb *testing.PB) {
		call := mk()
		for pb.Next() {
			if err := call(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func testingProcs() int { return runtime.GOMAXPROCS(0) }
