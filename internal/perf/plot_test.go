package perf

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image"
	"image/png"
	"io"
	"strings"
	"testing"
)

// sweepResults makes results for tests at every power of two from 2 B to
// 1 MiB, with plausible shapes.
func sweepResults(tests ...Test) []Result {
	var rs []Result
	for _, t := range tests {
		for s := 2; s <= 1<<20; s *= 2 {
			r := Result{Test: t, Size: s, Iters: 10}
			k := float64(t) // tell the series apart
			if t.Bandwidth() {
				r.MBps = float64(s) / (1 + float64(s)/2000) * (1 + k/10)
			} else {
				r.LatP50 = 8 + k + float64(s)/5000
			}
			rs = append(rs, r)
		}
	}
	return rs
}

// svgTexts parses an SVG document as XML and returns the text of its
// <text> elements.
func svgTexts(r io.Reader) ([]string, error) {
	dec := xml.NewDecoder(r)
	var texts []string
	var root string
	in := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			in = tok.Name.Local == "text"
			if in {
				texts = append(texts, "")
			}
		case xml.CharData:
			if in {
				texts[len(texts)-1] += string(tok)
			}
		case xml.EndElement:
			in = false
		}
	}
	if root != "svg" {
		return nil, errors.New("root element is <" + root + ">, not <svg>")
	}
	return texts, nil
}

// countColors counts the pixels of img of each colour in want.
func countColors(img image.Image, want map[string][3]uint8) map[string]int {
	n := map[string]int{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			for name, c := range want {
				if uint8(r>>8) == c[0] && uint8(g>>8) == c[1] && uint8(bl>>8) == c[2] {
					n[name]++
				}
			}
		}
	}
	return n
}

func seriesRGB() map[string][3]uint8 {
	m := map[string][3]uint8{}
	for name, c := range PlotSeriesColors() {
		m[name] = [3]uint8{c.R, c.G, c.B}
	}
	return m
}

func TestWritePlotSVG(t *testing.T) {
	var b bytes.Buffer
	if err := WritePlot(&b, "svg", sweepResults(AllTests()...), "a title\nsecond line"); err != nil {
		t.Fatal(err)
	}
	texts, err := svgTexts(&b)
	if err != nil {
		t.Fatalf("SVG does not parse: %v", err)
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{"a title", "second line", "RDMA Write", "RDMA Read", "Send", "plain TCP",
		bwPanel.title, latPanel.title, bwRatioPanel.title, latRatioPanel.title, "message size (bytes)", "MB/s", "µs", "1M", "4K"} {
		if !strings.Contains(all, want) {
			t.Errorf("SVG has no text %q; texts:\n%s", want, all)
		}
	}
}

func TestWritePlotPNG(t *testing.T) {
	var b bytes.Buffer
	if err := WritePlot(&b, "png", sweepResults(AllTests()...), "png"); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatalf("PNG does not decode: %v", err)
	}
	if s := img.Bounds().Size(); s.X < 1000 || s.Y < 800 {
		t.Errorf("PNG is %v, want a sheet of at least 1000x800", s)
	}
	for name, n := range countColors(img, seriesRGB()) {
		// Four panels of 20 glyphs and lines each, and the legend.
		if n < 500 {
			t.Errorf("series %s: %d pixels of its colour", name, n)
		}
	}
	if n := len(countColors(img, seriesRGB())); n != 4 {
		t.Errorf("%d of the 4 series' colours drawn", n)
	}
}

// TestWritePlotFollowsData: a plot of some tests shows the panels and
// legend entries those tests have, and no others.
func TestWritePlotFollowsData(t *testing.T) {
	for _, tc := range []struct {
		tests       []Test
		want, avoid []string
	}{
		{[]Test{WriteBW, TCPBW}, []string{"RDMA Write", "plain TCP", bwPanel.title, bwRatioPanel.title},
			[]string{"RDMA Read", "Send", latPanel.title, latRatioPanel.title}},
		{[]Test{ReadLat, SendLat}, []string{"RDMA Read", "Send", latPanel.title},
			[]string{"RDMA Write", "plain TCP", bwPanel.title, latRatioPanel.title}},
		// TCP latency alone cannot give a bandwidth ratio: no ratio row.
		{[]Test{WriteBW, WriteLat, TCPLat}, []string{"RDMA Write", "plain TCP", bwPanel.title, latPanel.title},
			[]string{bwRatioPanel.title, latRatioPanel.title}},
	} {
		var b bytes.Buffer
		if err := WritePlot(&b, "svg", sweepResults(tc.tests...), "t"); err != nil {
			t.Fatalf("%v: %v", tc.tests, err)
		}
		texts, err := svgTexts(&b)
		if err != nil {
			t.Fatal(err)
		}
		all := "\n" + strings.Join(texts, "\n") + "\n"
		for _, w := range tc.want {
			if !strings.Contains(all, "\n"+w+"\n") {
				t.Errorf("%v: no %q", tc.tests, w)
			}
		}
		for _, w := range tc.avoid {
			if strings.Contains(all, "\n"+w+"\n") {
				t.Errorf("%v: %q drawn", tc.tests, w)
			}
		}
	}
}

func TestWritePlotOddInput(t *testing.T) {
	if err := WritePlot(io.Discard, "svg", nil, "t"); err == nil {
		t.Error("no results: no error")
	}
	if err := WritePlot(io.Discard, "gif", sweepResults(WriteBW), "t"); err == nil {
		t.Error("format gif: no error")
	}
	// One size per test (no sweep), zero and missing values: drawn, no panic.
	one := []Result{{Test: WriteBW, Size: 65536, MBps: 2000}, {Test: TCPBW, Size: 65536, MBps: 1800},
		{Test: ReadBW, Size: 65536}, {Test: SendLat, Size: 8, LatP50: 12}, {Test: TCPLat, Size: 8, LatP50: 9}}
	for _, f := range PlotFormats {
		var b bytes.Buffer
		if err := WritePlot(&b, f, one, "one size"); err != nil || b.Len() == 0 {
			t.Errorf("%s: %v, %d bytes", f, err, b.Len())
		}
	}
	// Only zero values: nothing to draw, an error.
	if err := WritePlot(io.Discard, "png", []Result{{Test: WriteBW, Size: 8}}, "t"); err == nil {
		t.Error("all-zero results: no error")
	}
	for name, ok := range map[string]bool{"a.svg": true, "dir/b.PNG": true, "c.pdf": true, "d.gif": false, "svg": false, "": false} {
		if _, err := PlotFormat(name); (err == nil) != ok {
			t.Errorf("PlotFormat(%q): %v", name, err)
		}
	}
}
