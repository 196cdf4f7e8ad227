package solver

import (
	"context"
	"fmt"
	"testing"
)

// benchSizes are the sizes named in issue 3 (one model) and issue 14 (128 clusters, 4096
// engines, 4 models), with 8 segments.
var benchSizes = []struct{ clusters, engines, models int }{{4, 16, 1}, {16, 256, 1}, {64, 1024, 1}, {128, 4096, 4}}

// benchCase is one sub-benchmark: a problem and its name.
type benchCase struct {
	name string
	p    *Problem
}

// benchCases returns, for each size, the plain problem ("prev=none") and
// the next period's ("prev=moved": demand moved by up to ±20 % per cluster,
// with the first plan as Prev).
func benchCases(b *testing.B) []benchCase {
	var out []benchCase
	for _, sz := range benchSizes {
		fl := benchFleet(sz.clusters, sz.engines)
		fl.models = sz.models
		none := fl.problem()
		none.Params.Segments = 8
		prev, err := Solve(context.Background(), perturbed(none, 0.2, 1))
		if err != nil {
			b.Fatal(err)
		}
		moved := perturbed(none, 0.2, 2)
		moved.Prev = prev
		name := fmt.Sprintf("clusters=%d/engines=%d/prev=", sz.clusters, sz.engines)
		if sz.models > 1 {
			name = fmt.Sprintf("clusters=%d/engines=%d/models=%d/prev=", sz.clusters, sz.engines, sz.models)
		}
		out = append(out, benchCase{name + "none", none}, benchCase{name + "moved", moved})
	}
	return out
}

// BenchmarkSolve measures Solve as the control server calls it. Besides
// ns/op it reports cpu-ms/op (process CPU time, steadier than wall time on a
// shared machine) and the LP's shape.
//
//	go test -run '^$' -bench BenchmarkSolve -benchmem -count 5 ./control/solver/
func BenchmarkSolve(b *testing.B) {
	for _, bc := range benchCases(b) {
		b.Run(bc.name, func(b *testing.B) { benchSolve(b, bc.p, defaultOptions()) })
	}
}

func benchSolve(b *testing.B, p *Problem, o options) {
	var sol *Solution
	c0 := cpuTime()
	for b.Loop() {
		var err error
		if sol, err = solve(context.Background(), p, o); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((cpuTime()-c0).Seconds()*1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(sol.Stats.Rounds), "rounds")
	b.ReportMetric(float64(sol.Stats.Rows), "rows")
	b.ReportMetric(float64(sol.Stats.Columns), "cols")
}
