package solver

import (
	"context"
	"fmt"
	"testing"
)

// benchSizes are the sizes named in issue 3: one model, 8 segments.
var benchSizes = [][2]int{{4, 16}, {16, 256}, {64, 1024}}

// benchProblems returns the plain problem and the next period's: demand
// moved by up to ±20 % per cluster, with the first plan as Prev.
func benchProblems(b *testing.B, clusters, engines, segments int) (none, moved *Problem) {
	none = benchFleet(clusters, engines).problem()
	none.Params.Segments = segments
	prev, err := Solve(context.Background(), perturbed(none, 0.2, 1))
	if err != nil {
		b.Fatal(err)
	}
	moved = perturbed(none, 0.2, 2)
	moved.Prev = prev
	return none, moved
}

// BenchmarkSolve measures Solve as the control server calls it. Besides
// ns/op it reports cpu-ms/op (process CPU time, steadier than wall time on a
// shared machine) and the LP's shape.
//
//	go test -run '^$' -bench BenchmarkSolve -count 5 ./control/solver/
func BenchmarkSolve(b *testing.B) {
	for _, sz := range benchSizes {
		none, moved := benchProblems(b, sz[0], sz[1], 8)
		for _, pc := range []struct {
			name string
			p    *Problem
		}{{"none", none}, {"moved", moved}} {
			b.Run(fmt.Sprintf("clusters=%d/engines=%d/prev=%s", sz[0], sz[1], pc.name), func(b *testing.B) {
				benchSolve(b, pc.p, defaultOptions())
			})
		}
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
	b.ReportMetric(float64((cpuTime()-c0).Milliseconds())/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(sol.Stats.Rounds), "rounds")
	b.ReportMetric(float64(sol.Stats.Rows), "rows")
	b.ReportMetric(float64(sol.Stats.Columns), "cols")
}
