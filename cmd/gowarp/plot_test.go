package main

import (
	"context"
	"encoding/xml"
	"errors"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gowarp/gowarp/internal/perf"
)

// TestPerfPlot makes a short sweep of all eight tests with -plot, in SVG
// and PNG, and opens what it wrote: the SVG parses as XML and names the
// four series in its legend; the PNG decodes and shows each series'
// colour.
func TestPerfPlot(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"sweep.svg", "sweep.png"} {
		file := filepath.Join(dir, name)
		code, out, errs := runCmd(t, context.Background(), "perf", "-sweep", "-iters", "2", "-depth", "4", "-plot", file)
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, errs)
		}
		if !strings.Contains(out, "# plot: "+file) {
			t.Errorf("output does not name the plot:\n%s", out)
		}
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if strings.HasSuffix(name, ".svg") {
			texts := svgTexts(t, f)
			for _, want := range []string{"RDMA Write", "RDMA Read", "Send", "plain TCP", "gowarp perf -sweep -iters 2", "loopback"} {
				if !strings.Contains(texts, "\n"+want) {
					t.Errorf("%s: no text %q", name, want)
				}
			}
			continue
		}
		img, err := png.Decode(f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		seen := map[string]int{}
		b := img.Bounds()
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				r, g, bl, _ := img.At(x, y).RGBA()
				for name, c := range perf.PlotSeriesColors() {
					if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(bl>>8) == c.B {
						seen[name]++
					}
				}
			}
		}
		for name := range perf.PlotSeriesColors() {
			if seen[name] < 200 {
				t.Errorf("sweep.png: series %s has %d pixels of its colour", name, seen[name])
			}
		}
	}
}

// svgTexts parses r as XML with an <svg> root and returns its <text>
// elements' text, each after a newline.
func svgTexts(t *testing.T, r io.Reader) string {
	t.Helper()
	dec := xml.NewDecoder(r)
	var texts strings.Builder
	root, in := "", false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG does not parse: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			if in = tok.Name.Local == "text"; in {
				texts.WriteString("\n")
			}
		case xml.CharData:
			if in {
				texts.Write(tok)
			}
		case xml.EndElement:
			in = false
		}
	}
	if root != "svg" {
		t.Fatalf("root element <%s>, not <svg>", root)
	}
	return texts.String()
}

func TestPerfPlotUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"perf", "-plot", "x.gif"}, "want a name ending in .svg"},
		{[]string{"perf", "-server", "127.0.0.1:0", "-plot", "x.svg"}, "not with -server"},
	} {
		code, _, errs := runCmd(t, context.Background(), tc.args...)
		if code != exitUsage || !strings.Contains(errs, tc.msg) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", tc.args, code, errs, tc.msg)
		}
	}
	// A file that cannot be written: the runs happen, the tool fails.
	code, _, errs := runCmd(t, context.Background(), "perf", "-test", "tcp_lat", "-iters", "2", "-plot", filepath.Join(t.TempDir(), "no", "such", "dir.svg"))
	if code != exitFailure || !strings.Contains(errs, "no such file") {
		t.Errorf("unwritable plot: exit %d, %q", code, errs)
	}
}
