// Package monitor serves a cache server's Prometheus metrics and its status
// page: what the server holds, its clients, its rates and a live chart.
//
// A server is watched in two ways: it reports each request it answers to
// Observe (give Observe as its ServerOptions.OnRequest), and the monitor
// reads its counters (Server.Stats) and its clients (Server.Clients) at each
// sample and scrape. So the server's hot path only counts, as it does
// anyway, and calls Observe; nothing is counted twice:
//
//	m, _ := monitor.New(monitor.Options{Name: addr})
//	srv, _ := cache.NewServer(cache.ServerOptions{OnRequest: m.Observe})
//	m.Attach(srv)
//	go m.ListenAndServe(ctx, "127.0.0.1:7191", nil)
//
// Served paths:
//
//	/             the status page (HTML, its script embedded in the binary)
//	/status.json  what the page polls: counters, clients, rates, history
//	/metrics      Prometheus metrics (text exposition format)
package monitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gowarp/gowarp/cache"
)

// Server is what the monitor reads: *cache.Server.
type Server interface {
	Stats() cache.Stats
	Clients() []cache.ClientInfo
}

// Options configure a Monitor.
type Options struct {
	// Name is shown in the page's title (the server's address, say).
	Name string
	// Interval is the time between two samples of the rates and between
	// two polls of the page (default 1 s).
	Interval time.Duration
	// History is how many samples the chart shows (default 300).
	History int
	Logger  *slog.Logger
}

// Monitor keeps a server's metrics and the recent history of its rates.
// Observe is safe for concurrent use and allocates nothing once a pair of
// operation and status has been seen.
type Monitor struct {
	o   Options
	reg *prometheus.Registry
	srv atomic.Pointer[Server]

	requests *prometheus.CounterVec
	errs     *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	obsMu    sync.RWMutex
	obs      map[obsKey]observers

	mu    sync.Mutex
	hist  []Sample // ring of the last History samples
	next  int      // where the next sample goes in hist
	full  bool
	last  cache.Stats
	lastT time.Time
}

type obsKey struct {
	op     cache.Op
	status cache.Status
}

type observers struct {
	requests prometheus.Counter
	errs     prometheus.Counter // nil for a success
	latency  prometheus.Observer
}

// Sample is the server's rates over one interval, per second.
type Sample struct {
	T        int64   `json:"t"` // end of the interval, Unix milliseconds
	Gets     float64 `json:"gets"`
	Puts     float64 `json:"puts"`
	Deletes  float64 `json:"deletes"`
	BytesIn  float64 `json:"bytesIn"`
	BytesOut float64 `json:"bytesOut"`
	PageIns  float64 `json:"pageIns"`
	PageOuts float64 `json:"pageOuts"`
	Errors   float64 `json:"errors"`
	// HitRatio is hits over gets in the interval, or -1 with no gets.
	HitRatio float64 `json:"hitRatio"`
}

// Ops is the sample's operations per second.
func (s Sample) Ops() float64 { return s.Gets + s.Puts + s.Deletes }

// New makes a Monitor and registers its metrics in a registry of its own
// (with the Go runtime's and the process's collectors).
func New(o Options) (*Monitor, error) {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.History <= 0 {
		o.History = 300
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	m := &Monitor{o: o, reg: prometheus.NewRegistry(), obs: make(map[obsKey]observers), hist: make([]Sample, o.History)}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "requests_total",
		Help: "Control-path requests answered, by operation and status."}, []string{"op", "status"})
	m.errs = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "errors_total",
		Help: "Requests answered with an error, by kind (the reply's status)."}, []string{"kind"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "request_duration_seconds",
		Help:    "Time the server took to answer a control-path request, by operation.",
		Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12)}, []string{"op"})
	if err := registerAll(m.reg, m.requests, m.errs, m.latency, statsCollector{m.stats}); err != nil {
		return nil, err
	}
	return m, nil
}

// Attach makes the monitor read srv's counters and clients. Before it,
// the monitor shows zeros.
func (m *Monitor) Attach(srv Server) { m.srv.Store(&srv) }

