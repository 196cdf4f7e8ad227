package sim

import (
	"context"
	"strings"
	"testing"
)

func TestScanRunsEveryPolicyLoadAndSeed(t *testing.T) {
	base := prefillBoundConfig(t)
	base.Policies = []string{"round-robin", "least-request"}
	sc := ScanConfig{Base: base, Loads: []float64{0.5, 1.5}, Seeds: []uint64{1, 2}, Workers: 2}
	var calls int
	points, err := RunScan(context.Background(), sc, func(p ScanProgress) {
		calls++
		if p.Done != calls || p.Total != 8 {
			t.Errorf("progress %d/%d at call %d", p.Done, p.Total, calls)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(points) != 8 || calls != 8 {
		t.Fatalf("%d points, %d progress calls, want 8 each", len(points), calls)
	}
	i := 0
	for _, pol := range base.Policies {
		for _, l := range sc.Loads {
			for _, s := range sc.Seeds {
				if p := points[i]; p.Policy != pol || p.Load != l || p.Seed != s || p.Requests != len(base.Trace) {
					t.Errorf("point %d is %+v, want %s at %v, seed %d, %d requests", i, p, pol, l, s, len(base.Trace))
				}
				i++
			}
		}
	}
	// The engine prefills about one request a second, and the trace is rescaled to the load:
	// at half of it every request meets the 3 s TTFT bound, at 1.5 times it the queue grows.
	for _, p := range points {
		if p.Load == 0.5 && p.SLOAttainment < 0.99 || p.Load == 1.5 && p.SLOAttainment > 0.8 {
			t.Errorf("%s at load %v: attainment %.3f", p.Policy, p.Load, p.SLOAttainment)
		}
	}
	table := ScanTable(points)
	if !strings.Contains(table, "| round-robin |") || !strings.Contains(table, "(4 runs)") || !strings.Contains(table, "load 1.5") {
		t.Errorf("table:\n%s", table)
	}
}

func TestScanConfigRejectsAnEmptyScan(t *testing.T) {
	base := prefillBoundConfig(t)
	for _, sc := range []ScanConfig{
		{Base: base, Seeds: []uint64{1}, Workers: 1},
		{Base: base, Loads: []float64{0.5}, Workers: 1},
		{Base: base, Loads: []float64{-1}, Seeds: []uint64{1}, Workers: 1},
		{Base: base, Loads: []float64{0.5}, Seeds: []uint64{1}},
	} {
		if err := sc.Validate(); err == nil {
			t.Errorf("%v loads, %v seeds, %d workers: no error", sc.Loads, sc.Seeds, sc.Workers)
		}
	}
}
