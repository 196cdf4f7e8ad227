package solver

import "testing"

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
