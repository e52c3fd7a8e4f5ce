package monitor

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gowarp/gowarp/cache"
)

// The page and its chart script are embedded: the page needs nothing from
// the network, so it works on a machine with none.
//
//go:embed web
var webFS embed.FS

// Status is what /status.json serves: the page's whole state.
type Status struct {
	Name       string      `json:"name"`
	Time       time.Time   `json:"time"`
	IntervalMS int64       `json:"intervalMs"`
	Stats      cache.Stats `json:"stats"`
	// HitRatio is hits over gets since the server started, or -1 with no
	// gets yet.
	HitRatio float64            `json:"hitRatio"`
	Clients  []cache.ClientInfo `json:"clients"`
	// Rates is the last sample (zero before the second one), History
	// the samples kept, oldest first.
	Rates   Sample   `json:"rates"`
	History []Sample `json:"history"`
}

// Status returns the status now.
func (m *Monitor) Status() Status {
	s := Status{Name: m.o.Name, Time: time.Now(), IntervalMS: m.o.Interval.Milliseconds(), Stats: m.stats(),
		HitRatio: -1, History: m.History(), Clients: []cache.ClientInfo{}}
	if s.Stats.Gets > 0 {
		s.HitRatio = float64(s.Stats.Hits) / float64(s.Stats.Gets)
	}
	if c := m.clients(); c != nil {
		s.Clients = c
	}
	if n := len(s.History); n > 0 {
		s.Rates = s.History[n-1]
	}
	return s
}

// Handler serves the status page on /, its JSON on /status.json and the
// metrics on /metrics.
func (m *Monitor) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if err := json.NewEncoder(w).Encode(m.Status()); err != nil {
			m.o.Logger.Debug("monitor: status.json", "err", err)
		}
	})
	web, _ := fs.Sub(webFS, "web")
	files := http.FileServerFS(web)
	mux.Handle("GET /", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" && r.URL.Path != "/chart.js" && r.URL.Path != "/page.js" && r.URL.Path != "/page.css" {
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	}))
	return mux
}
