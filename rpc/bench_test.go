package rpc

import (
	"context"
	"testing"

	"github.com/gowarp/gowarp"
)

// BenchmarkCall is one 64-byte call and its 64-byte reply, one caller.
func BenchmarkCall(b *testing.B) {
	for _, m := range []string{"echo", "echo.fast"} {
		b.Run(m, func(b *testing.B) {
			_, cl, _ := pair(b, Options{})
			arg, reply := make([]byte, 64), make([]byte, 0, 64)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if reply, err = cl.Call(ctx, m, arg, reply); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCallParallel is 64-byte calls from GOMAXPROCS×16 callers.
func BenchmarkCallParallel(b *testing.B) {
	for _, m := range []string{"echo", "echo.fast"} {
		b.Run(m, func(b *testing.B) {
			_, cl, _ := pair(b, Options{})
			b.SetParallelism(16)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				arg, reply := make([]byte, 64), make([]byte, 0, 64)
				for pb.Next() {
					var err error
					if reply, err = cl.Call(context.Background(), m, arg, reply); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkRef is a call passing 1 MiB by reference, of which the server
// reads 1 %, 10 % or all.
func BenchmarkRef(b *testing.B) {
	for _, pct := range []byte{1, 10, 100} {
		b.Run(string('0'+pct/100)+string('0'+pct/10%10)+string('0'+pct%10)+"pct", func(b *testing.B) {
			srv, cl, _ := pair(b, Options{})
			buf, err := cl.Alloc(1 << 20)
			if err != nil {
				b.Fatal(err)
			}
			call := Call{Method: "sum", Arg: []byte{pct}, Refs: []Span{buf.All()}}
			read := srv.Stats().ReadBytes
			b.ReportAllocs()
			for b.Loop() {
				if err := cl.Do(context.Background(), &call); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(srv.Stats().ReadBytes-read)/float64(b.N), "read-B/op")
		})
	}
}

// TestCallAllocs: a call by value allocates nothing on the client, the
// server's non-blocking path included.
func TestCallAllocs(t *testing.T) {
	_, cl, _ := pair(t, Options{})
	arg, reply := make([]byte, 64), make([]byte, 0, 64)
	ctx := context.Background()
	n := testing.AllocsPerRun(200, func() {
		var err error
		if reply, err = cl.Call(ctx, "echo.fast", arg, reply); err != nil {
			t.Fatal(err)
		}
	})
	if n > 0 {
		t.Fatalf("%v allocations per call", n)
	}
}

// BenchmarkLendSpan is what a call pays per span it lends: a region
// registered for the span alone and deregistered when the call ends
// (what a handle kept beyond its call would save; see the README).
func BenchmarkLendSpan(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
	}{{"64B", 64}, {"1MiB", 1 << 20}} {
		b.Run(c.name, func(b *testing.B) {
			pd := gowarp.Open(gowarp.WithLogger(quiet)).AllocPD()
			buf := make([]byte, c.n)
			for b.Loop() {
				mr, err := pd.Register(buf, gowarp.RemoteRead)
				if err != nil {
					b.Fatal(err)
				}
				if err := mr.Deregister(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
