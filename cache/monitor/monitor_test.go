package monitor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/cache"
	"github.com/gowarp/gowarp/cache/monitor"
)

var quiet = slog.New(slog.DiscardHandler)

type served struct {
	addr string // the cache server's
	base string // the monitor's, http://host:port
	srv  *cache.Server
	m    *monitor.Monitor
}

// startServer runs a cache server on a loopback port, with its monitor
// on another, until the test ends: as gowarp cache serve -http does.
func startServer(t testing.TB, o cache.ServerOptions, interval time.Duration) served {
	t.Helper()
	m, err := monitor.New(monitor.Options{Name: "test", Interval: interval, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	o.Dir, o.Logger, o.Device, o.OnRequest = t.TempDir(), quiet, gowarp.Open(gowarp.WithLogger(quiet)), m.Observe
	srv, err := cache.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	m.Attach(srv)
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- srv.Serve(ctx, ln) }()
	go func() { done <- m.Serve(ctx, hln) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		}
		if err := srv.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return served{addr: ln.Addr().String(), base: "http://" + hln.Addr().String(), srv: srv, m: m}
}

func dial(t testing.TB, addr string) *cache.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cache.Dial(ctx, addr, cache.ClientOptions{Device: gowarp.Open(gowarp.WithLogger(quiet)), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func scrape(t testing.TB, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %s: %s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value is the value of the metric name with labels (name, value pairs):
// a counter's or gauge's value, a histogram's count; -1 if there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.Metric {
		for i := 0; i < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

type want struct {
	name   string
	labels []string
	v      float64
}

func check(t *testing.T, fams map[string]*dto.MetricFamily, ws []want) {
	t.Helper()
	for _, w := range ws {
		if got := value(fams, w.name, w.labels...); got != w.v {
			t.Errorf("%s%v = %v, want %v", w.name, w.labels, got, w.v)
		}
	}
}

// TestMetricsAfterTraffic: puts, gets that hit and miss, deletes, then
// more data than the memory budget holds: each metric moves by what the
// traffic did.
func TestMetricsAfterTraffic(t *testing.T) {
	const bs = 64 << 10
	s := startServer(t, cache.ServerOptions{BlockSize: bs, Budget: 3 * bs}, time.Hour)
	f := scrape(t, s.base)
	check(t, f, []want{{"gowarp_cache_keys", nil, 0}, {"gowarp_cache_clients", nil, 0},
		{"gowarp_cache_ops_total", []string{"op", "get"}, 0}, {"gowarp_cache_budget_bytes", nil, 3 * bs}})

	c := dial(t, s.addr)
	ctx := ctxT(t)
	for i := range 20 {
		if err := c.Put(ctx, fmt.Sprintf("k%d", i), bytes.Repeat([]byte{byte(i)}, 100), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 30 { // 20 hits, 10 misses
		if _, err := c.Get(ctx, fmt.Sprintf("k%d", i)); err != nil && i < 20 {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if err := c.Delete(ctx, fmt.Sprintf("k%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	f = scrape(t, s.base)
	check(t, f, []want{
		{"gowarp_cache_keys", nil, 15},
		{"gowarp_cache_stored_bytes", nil, 1500},
		{"gowarp_cache_clients", nil, 1},
		{"gowarp_cache_ops_total", []string{"op", "put"}, 20},
		{"gowarp_cache_ops_total", []string{"op", "get"}, 30},
		{"gowarp_cache_ops_total", []string{"op", "delete"}, 5},
		{"gowarp_cache_hits_total", nil, 20},
		{"gowarp_cache_misses_total", nil, 10},
		{"gowarp_cache_value_bytes_total", []string{"direction", "in"}, 2000},
		{"gowarp_cache_value_bytes_total", []string{"direction", "out"}, 2000},
		{"gowarp_cache_requests_total", []string{"op", "put", "status", "ok"}, 20},
		{"gowarp_cache_requests_total", []string{"op", "get", "status", "ok"}, 20},
		{"gowarp_cache_requests_total", []string{"op", "get", "status", "not-found"}, 10},
		{"gowarp_cache_requests_total", []string{"op", "delete", "status", "ok"}, 5},
		{"gowarp_cache_errors_total", []string{"kind", "not-found"}, 10},
		{"gowarp_cache_request_duration_seconds", []string{"op", "get"}, 30},
	})
	if f["go_goroutines"] == nil || f["process_cpu_seconds_total"] == nil {
		t.Error("no Go runtime or process metrics")
	}

	// 24 blocks of 30 KiB values under a budget of 3: pages out, and in
	// again as they are read back.
	for i := range 48 {
		if err := c.Put(ctx, fmt.Sprintf("p%d", i), bytes.Repeat([]byte{byte(i)}, 30<<10), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 48 {
		if _, err := c.Get(ctx, fmt.Sprintf("p%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	f = scrape(t, s.base)
	st := s.srv.Stats()
	if st.PageOuts == 0 || st.PageIns == 0 {
		t.Fatalf("no paging: %+v", st)
	}
	check(t, f, []want{
		{"gowarp_cache_keys", nil, 15 + 48},
		{"gowarp_cache_paging_total", []string{"direction", "out"}, float64(st.PageOuts)},
		{"gowarp_cache_paging_total", []string{"direction", "in"}, float64(st.PageIns)},
		{"gowarp_cache_resident_blocks", nil, float64(st.Resident)},
		{"gowarp_cache_blocks", nil, float64(st.Blocks)},
		{"gowarp_cache_value_bytes_total", []string{"direction", "in"}, 2000 + 48*30<<10},
		{"gowarp_cache_ops_total", []string{"op", "put"}, float64(st.Puts)},
	})
	if st.Resident > 3 || st.Blocks < 24 {
		t.Errorf("%d blocks, %d resident: want 24 or more under a budget of 3", st.Blocks, st.Resident)
	}

	// A request the server refuses is counted by its kind.
	if err := c.Delete(ctx, "absent"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("delete of an absent key: %v", err)
	}
	c.Close()
	f = scrape(t, s.base)
	check(t, f, []want{
		{"gowarp_cache_errors_total", []string{"kind", "not-found"}, 11},
		{"gowarp_cache_requests_total", []string{"op", "delete", "status", "not-found"}, 1},
	})
	deadline := time.Now().Add(10 * time.Second)
	for value(f, "gowarp_cache_clients") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%v clients after the client closed", value(f, "gowarp_cache_clients"))
		}
		time.Sleep(20 * time.Millisecond)
		f = scrape(t, s.base)
	}
}

func TestObserveAllocs(t *testing.T) {
	m, err := monitor.New(monitor.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	m.Observe(cache.OpGet, cache.StatusOK, 1, time.Microsecond)
	if n := testing.AllocsPerRun(1000, func() { m.Observe(cache.OpGet, cache.StatusOK, 1, time.Microsecond) }); n != 0 {
		t.Errorf("Observe allocates %v times", n)
	}
}

func TestRatesAndHistory(t *testing.T) {
	s := startServer(t, cache.ServerOptions{}, time.Hour)
	c := dial(t, s.addr)
	ctx := ctxT(t)
	m, err := monitor.New(monitor.Options{History: 3, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	m.Attach(s.srv)
	m.Sample()
	for round := range 5 {
		for i := range 4 {
			if err := c.Put(ctx, fmt.Sprintf("k%d-%d", round, i), []byte("v"), cache.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Get(ctx, "k0-0"); err != nil {
			t.Fatal(err)
		}
		c.Get(ctx, "absent")
		m.Sample()
	}
	h := m.History()
	if len(h) != 3 {
		t.Fatalf("%d samples kept, want 3", len(h))
	}
	for i, x := range h {
		if x.Puts <= 0 || x.Gets <= 0 || x.HitRatio != 0.5 {
			t.Errorf("sample %d: %+v: want puts and gets, hit ratio 0.5", i, x)
		}
		if i > 0 && x.T < h[i-1].T {
			t.Errorf("samples out of order: %d before %d", h[i-1].T, x.T)
		}
		// 4 puts for 2 gets in each interval, whatever its length.
		if r := x.Puts / x.Gets; r < 1.99 || r > 2.01 {
			t.Errorf("sample %d: puts/gets %v, want 2", i, r)
		}
	}
	st := m.Status()
	if st.Stats.Puts != 20 || st.HitRatio != 0.5 || len(st.History) != 3 || st.Rates != h[2] || len(st.Clients) != 1 {
		t.Errorf("status %+v", st)
	}
}

func TestHTTPPaths(t *testing.T) {
	s := startServer(t, cache.ServerOptions{}, time.Hour)
	for path, want := range map[string]string{
		"/": "text/html", "/chart.js": "javascript", "/page.js": "javascript", "/page.css": "text/css",
		"/status.json": "application/json", "/metrics": "text/plain",
	} {
		resp, err := http.Get(s.base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), want) {
			t.Errorf("GET %s: %s, %s; want 200, %s", path, resp.Status, resp.Header.Get("Content-Type"), want)
		}
	}
	for _, path := range []string{"/nope", "/web/index.html", "/../monitor.go"} {
		resp, err := http.Get(s.base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
		}
	}
	resp, err := http.Post(s.base+"/status.json", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /status.json: %s", resp.Status)
	}
}

// TestIndexMetrics: with the client-readable index on, the index's series
// move with the traffic: puts fill buckets, deletes clear them, a key too
// long for a bucket overflows, and lookups through the index are counted
// as one-sided Reads while the control path sees none of them.
func TestIndexMetrics(t *testing.T) {
	s := startServer(t, cache.ServerOptions{IndexBuckets: 1024}, time.Hour)
	check(t, scrape(t, s.base), []want{{"gowarp_cache_index_buckets", nil, 1024}, {"gowarp_cache_index_entries", nil, 0},
		{"gowarp_cache_index_updates_total", nil, 0}, {"gowarp_cache_index_reads_total", nil, 0}})

	ctx := ctxT(t)
	c, err := cache.Dial(ctx, s.addr, cache.ClientOptions{Device: gowarp.Open(gowarp.WithLogger(quiet)), Logger: quiet,
		Lookup: cache.LookupIndex})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	long := strings.Repeat("L", 100) // longer than a bucket's key
	for i := range 20 {
		if err := c.Put(ctx, fmt.Sprintf("k%d", i), []byte("value"), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Put(ctx, long, []byte("value"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		e, err := c.Lookup(ctx, fmt.Sprintf("k%d", i))
		if err != nil || e.Size != 5 {
			t.Fatalf("lookup k%d: %+v, %v", i, e, err)
		}
	}
	f := scrape(t, s.base)
	check(t, f, []want{
		{"gowarp_cache_index_entries", nil, 20},
		{"gowarp_cache_index_updates_total", nil, 20},
		{"gowarp_cache_index_overflow_total", nil, 1},
		{"gowarp_cache_index_removes_total", nil, 0},
		{"gowarp_cache_index_reads_total", nil, 20},
		{"gowarp_cache_index_misses_total", nil, 0},
		{"gowarp_cache_ops_total", []string{"op", "get"}, 0}, // no lookup reached the control path
	})

	// The long key is not in the index: the control path answers, and
	// reads no bucket. A replaced value rewrites its bucket; a deleted one
	// clears it.
	if _, err := c.Lookup(ctx, long); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, "k0", []byte("other"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 15; i < 20; i++ {
		if err := c.Delete(ctx, fmt.Sprintf("k%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// A key the index does not have: one Read of the index, then the
	// control path, which says it is not found.
	if _, err := c.Lookup(ctx, "k19"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("lookup of a deleted key: %v", err)
	}
	f = scrape(t, s.base)
	check(t, f, []want{
		{"gowarp_cache_index_entries", nil, 15},
		{"gowarp_cache_index_updates_total", nil, 21},
		{"gowarp_cache_index_removes_total", nil, 5},
		{"gowarp_cache_index_reads_total", nil, 21},
		{"gowarp_cache_index_misses_total", nil, 2}, // the long key and k19
		{"gowarp_cache_ops_total", []string{"op", "get"}, 2},
	})
	if st := s.srv.Stats(); st.IndexEntries != 15 || st.IndexReads != 21 || st.IndexMisses != 2 {
		t.Errorf("Stats %+v", st)
	}
}

// TestNoIndexMetrics: a server without an index shows zeros.
func TestNoIndexMetrics(t *testing.T) {
	s := startServer(t, cache.ServerOptions{IndexBuckets: -1}, time.Hour)
	c := dial(t, s.addr)
	if err := c.Put(ctxT(t), "k", []byte("v"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	check(t, scrape(t, s.base), []want{{"gowarp_cache_index_buckets", nil, 0}, {"gowarp_cache_index_entries", nil, 0},
		{"gowarp_cache_index_updates_total", nil, 0}})
}
