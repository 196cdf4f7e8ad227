package solver

import (
	"context"
	"testing"
)

var strategies = []struct {
	name string
	o    options
}{
	{"default", defaultOptions()},
	{"first-dual", func() options { o := defaultOptions(); o.bigMethod = dualSimplex; return o }()},
	{"later-dual", func() options { o := defaultOptions(); o.laterMethod = dualSimplex; return o }()},
	{"no-stall", func() options { o := defaultOptions(); o.stallRounds = 0; return o }()},
	{"add8", func() options { o := defaultOptions(); o.addPerRow = 8; return o }()},
	{"sparse-seed", func() options { o := defaultOptions(); o.initialK, o.seedSlack = 0, -1; return o }()},
	{"eager-load", func() options { o := defaultOptions(); o.lazyLoad = false; return o }()},
	{"no-rebase", func() options { o := defaultOptions(); o.rebase = false; return o }()},
	{"full-dual", options{method: dualSimplex, bigMethod: dualSimplex}},
	{"full-barrier", options{method: barrierCrossover, bigMethod: barrierCrossover}},
}

// BenchmarkStrategies compares the internal options that Solve chose
// between (docs/performance-solver.md):
//
//	go test -run '^$' -bench BenchmarkStrategies -count 5 ./control/solver/
func BenchmarkStrategies(b *testing.B) {
	for _, bc := range benchCases(b) {
		for _, st := range strategies {
			b.Run(bc.name+"/"+st.name, func(b *testing.B) { benchSolve(b, bc.p, st.o) })
		}
	}
}

// BenchmarkStallRule compares the stall rule on and off at 128 × 4096 × 4 on
// the next period's problem as BenchmarkSolve posed it before the rule
// existed: Prev solved with the search run to the end (docs/performance-solver.md).
//
//	go test -run '^$' -bench BenchmarkStallRule -count 5 ./control/solver/
func BenchmarkStallRule(b *testing.B) {
	moved, noStall := noStallProblem(b, 128, 4096, 4)
	b.Run("stall", func(b *testing.B) { benchSolve(b, moved, defaultOptions()) })
	b.Run("no-stall", func(b *testing.B) { benchSolve(b, moved, noStall) })
}

// noStallProblem is benchFleet's next-period problem with Prev solved by the
// search run to the end (the stall rule off), and the options that turn it off.
func noStallProblem(tb testing.TB, clusters, engines, models int) (*Problem, options) {
	fl := benchFleet(clusters, engines)
	fl.models = models
	p := fl.problem()
	p.Params.Segments = 8
	noStall := defaultOptions()
	noStall.stallRounds = 0
	prev, err := solve(context.Background(), perturbed(p, 0.2, 1), noStall)
	if err != nil {
		tb.Fatal(err)
	}
	moved := perturbed(p, 0.2, 2)
	moved.Prev = prev
	return moved, noStall
}
