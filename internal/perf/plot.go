package perf

import (
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgpdf"
	"gonum.org/v1/plot/vg/vgsvg"
)

// PlotFormats are the file formats WritePlot draws, by file extension.
var PlotFormats = []string{"svg", "png", "pdf"}

// PlotFormat returns the format of a plot file named name, from its
// extension.
func PlotFormat(name string) (string, error) {
	ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(name), "."))
	if !slices.Contains(PlotFormats, ext) {
		return "", fmt.Errorf("plot file %q: want a name ending in .%s", name, strings.Join(PlotFormats, ", ."))
	}
	return ext, nil
}

// A series is one transport in the plot: its bandwidth and latency tests,
// its colour and its glyph.
type series struct {
	name     string
	bw, lat  Test
	color    color.RGBA
	glyph    draw.GlyphDrawer
	dashes   []vg.Length
	baseline bool // plain TCP, the floor the others are divided by
}

// plotSeries are the four transports of the sheet, in legend order. The
// colours are the Okabe-Ito palette's, told apart by the colour-blind too;
// the glyphs tell them apart in grey.
var plotSeries = []series{
	{name: "RDMA Write", bw: WriteBW, lat: WriteLat, color: color.RGBA{0, 114, 178, 255}, glyph: draw.CircleGlyph{}},
	{name: "RDMA Read", bw: ReadBW, lat: ReadLat, color: color.RGBA{213, 94, 0, 255}, glyph: draw.SquareGlyph{}},
	{name: "Send", bw: SendBW, lat: SendLat, color: color.RGBA{0, 158, 115, 255}, glyph: draw.TriangleGlyph{}},
	{name: "plain TCP", bw: TCPBW, lat: TCPLat, color: color.RGBA{64, 64, 64, 255}, glyph: draw.CrossGlyph{},
		dashes: []vg.Length{vg.Points(4), vg.Points(3)}, baseline: true},
}

// PlotSeriesColors returns the colour of each series by its legend name
// (tests look for them in a PNG).
func PlotSeriesColors() map[string]color.RGBA {
	m := map[string]color.RGBA{}
	for _, s := range plotSeries {
		m[s.name] = s.color
	}
	return m
}

func (s series) styles() (draw.LineStyle, draw.GlyphStyle) {
	return draw.LineStyle{Color: s.color, Width: vg.Points(1.5), Dashes: s.dashes},
		draw.GlyphStyle{Color: s.color, Shape: s.glyph, Radius: vg.Points(2.5)}
}

// drawLegend writes the names of ss, each after a sample of its line and
// glyph, in one row centred on the sheet at height y.
func drawLegend(dc draw.Canvas, ss []series, y vg.Length) {
	ts := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 12),
		XAlign: draw.XLeft, YAlign: draw.YCenter, Handler: plot.DefaultTextHandler}
	thumb, gap, pad := vg.Points(28), vg.Points(24), vg.Points(5)
	var total vg.Length
	for _, s := range ss {
		total += thumb + pad + ts.Width(s.name) + gap
	}
	x := dc.Center().X - (total-gap)/2
	for _, s := range ss {
		ls, gs := s.styles()
		icon := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{
			Min: vg.Point{X: x, Y: y - vg.Points(6)}, Max: vg.Point{X: x + thumb, Y: y + vg.Points(6)}}}
		(&plotter.Line{LineStyle: ls}).Thumbnail(&icon)
		(&plotter.Scatter{GlyphStyle: gs}).Thumbnail(&icon)
		dc.FillText(ts, vg.Point{X: x + thumb + pad, Y: y}, s.name)
		x += thumb + pad + ts.Width(s.name) + gap
	}
}

// A panel is one plot of the sheet: a value of a result against size.
type panel struct {
	title, ylabel string
	bandwidth     bool
	ratio         bool
	value         func(Result) float64
}

// The y labels are short: plot pads a panel for its y label as if the
// label stood upright from the axis' middle, so a long one squashes the
// panel. The titles say the rest.
var (
	bwPanel = panel{title: "Bandwidth (MB/s, 10^6 bytes/s of payload)", ylabel: "MB/s", bandwidth: true,
		value: func(r Result) float64 { return r.MBps }}
	latPanel = panel{title: "Latency, median (µs; one way, the whole Read for Read)", ylabel: "µs",
		value: func(r Result) float64 { return r.LatP50 }}
	bwRatioPanel = panel{title: "Bandwidth / plain TCP's (higher is better)", ylabel: "ratio",
		bandwidth: true, ratio: true, value: bwPanel.value}
	latRatioPanel = panel{title: "Latency / plain TCP's (lower is better)", ylabel: "ratio",
		ratio: true, value: latPanel.value}
)