func (m *Monitor) stats() cache.Stats {
	if p := m.srv.Load(); p != nil {
		return (*p).Stats()
	}
	return cache.Stats{}
}

func (m *Monitor) clients() []cache.ClientInfo {
	if p := m.srv.Load(); p != nil {
		return (*p).Clients()
	}
	return nil
}

// Registry returns the registry the metrics are in, to add more or to
// gather them.
func (m *Monitor) Registry() *prometheus.Registry { return m.reg }

// Observe counts one answered request: its operation, its status, the
// value bytes it carried and the time it took. It has the signature of
// cache.ServerOptions.OnRequest, which the server calls for every request.
func (m *Monitor) Observe(op cache.Op, status cache.Status, _ int, took time.Duration) {
	k := obsKey{op, status}
	m.obsMu.RLock()
	ob, ok := m.obs[k]
	m.obsMu.RUnlock()
	if !ok {
		ob = m.observers(k)
	}
	ob.requests.Inc()
	if ob.errs != nil {
		ob.errs.Inc()
	}
	ob.latency.Observe(took.Seconds())
}

func (m *Monitor) observers(k obsKey) observers {
	m.obsMu.Lock()
	defer m.obsMu.Unlock()
	if ob, ok := m.obs[k]; ok {
		return ob
	}
	op, st := k.op.String(), k.status.String()
	ob := observers{requests: m.requests.WithLabelValues(op, st), latency: m.latency.WithLabelValues(op)}
	if k.status != cache.StatusOK {
		ob.errs = m.errs.WithLabelValues(st)
	}
	m.obs[k] = ob
	return ob
}

// Sample takes a sample of the rates now (Run does it every Interval).
func (m *Monitor) Sample() {
	st := m.stats()
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.lastT.IsZero() {
		if dt := now.Sub(m.lastT).Seconds(); dt > 0 {
			m.hist[m.next] = rates(m.last, st, dt, now)
			m.next = (m.next + 1) % len(m.hist)
			m.full = m.full || m.next == 0
		}
	}
	m.last, m.lastT = st, now
}

// rates are the per-second rates between two snapshots dt seconds apart.
// A counter that went backwards (a restarted server behind the same
// Stats) counts as zero.
func rates(a, b cache.Stats, dt float64, at time.Time) Sample {
	d := func(x, y uint64) float64 {
		if y < x {
			return 0
		}
		return float64(y-x) / dt
	}
	s := Sample{T: at.UnixMilli(), Gets: d(a.Gets, b.Gets), Puts: d(a.Puts, b.Puts), Deletes: d(a.Deletes, b.Deletes),
		BytesIn: d(a.BytesIn, b.BytesIn), BytesOut: d(a.BytesOut, b.BytesOut), PageIns: d(a.PageIns, b.PageIns),
		PageOuts: d(a.PageOuts, b.PageOuts), Errors: d(a.Errors, b.Errors), HitRatio: -1}
	if s.Gets > 0 {
		s.HitRatio = d(a.Hits, b.Hits) / s.Gets
	}
	return s
}

// History returns the samples kept, oldest first.
func (m *Monitor) History() []Sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.full {
		return append([]Sample(nil), m.hist[:m.next]...)
	}
	return append(append([]Sample(nil), m.hist[m.next:]...), m.hist[:m.next]...)
}

// Run samples the rates every Interval until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	m.Sample()
	t := time.NewTicker(m.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Sample()
		}
	}
}

// Serve serves the page, its JSON and the metrics on ln, and samples the
// rates, until ctx ends; it closes ln.
func (m *Monitor) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: m.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(m.o.Logger.Handler(), slog.LevelInfo)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.Run(ctx) }()
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	})
	defer stop()
	err := srv.Serve(ln)
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("monitor: %w", err)
}

// ListenAndServe listens on addr (host:port) and serves until ctx ends;
// ready, if set, is called with the address listened on once it is.
func (m *Monitor) ListenAndServe(ctx context.Context, addr string, ready func(net.Addr)) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("monitor: %w", err)
	}
	if ready != nil {
		ready(ln.Addr())
	}
	return m.Serve(ctx, ln)
}
