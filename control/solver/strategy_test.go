package solver

import (
	"context"
	"fmt"
	"testing"
)

var strategies = []struct {
	name string
	o    options
}{
	{"default", defaultOptions()},
	{"first-dual", func() options { o := defaultOptions(); o.bigMethod = dualSimplex; return o }()},
	{"later-dual", func() options { o := defaultOptions(); o.laterMethod = dualSimplex; return o }()},
	{"add8", func() options { o := defaultOptions(); o.addPerRow = 8; return o }()},
	{"sparse-seed", func() options { o := defaultOptions(); o.initialK, o.seedSlack = 0, -1; return o }()},
	{"eager-load", func() options { o := defaultOptions(); o.lazyLoad = false; return o }()},
	{"no-rebase", func() options { o := defaultOptions(); o.rebase = false; return o }()},
	{"full-dual", options{method: dualSimplex, bigMethod: dualSimplex}},
	{"full-barrier", options{method: barrierCrossover, bigMethod: barrierCrossover}},
}

func BenchmarkStrategies(b *testing.B) {
	for _, sz := range [][2]int{{4, 16}, {16, 256}, {64, 1024}} {
		base := benchFleet(sz[0], sz[1]).problem()
		prev, err := Solve(context.Background(), perturbed(base, 0.2, 1))
		if err != nil {
			b.Fatal(err)
		}
		withPrev := *base
		withPrev.Prev = prev
		for _, pc := range []struct {
			name string
			p    *Problem
		}{{"none", base}, {"moved", &withPrev}} {
			for _, st := range strategies {
				b.Run(fmt.Sprintf("clusters=%d/engines=%d/prev=%s/%s", sz[0], sz[1], pc.name, st.name), func(b *testing.B) {
					var sol *Solution
					for b.Loop() {
						var err error
						if sol, err = solve(context.Background(), pc.p, st.o); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(sol.Stats.Rounds), "rounds")
					b.ReportMetric(float64(sol.Stats.Columns), "cols")
					b.ReportMetric(sol.Objective, "objective")
				})
			}
		}
	}
}
