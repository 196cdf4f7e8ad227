package sim

import (
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// cdfPoints caps the points per CDF line; more add nothing visible.
const cdfPoints = 400

// PlotTTFTCDF draws one TTFT CDF line per policy, TTFT on a log axis.
func PlotTTFTCDF(path string, results []Result, sc Scenario) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("TTFT at the client, %s", sc)
	p.X.Label.Text = "TTFT (s, log scale)"
	p.Y.Label.Text = "fraction of completed requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = false, true
	for i, r := range results {
		if len(r.TTFTs) == 0 {
			continue
		}
		pts := make(plotter.XYs, 0, cdfPoints)
		n := len(r.TTFTs)
		for k := range cdfPoints {
			idx := min(n-1, k*n/cdfPoints)
			pts = append(pts, plotter.XY{X: math.Max(r.TTFTs[idx], 1e-3), Y: float64(idx+1) / float64(n)})
		}
		pts = append(pts, plotter.XY{X: math.Max(r.TTFTs[n-1], 1e-3), Y: 1})
		line, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("TTFT CDF of %s: %w", r.Policy, err)
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(r.Policy, line)
	}
	return save(p, path, 7*vg.Inch, 4.5*vg.Inch)
}

// PlotWeights draws, for each policy, cluster 0's weight per engine over time, one panel
// per policy stacked vertically.
func PlotWeights(path string, results []Result, cfg *Config) error {
	rows := len(results)
	plots := make([][]*plot.Plot, rows)
	end := 0.0
	for _, r := range results {
		if n := len(r.Samples); n > 0 {
			end = max(end, r.Samples[n-1].At.Seconds())
		}
	}
	for i, r := range results {
		p, err := weightsPanel(r, cfg)
		if err != nil {
			return err
		}
		p.X.Min, p.X.Max = 0, end // one time axis for every panel
		plots[i] = []*plot.Plot{p}
	}
	const width, rowHeight = 8 * vg.Inch, 2.2 * vg.Inch
	img := vgimg.New(width, rowHeight*vg.Length(rows))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: 1, PadY: vg.Points(6), PadX: vg.Points(6)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	return writePNG(img, path)
}

func weightsPanel(r Result, cfg *Config) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: cluster %s weights per engine", r.Policy, cfg.Regions[0])
	p.X.Label.Text = "time (s)"
	p.Y.Label.Text = "share"
	p.Y.Min, p.Y.Max = 0, 1
	engines := cfg.engines()
	for e := range engines {
		pts := make(plotter.XYs, 0, len(r.Samples))
		for _, s := range r.Samples {
			pts = append(pts, plotter.XY{X: s.At.Seconds(), Y: s.W[0][e]})
		}
		if len(pts) == 0 {
			continue
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("weights of %s: %w", r.Policy, err)
		}
		line.Color = engineColor(e, cfg.EnginesPerRegion)
		line.Width = vg.Points(1)
		p.Add(line)
	}
	return p, nil
}

// engineColor gives each region a hue and each engine in it a shade.
func engineColor(e, perRegion int) color.Color {
	base := []color.RGBA{{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {148, 103, 189, 255}}
	c := base[(e/perRegion)%len(base)]
	shade := 1 - 0.55*float64(e%perRegion)/float64(max(perRegion, 1))
	return color.RGBA{uint8(float64(c.R) * shade), uint8(float64(c.G) * shade), uint8(float64(c.B) * shade), 255}
}

func save(p *plot.Plot, path string, w, h vg.Length) error {
	if err := p.Save(w, h, path); err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	return nil
}

func writePNG(img *vgimg.Canvas, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
