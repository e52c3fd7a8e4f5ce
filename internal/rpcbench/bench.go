// Package rpcbench measures package rpc against gRPC-go in one run: the
// same calls, payloads and concurrency over loopback, both ends in this
// process.
package rpcbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/rpc"
)

// Config says what to measure.
type Config struct {
	Duration    time.Duration // per case
	Concurrency []int         // for small calls
	Small       int           // small argument and result size
	Large       int           // large argument size
	Touch       []int         // percent of the large argument the server reads
	LargeConc   int           // concurrency of large calls
	// Rounds repeats every case, the systems taking turns within each
	// round, and reports medians: on a busy machine one round of one
	// system can fall on a burst of someone else's work.
	Rounds int
	Logger *slog.Logger
}

// Result is one case's figures.
type Result struct {
	System       string  `json:"system"` // "gowarp-rpc", "gowarp-rpc-nonblocking" or "grpc-go"
	Case         string  `json:"case"`   // "small" or "large"
	Concurrency  int     `json:"concurrency"`
	Touch        int     `json:"touch_pct,omitempty"`
	Calls        int     `json:"calls"`
	Rate         float64 `json:"calls_per_s"`
	P50          float64 `json:"p50_us"`
	P99          float64 `json:"p99_us"`
	BytesPerCall float64 `json:"bytes_per_call"`
	Rounds       int     `json:"rounds,omitempty"` // medians of this many rounds // argument and result bytes moved per call, headers included where known
}

// caller makes one call of the case; it is used by one goroutine.
type caller func(ctx context.Context) error

// measure runs conc goroutines of calls for d and collects latencies.
func measure(ctx context.Context, d time.Duration, conc int, mk func() caller) (calls int, rate float64, lat []time.Duration, err error) {
	var wg sync.WaitGroup
	lats := make([][]time.Duration, conc)
	errs := make([]error, conc)
	// Warm up a little, then measure.
	warm := mk()
	for range 100 {
		if err := warm(ctx); err != nil {
			return 0, 0, nil, err
		}
	}
	stop := make(chan struct{})
	start := time.Now()
	for g := range conc {
		call := mk()
		lats[g] = make([]time.Duration, 0, 1<<16)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				if err := call(ctx); err != nil {
					errs[g] = err
					return
				}
				lats[g] = append(lats[g], time.Since(t0))
			}
		}()
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	el := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, 0, nil, err
	}
	for _, l := range lats {
		lat = append(lat, l...)
	}
	slices.Sort(lat)
	return len(lat), float64(len(lat)) / el.Seconds(), lat, nil
}

func pct(lat []time.Duration, p float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	return float64(lat[min(len(lat)-1, int(float64(len(lat))*p))]) / 1e3
}

// sum adds the first pct % of b, the server's work in large calls.
func sum(b []byte) uint64 {
	var s uint64
	for _, x := range b {
		s += uint64(x)
	}
	return s
}

// Run measures every case, gowarp's and gRPC-go's side by side, and
// hands each result to emit as it is known.
func Run(ctx context.Context, c Config, emit func(Result)) error {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	g, err := startGowarp(ctx, c)
	if err != nil {
		return err
	}
	defer g.close()
	gr, err := startGRPC(c)
	if err != nil {
		return err
	}
	defer gr.close()

	rounds := max(1, c.Rounds)
	arg := make([]byte, c.Small)
	for _, conc := range c.Concurrency {
		systems := []struct {
			name string
			mk   func() caller
		}{
			{"grpc-go", gr.small(arg)},
			{"gowarp-rpc", g.small("echo", arg)},
			{"gowarp-rpc-nonblocking", g.small("echo.nb", arg)},
		}
		runs := make([][]Result, len(systems))
		for range rounds {
			for i, sys := range systems {
				n, rate, lat, err := measure(ctx, c.Duration, conc, sys.mk)
				if err != nil {
					return fmt.Errorf("%s small c=%d: %w", sys.name, conc, err)
				}
				runs[i] = append(runs[i], Result{System: sys.name, Case: "small", Concurrency: conc, Calls: n, Rate: rate,
					P50: pct(lat, 0.5), P99: pct(lat, 0.99), BytesPerCall: float64(2 * c.Small)})
			}
		}
		for _, r := range runs {
			emit(median(r))
		}
	}
	for _, t := range c.Touch {
		var grs, gws []Result
		for range rounds {
			n, rate, lat, err := measure(ctx, c.Duration, c.LargeConc, gr.large(t))
			if err != nil {
				return fmt.Errorf("grpc-go large %d%%: %w", t, err)
			}
			grs = append(grs, Result{System: "grpc-go", Case: "large", Concurrency: c.LargeConc, Touch: t, Calls: n, Rate: rate,
				P50: pct(lat, 0.5), P99: pct(lat, 0.99), BytesPerCall: float64(c.Large + 8)})
			before := g.srv.Stats()
			n, rate, lat, err = measure(ctx, c.Duration, c.LargeConc, g.large(t))
			if err != nil {
				return fmt.Errorf("gowarp-rpc large %d%%: %w", t, err)
			}
			after := g.srv.Stats()
			// Every call of the run, warm-up included, moved these bytes.
			calls := float64(after.Calls - before.Calls)
			moved := float64(after.ReadBytes-before.ReadBytes+after.MessageBytes-before.MessageBytes) / calls
			gws = append(gws, Result{System: "gowarp-rpc", Case: "large", Concurrency: c.LargeConc, Touch: t, Calls: n, Rate: rate,
				P50: pct(lat, 0.5), P99: pct(lat, 0.99), BytesPerCall: moved})
		}
		emit(median(grs))
		emit(median(gws))
	}
	return nil
}

