package signals

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"

	"github.com/meridian-router/meridian/control/solver"
)

// TestFitRecoversKnownCurve feeds an engine that follows a known curve,
// with ±15 % multiplicative noise on TTFT, through the scrape path (the
// TTFT histogram grows by rate·interval requests of that mean TTFT) and
// checks the fitted curve.
func TestFitRecoversKnownCurve(t *testing.T) {
	truth := solver.Curve{Base: 0.12, Queue: 0.08}
	const capacity = 50.0
	a, clk := newTestAggregator(t)
	spec := EngineSpec{Name: "e1", Capacity: capacity, Curve: solver.Curve{Base: 1, Queue: 1}}
	rng := rand.New(rand.NewPCG(3, 4))
	var h enginemetrics.Histogram
	interval := 5 * time.Second
	a.ObserveScrape("e1", enginemetrics.Sample{TTFT: h})
	for range 300 {
		rate := 2 + 43*rng.Float64()
		ttft := truth.Latency(rate, capacity) * (1 + 0.15*(2*rng.Float64()-1))
		n := math.Round(rate * interval.Seconds())
		h.Count += n
		h.Sum += n * ttft
		clk.advance(interval)
		a.ObserveScrape("e1", enginemetrics.Sample{TTFT: h})
	}
	es := a.Snapshot([]EngineSpec{spec}).Engines["e1"]
	if !es.Fitted {
		t.Fatalf("not fitted after 300 points (weight %v)", es.FitWeight)
	}
	if rel(es.Curve.Base, truth.Base) > 0.05 || rel(es.Curve.Queue, truth.Queue) > 0.1 {
		t.Fatalf("fitted %+v, want %+v (base ±5 %%, queue ±10 %%)", es.Curve, truth)
	}
}

func rel(got, want float64) float64 { return math.Abs(got-want) / want }

func TestFitDefaults(t *testing.T) {
	cfg := DefaultConfig().Fit
	def := solver.Curve{Base: 0.3, Queue: 0.4}
	now := time.Unix(1000, 0)
	tests := []struct {
		name       string
		points     []point
		wantFitted bool
		check      func(c solver.Curve) bool
	}{
		{"no data", nil, false, func(c solver.Curve) bool { return c == def }},
		{"too little data", repeat(point{load: 10, ttft: 0.1, at: now}, 5), false, func(c solver.Curve) bool { return c == def }},
		{"old data weighs little", repeat(point{load: 10, ttft: 0.1, at: now.Add(-10 * cfg.HalfLife)}, 100), false,
			func(c solver.Curve) bool { return c == def }},
		{"constant load: base only, default queueing kept", repeat(point{load: 25, ttft: 0.5, at: now}, 50), true,
			func(c solver.Curve) bool { return c.Queue == def.Queue && math.Abs(c.Base-(0.5-def.Queue*1)) < 1e-12 }},
		// x = ρ/(1−ρ) is 1/9 at load 5 and 4 at load 40 (mean 2.056); the mean TTFT is 0.2.
		{"latency falling with load: an M/D/1 queue's share kept, through the mean", append(repeat(point{load: 5, ttft: 0.3, at: now}, 20), repeat(point{load: 40, ttft: 0.1, at: now}, 20)...), true,
			func(c solver.Curve) bool {
				return c.Queue == minQueueShare*c.Base && math.Abs(c.Base+c.Queue*(1.0/9+4)/2-0.2) < 1e-12
			}},
		{"latency flat in load: the same", append(repeat(point{load: 5, ttft: 0.2, at: now}, 20), repeat(point{load: 40, ttft: 0.2, at: now}, 20)...), true,
			func(c solver.Curve) bool { return c.Queue == minQueueShare*c.Base && c.Queue > 0 }},
		{"saturated points ignored", append(repeat(point{load: 49.5, ttft: 100, at: now}, 30), repeat(point{load: 10, ttft: 0.1, at: now}, 5)...), false,
			func(c solver.Curve) bool { return c == def }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f fitter
			for _, p := range tt.points {
				f.add(p, cfg.Window)
			}
			c, _, fitted := f.fit(50, now, cfg, def)
			if fitted != tt.wantFitted || !tt.check(c) {
				t.Fatalf("fit = %+v fitted %v", c, fitted)
			}
		})
	}
}

func repeat(p point, n int) []point {
	out := make([]point, n)
	for i := range out {
		out[i] = p
	}
	return out
}

func TestFitterWindow(t *testing.T) {
	var f fitter
	for i := range 10 {
		f.add(point{load: float64(i)}, 4)
	}
	got := map[float64]bool{}
	for _, p := range f.pts {
		got[p.load] = true
	}
	if len(f.pts) != 4 || !got[6] || !got[9] || got[5] {
		t.Fatalf("window kept %v, want the last 4", f.pts)
	}
}