// WritePlot draws results on one sheet in format ("svg", "png" or "pdf")
// and writes it to w: bandwidth and latency against message size for each
// transport that has results, and, where plain TCP has results at the same
// sizes, each transport's ratio to TCP's. title heads the sheet (lines
// apart by "\n"); say there how the figures were made.
func WritePlot(w io.Writer, format string, results []Result, title string) error {
	var cols []panel
	var ratios []panel
	hasTCP := func(bw bool) bool {
		return slices.ContainsFunc(results, func(r Result) bool { return r.Test.TCP() && r.Test.Bandwidth() == bw })
	}
	if slices.ContainsFunc(results, func(r Result) bool { return r.Test.Bandwidth() }) {
		cols, ratios = append(cols, bwPanel), append(ratios, bwRatioPanel)
	}
	if slices.ContainsFunc(results, func(r Result) bool { return !r.Test.Bandwidth() }) {
		cols, ratios = append(cols, latPanel), append(ratios, latRatioPanel)
	}
	if len(cols) == 0 {
		return errors.New("plot: no results to draw")
	}
	rows := [][]panel{cols}
	// Ratios where TCP has results for every column.
	if !slices.ContainsFunc(ratios, func(p panel) bool { return !hasTCP(p.bandwidth) }) {
		rows = append(rows, ratios)
	}
	plots := make([][]*plot.Plot, len(rows))
	for i, row := range rows {
		for _, pn := range row {
			p, err := drawPanel(pn, results)
			if err != nil {
				return err
			}
			plots[i] = append(plots[i], p)
		}
	}

	lines := vg.Length(strings.Count(title, "\n") + 1)
	header := lines*vg.Points(16) + vg.Points(30)
	width, height := max(6*vg.Inch*vg.Length(len(cols)), 8*vg.Inch), 4.5*vg.Inch*vg.Length(len(rows))+header
	var c vg.CanvasWriterTo
	switch format {
	case "svg":
		c = vgsvg.New(width, height)
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(96))}
	case "pdf":
		c = vgpdf.New(width, height)
	default:
		return fmt.Errorf("plot: unknown format %q (want %s)", format, strings.Join(PlotFormats, ", "))
	}
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())

	// The sheet's title, and under it one legend for all panels.
	ts := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 13),
		XAlign: draw.XCenter, YAlign: draw.YTop, Handler: plot.DefaultTextHandler}
	dc.FillText(ts, vg.Point{X: width / 2, Y: height - vg.Points(8)}, title)
	var present []series
	for _, s := range plotSeries {
		if slices.ContainsFunc(results, func(r Result) bool { return r.Test == s.bw || r.Test == s.lat }) {
			present = append(present, s)
		}
	}
	drawLegend(dc, present, height-header+vg.Points(10))
	body := draw.Crop(dc, 0, 0, 0, -header)

	tiles := draw.Tiles{Rows: len(rows), Cols: len(cols),
		PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 5}
	canvases := plot.Align(plots, tiles, body)
	for i := range plots {
		for j, p := range plots[i] {
			p.Draw(canvases[i][j])
		}
	}
	_, err := c.WriteTo(w)
	return err
}

// drawPanel makes one panel: a line per series, log-log.
func drawPanel(pn panel, results []Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.X.Label.Text = "message size (bytes)"
	p.Y.Label.Text = pn.ylabel
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = sizeTicks{}
	p.Y.Tick.Marker = logTicks{}
	p.Add(plotter.NewGrid())

	// TCP's value per size, for the ratios.
	base := map[int]float64{}
	for _, r := range results {
		if r.Test.TCP() && r.Test.Bandwidth() == pn.bandwidth {
			if v := pn.value(r); v > 0 {
				base[r.Size] = v
			}
		}
	}
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	if pn.ratio {
		ylo, yhi = 1, 1 // TCP's own line
	}
	for _, s := range plotSeries {
		t := s.lat
		if pn.bandwidth {
			t = s.bw
		}
		var xys plotter.XYs
		for _, r := range results {
			v := pn.value(r)
			if r.Test != t || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
				continue
			}
			if pn.ratio {
				b, ok := base[r.Size]
				if !ok {
					continue
				}
				v /= b
			}
			xys = append(xys, plotter.XY{X: float64(r.Size), Y: v})
			xlo, xhi = min(xlo, float64(r.Size)), max(xhi, float64(r.Size))
			ylo, yhi = min(ylo, v), max(yhi, v)
		}
		if len(xys) == 0 {
			continue
		}
		slices.SortFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		line.LineStyle, points.GlyphStyle = s.styles()
		p.Add(line, points)
	}
	if math.IsInf(xlo, 0) {
		return nil, fmt.Errorf("plot: nothing to draw in %q", pn.title)
	}
	// Margins by factors, as the axes are logarithmic (plot's own widen a
	// one-point range by ±1, which can reach zero).
	p.X.Min, p.X.Max = xlo/1.3, xhi*1.3
	p.Y.Min, p.Y.Max = ylo/1.3, yhi*1.3
	return p, nil
}

// sizeTicks marks powers of two on a log axis of sizes in bytes: every
// one as a minor tick, every fourth labelled (1, 16, 256, 4K, 64K, 1M).
type sizeTicks struct{}

func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := 0; e <= 40; e++ {
		v := math.Ldexp(1, e)
		if v < lo/1.01 || v > hi*1.01 {
			continue
		}
		t := plot.Tick{Value: v}
		if e%4 == 0 || (hi/lo < 64 && e%2 == 0) {
			t.Label = sizeLabel(e)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

func sizeLabel(e int) string {
	switch {
	case e >= 30:
		return fmt.Sprintf("%dG", 1<<(e-30))
	case e >= 20:
		return fmt.Sprintf("%dM", 1<<(e-20))
	case e >= 10:
		return fmt.Sprintf("%dK", 1<<(e-10))
	}
	return fmt.Sprint(1 << e)
}

// logTicks labels 1, 2 and 5 times each power of ten on a log axis where
// that leaves labels apart, and 1 alone where the range is wide; unlike
// plot.LogTicks it never panics and labels ranges inside one decade.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(lo > 0) || !(hi > 0) || hi < lo {
		return nil
	}
	steps := []float64{1, 2, 5}
	if hi/lo > 1e3 {
		steps = []float64{1}
	}
	var ticks []plot.Tick
	for d := math.Floor(math.Log10(lo)); d <= math.Ceil(math.Log10(hi)); d++ {
		for i := 1; i < 10; i++ {
			v := float64(i) * math.Pow(10, d)
			if v < lo/1.001 || v > hi*1.001 {
				continue
			}
			t := plot.Tick{Value: v}
			if slices.Contains(steps, float64(i)) {
				t.Label = fmt.Sprintf("%g", v)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}