// median returns the round with the median rate, with the medians of
// the rounds' p50 and p99 and the calls of all rounds.
func median(rs []Result) Result {
	if len(rs) == 1 {
		return rs[0]
	}
	by := func(f func(Result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	m := slices.Clone(rs)
	slices.SortFunc(m, func(a, b Result) int { return cmp.Compare(a.Rate, b.Rate) })
	out := m[len(m)/2]
	out.P50 = by(func(r Result) float64 { return r.P50 })
	out.P99 = by(func(r Result) float64 { return r.P99 })
	out.Calls = 0
	for _, r := range rs {
		out.Calls += r.Calls
	}
	out.Rounds = len(rs)
	return out
}

// gowarpSide is an rpc server and one client session to it.
type gowarpSide struct {
	ln     *gowarp.Listener
	srv    *rpc.Server
	cl     *rpc.Client
	size   int
	conc   int
	mu     sync.Mutex
	bufs   []*rpc.Buffer
	next   int
	cancel context.CancelFunc
	served chan struct{}
}

func startGowarp(ctx context.Context, c Config) (*gowarpSide, error) {
	dev := gowarp.Open(gowarp.WithLogger(c.Logger))
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	// Each large caller of each case lends its own argument buffer.
	o := rpc.Options{Logger: c.Logger, HeapSize: (c.LargeConc + 2) * (c.Large + 64)}
	srv := rpc.NewServer(dev, o)
	echo := func(ctx context.Context, call *rpc.ServerCall) error { return call.Reply(call.Arg()) }
	srv.Register("echo", echo)
	srv.RegisterNonBlocking("echo.nb", echo)
	srv.Register("touch", func(ctx context.Context, call *rpc.ServerCall) error {
		r, err := call.Ref(0)
		if err != nil {
			return err
		}
		p, _ := strconv.Atoi(string(call.Arg()))
		end := r.Len() * int64(p) / 100
		var buf [4096]byte
		var s uint64
		for off := int64(0); off < end; {
			n, err := r.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
			s += sum(buf[:n])
			off += int64(n)
			if err != nil && err != io.EOF {
				return err
			}
		}
		return call.Reply(strconv.AppendUint(call.ReplyBuffer(), s, 10))
	})
	sctx, cancel := context.WithCancel(context.Background())
	g := &gowarpSide{ln: ln, srv: srv, size: c.Large, conc: c.LargeConc, cancel: cancel, served: make(chan struct{})}
	go func() {
		defer close(g.served)
		srv.Serve(sctx, ln)
	}()
	if g.cl, err = rpc.Dial(ctx, dev, ln.Addr().String(), o); err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

func (g *gowarpSide) close() {
	if g.cl != nil {
		g.cl.Close()
	}
	g.cancel()
	g.ln.Close()
	<-g.served
	g.srv.Close()
}

func (g *gowarpSide) small(method string, arg []byte) func() caller {
	return func() caller {
		var reply []byte
		return func(ctx context.Context) error {
			var err error
			reply, err = g.cl.Call(ctx, method, arg, reply)
			if err == nil && len(reply) != len(arg) {
				err = fmt.Errorf("reply of %d bytes", len(reply))
			}
			return err
		}
	}
}

func (g *gowarpSide) large(touch int) func() caller {
	return func() caller {
		buf, err := g.argBuffer()
		if err != nil {
			return func(context.Context) error { return err }
		}
		want := strconv.AppendUint(nil, sum(buf.Bytes()[:len(buf.Bytes())*touch/100]), 10)
		call := rpc.Call{Method: "touch", Arg: strconv.AppendInt(nil, int64(touch), 10), Refs: []rpc.Span{buf.All()}}
		return func(ctx context.Context) error {
			if err := g.cl.Do(ctx, &call); err != nil {
				return err
			}
			if string(call.Reply) != string(want) {
				return fmt.Errorf("sum %s, want %s", call.Reply, want)
			}
			return nil
		}
	}
}

// argBuffer returns one of LargeConc+1 heap buffers holding the large
// argument, in turn: a measurement's callers (and its warm-up caller,
// done before they start) each get their own, and later cases reuse them.
func (g *gowarpSide) argBuffer() (*rpc.Buffer, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.next % (g.conc + 1)
	g.next++
	if k < len(g.bufs) {
		return g.bufs[k], nil
	}
	b, err := g.cl.Alloc(g.size)
	if err != nil {
		return nil, err
	}
	copy(b.Bytes(), g.largeArg())
	g.bufs = append(g.bufs, b)
	return b, nil
}

var (
	largeMu   sync.Mutex
	largeData []byte
)

func (g *gowarpSide) largeArg() []byte { return largeArgument(g.size) }

func largeArgument(n int) []byte {
	largeMu.Lock()
	defer largeMu.Unlock()
	if len(largeData) != n {
		largeData = make([]byte, n)
		for i := range largeData {
			largeData[i] = byte(i*7 + i>>8)
		}
	}
	return largeData
}

// rawCodec passes []byte through, so gRPC needs no protobuf types.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	p := v.(*[]byte)
	*p = append((*p)[:0], b...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

type grpcSide struct {
	srv  *grpc.Server
	conn *grpc.ClientConn
	size int
}

func startGRPC(c Config) (*grpcSide, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(4*c.Large+1024))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "bench.Bench",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "Echo", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				var in []byte
				if err := dec(&in); err != nil {
					return nil, err
				}
				return &in, nil
			}},
			{MethodName: "Touch", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				var in []byte
				if err := dec(&in); err != nil {
					return nil, err
				}
				// The first 4 bytes say the percent to touch; the rest is the argument.
				p, _ := strconv.Atoi(string(in[:3]))
				body := in[3:]
				out := strconv.AppendUint(nil, sum(body[:len(body)*p/100]), 10)
				return &out, nil
			}},
		},
	}, struct{}{})
	go srv.Serve(ln)
	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(4*c.Large+1024), grpc.MaxCallSendMsgSize(4*c.Large+1024)))
	if err != nil {
		srv.Stop()
		return nil, err
	}
	return &grpcSide{srv: srv, conn: conn, size: c.Large}, nil
}

func (g *grpcSide) close() {
	g.conn.Close()
	g.srv.Stop()
}

func (g *grpcSide) small(arg []byte) func() caller {
	return func() caller {
		var reply []byte
		return func(ctx context.Context) error {
			in := arg
			if err := g.conn.Invoke(ctx, "/bench.Bench/Echo", &in, &reply); err != nil {
				return err
			}
			if len(reply) != len(arg) {
				return fmt.Errorf("reply of %d bytes", len(reply))
			}
			return nil
		}
	}
}

func (g *grpcSide) large(touch int) func() caller {
	return func() caller {
		data := largeArgument(g.size)
		in := append(fmt.Appendf(nil, "%03d", touch), data...)
		want := strconv.AppendUint(nil, sum(data[:len(data)*touch/100]), 10)
		var reply []byte
		return func(ctx context.Context) error {
			if err := g.conn.Invoke(ctx, "/bench.Bench/Touch", &in, &reply); err != nil {
				return err
			}
			if string(reply) != string(want) {
				return fmt.Errorf("sum %s, want %s", reply, want)
			}
			return nil
		}
	}
}
