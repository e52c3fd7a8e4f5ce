package monitor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gowarp/gowarp/cache"
)

// browser starts a headless Chromium for the test, or skips the test,
// saying so, where none is installed ($GOWARP_CHROMIUM names one).
func browser(t *testing.T) context.Context {
	t.Helper()
	path := os.Getenv("GOWARP_CHROMIUM")
	if path == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
			if p, err := exec.LookPath(name); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		t.Skip("no Chromium found (apt-get install chromium, or set GOWARP_CHROMIUM): the status page is not tested in a browser")
	}
	// The machine may have no network: every flag that stops Chromium
	// from reaching out, and a profile of its own.
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1200, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelB(); cancelA() })
	// The first call starts the browser, which lives as long as its
	// context: no timeout on it, but one on waiting for it.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("start %s: %v", path, err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not start in 60 s", path)
	}
	tctx, cancelT := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancelT)
	return tctx
}

// pageState is what the page shows, read in the browser.
type pageState struct {
	Points  int               `json:"points"`
	Peak    float64           `json:"peak"`
	Inked   int               `json:"inked"`
	Values  map[string]string `json:"values"`
	Texts   map[string]string `json:"texts"`
	Clients int               `json:"clients"`
	Client  string            `json:"client"` // the first client's address
	State   string            `json:"state"`
}

// readPage reads the figures (their raw data-value and their text) and
// what the ops chart drew: the points and peak it recorded, and the pixels
// inked in the gets series' colour (#3b7dd8), counted from the canvas.
const readPage = `(() => {
  const c = document.getElementById("opsChart");
  const img = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let inked = 0;
  for (let i = 0; i < img.length; i += 4) {
    if (Math.abs(img[i] - 0x3b) < 24 && Math.abs(img[i+1] - 0x7d) < 24 && Math.abs(img[i+2] - 0xd8) < 24 && img[i+3] > 128) inked++;
  }
  const values = {}, texts = {};
  for (const e of document.querySelectorAll("dd[id], #conns")) { values[e.id] = e.dataset.value || ""; texts[e.id] = e.textContent; }
  return {points: Number(c.dataset.points || 0), peak: Number(c.dataset.peak || 0), inked,
          values, texts, clients: document.querySelectorAll("#clients tr").length,
          client: (document.querySelector("#clients td") || {}).textContent || "",
          state: document.getElementById("state").textContent};
})()`

func TestStatusPageInBrowser(t *testing.T) {
	ctx := browser(t)
	s := startServer(t, cache.ServerOptions{}, 100*time.Millisecond)
	c := dial(t, s.addr)

	// Live traffic until the chart has drawn it: puts, and gets of which
	// one in six misses.
	stop := make(chan struct{})
	trafficDone := make(chan error, 1)
	go func() {
		tctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for i := 0; ; i++ {
			select {
			case <-stop:
				trafficDone <- nil
				return
			case <-time.After(time.Millisecond):
			}
			if err := c.Put(tctx, fmt.Sprintf("k%d", i%500), make([]byte, 100+i%7), cache.PutOptions{}); err != nil {
				trafficDone <- err
				return
			}
			if _, err := c.Get(tctx, fmt.Sprintf("k%d", (i*7)%600)); err != nil && !errors.Is(err, cache.ErrNotFound) {
				trafficDone <- err
				return
			}
		}
	}()
	stopped := false
	stopTraffic := func() {
		if !stopped {
			stopped = true
			close(stop)
			if err := <-trafficDone; err != nil {
				t.Errorf("traffic: %v", err)
			}
		}
	}
	defer stopTraffic()
	if err := chromedp.Do(ctx, chromedp.Navigate(s.base+"/")); err != nil {
		t.Fatal(err)
	}
	var ps pageState
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if ps, err = chromedp.Run(ctx, chromedp.Evaluate[pageState](readPage)); err != nil {
			t.Fatal(err)
		}
		if ps.Points >= 5 && ps.Peak > 0 && ps.Inked > 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the chart drew no traffic in 30 s: %+v", ps)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("chart: %d points, peak %.0f ops/s, %d pixels inked", ps.Points, ps.Peak, ps.Inked)

	// Traffic stopped, the page must come to show the server's figures.
	stopTraffic()
	st := s.srv.Stats()
	want := map[string]string{
		"keys": strconv.FormatUint(st.Keys, 10), "bytes": strconv.FormatUint(st.Bytes, 10),
		"blocks": strconv.FormatUint(st.Blocks, 10), "resident": strconv.FormatUint(st.Resident, 10),
		"budget": strconv.FormatUint(st.Budget, 10), "blockSize": strconv.FormatUint(st.BlockSize, 10),
		"gets": strconv.FormatUint(st.Gets, 10), "puts": strconv.FormatUint(st.Puts, 10),
		"hitsMisses": fmt.Sprintf("%d/%d", st.Hits, st.Misses), "errors": strconv.FormatUint(st.Errors, 10),
		"hitRatio": strconv.FormatFloat(float64(st.Hits)/float64(st.Gets), 'g', -1, 64),
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		var err error
		if ps, err = chromedp.Run(ctx, chromedp.Evaluate[pageState](readPage)); err != nil {
			t.Fatal(err)
		}
		bad := ""
		for id, v := range want {
			if ps.Values[id] != v {
				bad += fmt.Sprintf(" %s=%q (want %q)", id, ps.Values[id], v)
			}
		}
		if bad == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page shows%s", bad)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The text a person reads says the same.
	if got, want := ps.Texts["keys"], fmtThousands(st.Keys); got != want {
		t.Errorf("keys shown as %q, want %q", got, want)
	}
	if cs := s.srv.Clients(); ps.Clients != 1 || len(cs) != 1 || ps.Client != cs[0].Addr {
		t.Errorf("clients listed: %d, the first %q; the server's: %+v", ps.Clients, ps.Client, cs)
	}
	if ps.State == "" || ps.State[:4] != "live" {
		t.Errorf("state %q", ps.State)
	}
}

func fmtThousands(n uint64) string {
	s := strconv.FormatUint(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
