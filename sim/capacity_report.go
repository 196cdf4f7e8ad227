package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// label names a capacity's policy and deployment, as in tables and legends.
func (c Capacity) label() string {
	return fmt.Sprintf("%s (%s x%d)", c.Policy, c.Deployment, c.Replicas)
}

// CapacityTable renders capacities as a markdown table.
func CapacityTable(caps []Capacity) string {
	var b strings.Builder
	b.WriteString("\n| policy | deployment | replicas | capacity rps | x cold | SLO attainment | missed on TTFT | on ITL | KV hit | bound | shed | churn/min | max share step | steady churn/min | steady step | TTFT p50 ms | p90 | runs | shed below capacity |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range caps {
		rps := fmt.Sprintf("%.3f", c.CapacityRPS)
		switch {
		case !c.Bracketed && c.CapacityRPS > 0:
			rps = ">= " + rps
		case !c.Bracketed && len(c.Points) > 0:
			rps = fmt.Sprintf("< %.3f", c.Points[0].OfferedRPS)
		}
		below := "-"
		if c.Below != nil {
			below = fmt.Sprintf("%d of %d at %.3f x cold", c.Below.Shed, c.Below.Requests, c.Below.Load)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %.3f | %.3f | %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.0f | %.0f | %d | %s |\n",
			c.Policy, c.Deployment, c.Replicas, rps, c.CapacityLoad, c.SLOAttainment, c.MissedTTFT, c.MissedITL, c.KVHitRate,
			c.KVHitUpperBound, c.ShedRate, c.WeightChurn, c.MaxShareStep, c.SteadyWeightChurn, c.SteadyMaxShareStep, c.TTFTP50, c.TTFTP90, len(c.Points), below)
	}
	return b.String()
}

// WriteCapacity writes capacity.json, capacity.md, capacity_slo.png and capacity_ttft.png
// into dir.
func WriteCapacity(dir string, caps []Capacity, cc *CapacityConfig, w *Workload, command string, wall time.Duration) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}
	js, err := json.MarshalIndent(caps, "", "  ")
	if err != nil {
		return fmt.Errorf("encode capacities: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "capacity.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("write capacity.json: %w", err)
	}
	var b strings.Builder
	slo := cc.Base.SLO
	fmt.Fprintf(&b, "# meridian-sim: capacity at the SLO\n\nCommand: `%s` (%v of wall time on this machine, %d runs at a time).\n\n",
		command, wall.Round(time.Second), cc.Workers)
	fmt.Fprintf(&b, "%s Trace: %d requests. Deployments searched: %v (region pools with %d replicas).\n\n",
		describeFleet(w, &cc.Base), len(w.Requests), cc.Deployments, cc.Replicas)
	fmt.Fprintf(&b, "Capacity is the highest offered rate at which at least %.0f%% of requests meet the SLO: TTFT at the client <= %v + %v x prompt tokens, and mean inter-token latency <= %v (shed and failed requests miss). ",
		100*cc.Target, slo.TTFTBase, slo.TTFTPerToken, slo.MaxITL)
	fmt.Fprintf(&b, "Search: from %.2f x cold capacity, doubling or halving until a passing and a failing rate bracket it, then trying where the line through their attainments crosses the target (the midpoint when the failing run stopped early) until they are within %.0f%%, at most %d runs; a run stops once its attainment is certain to be below %.2f. ",
		cc.StartLoad, 100*cc.Precision, cc.MaxRuns, cc.StopBelow)
	if cc.Seeds > 1 {
		fmt.Fprintf(&b, "Each rate is judged by %d runs, seeds %d to %d, their requests pooled (the attainment and shed rate are over all of them, the other columns the mean over the runs, the share step the largest). ",
			cc.Seeds, cc.Base.Seed, cc.Base.Seed+uint64(cc.Seeds)-1)
	}
	fmt.Fprintf(&b, "The other columns are measured at the capacity (steady: after the run's first minute, or half the run if shorter; missed: completed requests that missed the TTFT bound, or met it and missed the inter-token bound). \">=\" marks a search that found no failing rate, \"<\" one whose lowest rate missed. Shed below capacity is one more run at %.2g x the capacity found (--capacity-below).\n", cc.BelowCapacity)
	b.WriteString(CapacityTable(caps))
	if ts := CapacityTargets(caps); len(ts) > 0 {
		fmt.Fprintf(&b, "\n## Issue 14's targets\n\n%s", TargetTable(ts))
	}
	b.WriteString("\n![SLO attainment vs offered rate](capacity_slo.png)\n\n![TTFT vs offered rate](capacity_ttft.png)\n")
	if err := os.WriteFile(filepath.Join(dir, "capacity.md"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write capacity.md: %w", err)
	}
	if err := plotAttainment(filepath.Join(dir, "capacity_slo.png"), caps, cc.Target, cc.StopBelow); err != nil {
		return err
	}
	return plotCapacityTTFT(filepath.Join(dir, "capacity_ttft.png"), caps)
}

// byDeployment groups caps by deployment, in order of first appearance.
func byDeployment(caps []Capacity) [][]Capacity {
	var groups [][]Capacity
	index := map[string]int{}
	for _, c := range caps {
		i, ok := index[c.Deployment]
		if !ok {
			i = len(groups)
			index[c.Deployment] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], c)
	}
	return groups
}

