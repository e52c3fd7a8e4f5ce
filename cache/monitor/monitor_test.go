package monitor_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gowarp/gowarp/cache/monitor"
)

var quiet = slog.New(slog.DiscardHandler)

// counters is a store of values with a server's counters, and the traffic
// that moves them: each op goes through it as a request does through a
// server (the counters move, then Observe hears of the request).
type counters struct {
	mu   sync.Mutex
	st   monitor.Stats
	vals map[string]int
	m    *monitor.Monitor
}

func newCounters() *counters {
	return &counters{st: monitor.Stats{BlockSize: 1 << 20, Budget: 64 << 20}, vals: map[string]int{}}
}

func (c *counters) Stats() monitor.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

func (c *counters) put(key string, n int) {
	start := time.Now()
	c.mu.Lock()
	if old, ok := c.vals[key]; ok {
		c.st.Bytes -= uint64(old)
	} else {
		c.st.Keys++
	}
	c.vals[key] = n
	c.st.Puts++
	c.st.Bytes += uint64(n)
	c.st.BytesIn += uint64(n)
	c.st.Blocks = c.st.Bytes/c.st.BlockSize + 1
	c.st.Resident = min(c.st.Blocks, c.st.Budget/c.st.BlockSize)
	c.mu.Unlock()
	c.m.Observe("put", monitor.StatusOK, n, time.Since(start))
}

func (c *counters) get(key string) {
	start := time.Now()
	c.mu.Lock()
	c.st.Gets++
	n, ok := c.vals[key]
	status := monitor.StatusOK
	if ok {
		c.st.Hits++
		c.st.BytesOut += uint64(n)
	} else {
		c.st.Misses++
		c.st.Errors++
		status = "not-found"
	}
	c.mu.Unlock()
	c.m.Observe("get", status, n, time.Since(start))
}

func startMonitor(t testing.TB, c *counters, interval time.Duration) (base string, m *monitor.Monitor) {
	t.Helper()
	m, err := monitor.New(monitor.Options{Stats: c.Stats, Name: "test", Interval: interval, Logger: quiet,
		Clients: func() []monitor.Client {
			return []monitor.Client{{Addr: "127.0.0.1:5555", Since: time.Now(), Requests: 3}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	c.m = m
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String(), m
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

// value is the value of the metric name with labels (name=value pairs).
func value(t testing.TB, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, m := range f.Metric {
		for i := 0; i < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
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
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}

func TestMetricsMove(t *testing.T) {
	c := newCounters()
	base, _ := startMonitor(t, c, time.Hour)
	before := scrape(t, base)
	if v := value(t, before, "gowarp_cache_keys"); v != 0 {
		t.Fatalf("keys %v before any put", v)
	}
	for i := range 10 {
		c.put(fmt.Sprintf("k%d", i), 1000)
	}
	for i := range 15 {
		c.get(fmt.Sprintf("k%d", i)) // 10 hits, 5 misses
	}
	f := scrape(t, base)
	for _, w := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gowarp_cache_keys", nil, 10},
		{"gowarp_cache_stored_bytes", nil, 10000},
		{"gowarp_cache_ops_total", []string{"op", "put"}, 10},
		{"gowarp_cache_ops_total", []string{"op", "get"}, 15},
		{"gowarp_cache_hits_total", nil, 10},
		{"gowarp_cache_misses_total", nil, 5},
		{"gowarp_cache_value_bytes_total", []string{"direction", "in"}, 10000},
		{"gowarp_cache_value_bytes_total", []string{"direction", "out"}, 10000},
		{"gowarp_cache_requests_total", []string{"op", "put", "status", "ok"}, 10},
		{"gowarp_cache_requests_total", []string{"op", "get", "status", "ok"}, 10},
		{"gowarp_cache_requests_total", []string{"op", "get", "status", "not-found"}, 5},
		{"gowarp_cache_errors_total", []string{"kind", "not-found"}, 5},
		{"gowarp_cache_request_duration_seconds", []string{"op", "get"}, 15},
		{"gowarp_cache_budget_bytes", nil, 64 << 20},
	} {
		if got := value(t, f, w.name, w.labels...); got != w.want {
			t.Errorf("%s%v = %v, want %v", w.name, w.labels, got, w.want)
		}
	}
	if f["go_goroutines"] == nil || f["process_cpu_seconds_total"] == nil {
		t.Error("no Go runtime or process metrics")
	}
}

func TestObserveAllocs(t *testing.T) {
	c := newCounters()
	m, err := monitor.New(monitor.Options{Stats: c.Stats, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	m.Observe("get", monitor.StatusOK, 1, time.Microsecond)
	if n := testing.AllocsPerRun(1000, func() { m.Observe("get", monitor.StatusOK, 1, time.Microsecond) }); n != 0 {
		t.Errorf("Observe allocates %v times", n)
	}
}

func TestRatesAndHistory(t *testing.T) {
	c := newCounters()
	m, err := monitor.New(monitor.Options{Stats: c.Stats, History: 3, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c.m = m
	m.Sample()
	for round := range 5 {
		for i := range 4 {
			c.put(fmt.Sprintf("k%d-%d", round, i), 10)
		}
		c.get("k0-0")
		c.get("absent")
		time.Sleep(5 * time.Millisecond)
		m.Sample()
	}
	h := m.History()
	if len(h) != 3 {
		t.Fatalf("%d samples kept, want 3", len(h))
	}
	for i, s := range h {
		if s.Puts <= 0 || s.Gets <= 0 || s.HitRatio != 0.5 {
			t.Errorf("sample %d: %+v: want puts and gets, hit ratio 0.5", i, s)
		}
		if i > 0 && s.T < h[i-1].T {
			t.Errorf("samples out of order: %d before %d", h[i-1].T, s.T)
		}
	}
	// 4 puts for 2 gets in each interval, whatever its length.
	if r := h[2].Puts / h[2].Gets; r < 1.99 || r > 2.01 {
		t.Errorf("puts/gets %v, want 2", r)
	}
	st := m.Status()
	if st.Stats.Puts != 20 || st.HitRatio != 0.5 || len(st.History) != 3 || st.Rates != h[2] {
		t.Errorf("status %+v", st)
	}
}

func TestHTTPPaths(t *testing.T) {
	base, _ := startMonitor(t, newCounters(), time.Hour)
	for path, want := range map[string]string{
		"/": "text/html", "/chart.js": "javascript", "/page.js": "javascript", "/page.css": "text/css",
		"/status.json": "application/json", "/metrics": "text/plain",
	} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), want) {
			t.Errorf("GET %s: %s, %s; want 200, %s", path, resp.Status, resp.Header.Get("Content-Type"), want)
		}
	}
	for _, path := range []string{"/nope", "/web/index.html", "/../monitor.go"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
		}
	}
	resp, err := http.Post(base+"/status.json", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /status.json: %s", resp.Status)
	}
}