// plotPanels draws one panel per deployment, stacked, each made by panel.
func plotPanels(path string, caps []Capacity, panel func(group []Capacity) (*plot.Plot, error)) error {
	groups := byDeployment(caps)
	if len(groups) == 0 {
		return nil
	}
	plots := make([][]*plot.Plot, len(groups))
	maxX := 0.0
	for _, c := range caps {
		for _, pt := range c.Points {
			maxX = max(maxX, pt.OfferedRPS)
		}
	}
	for i, g := range groups {
		p, err := panel(g)
		if err != nil {
			return err
		}
		p.X.Min, p.X.Max = 0, maxX*1.05 // one rate axis for every panel
		plots[i] = []*plot.Plot{p}
	}
	const width, rowHeight = 9 * vg.Inch, 5 * vg.Inch
	img := vgimg.New(width, rowHeight*vg.Length(len(groups)))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(groups), Cols: 1, PadY: vg.Points(8), PadX: vg.Points(6)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	return writePNG(img, path)
}

// policyColor gives each policy one color (and glyph) in every panel.
func policyColor(name string) int {
	if i := slices.Index(PolicyNames, name); i >= 0 {
		return i
	}
	return len(PolicyNames)
}

// plotAttainment draws SLO attainment against offered rate, one line per policy and
// one panel per deployment. Runs stopped early are drawn at their attainment's upper
// bound.
func plotAttainment(path string, caps []Capacity, target, stop float64) error {
	return plotPanels(path, caps, func(group []Capacity) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("SLO attainment vs offered rate, %s deployment (runs stopped below %.2f drawn at their bound)",
			group[0].Deployment, stop)
		p.X.Label.Text = "offered rate (req/s)"
		p.Y.Label.Text = "fraction of requests meeting the SLO"
		p.Y.Min, p.Y.Max = 0, 1
		p.Legend.Top, p.Legend.Left = false, true
		for _, c := range group {
			pts := make(plotter.XYs, 0, len(c.Points))
			for _, pt := range c.Points {
				pts = append(pts, plotter.XY{X: pt.OfferedRPS, Y: pt.SLOAttainment})
			}
			if err := addLine(p, pts, c.label(), policyColor(c.Policy), nil); err != nil {
				return nil, err
			}
		}
		ref, err := plotter.NewLine(plotter.XYs{{X: 0, Y: target}, {X: 1e9, Y: target}})
		if err != nil {
			return nil, fmt.Errorf("target line: %w", err)
		}
		ref.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(ref)
		return p, nil
	})
}

// plotCapacityTTFT draws TTFT p50 (solid) and p90 (dashed) against offered rate, one
// panel per deployment.
func plotCapacityTTFT(path string, caps []Capacity) error {
	return plotPanels(path, caps, func(group []Capacity) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("TTFT p50 (solid) and p90 (dashed) vs offered rate, %s deployment", group[0].Deployment)
		p.X.Label.Text = "offered rate (req/s)"
		p.Y.Label.Text = "TTFT (s, log scale)"
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Legend.Top, p.Legend.Left = true, true
		for _, c := range group {
			var p50, p90 plotter.XYs
			for _, pt := range c.Points {
				if pt.TTFTP50 <= 0 {
					continue
				}
				p50 = append(p50, plotter.XY{X: pt.OfferedRPS, Y: pt.TTFTP50 / 1000})
				p90 = append(p90, plotter.XY{X: pt.OfferedRPS, Y: max(pt.TTFTP90, pt.TTFTP50) / 1000})
			}
			i := policyColor(c.Policy)
			if err := addLine(p, p50, c.label(), i, nil); err != nil {
				return nil, err
			}
			if err := addLine(p, p90, "", i, []vg.Length{vg.Points(4), vg.Points(3)}); err != nil {
				return nil, err
			}
		}
		return p, nil
	})
}

// addLine adds a line with points in color i, to the legend when name is set.
func addLine(p *plot.Plot, pts plotter.XYs, name string, i int, dashes []vg.Length) error {
	if len(pts) == 0 {
		return nil
	}
	line, points, err := plotter.NewLinePoints(pts)
	if err != nil {
		return fmt.Errorf("line %s: %w", name, err)
	}
	line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
	line.Width = vg.Points(1.5)
	line.Dashes = dashes
	points.Shape = plotutil.Shape(i / len(plotutil.DefaultColors))
	points.Radius = vg.Points(2)
	p.Add(line, points)
	if name != "" {
		p.Legend.Add(name, line)
	}
	return nil
}
