package solver

import (
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

// BenchmarkStrategies compares the internal options that Solve chose
// between (docs/performance-solver.md):
//
//	go test -run '^$' -bench BenchmarkStrategies -count 5 ./control/solver/
func BenchmarkStrategies(b *testing.B) {
	for _, sz := range benchSizes {
		none, moved := benchProblems(b, sz[0], sz[1], 8)
		for _, pc := range []struct {
			name string
			p    *Problem
		}{{"none", none}, {"moved", moved}} {
			for _, st := range strategies {
				b.Run(fmt.Sprintf("clusters=%d/engines=%d/prev=%s/%s", sz[0], sz[1], pc.name, st.name), func(b *testing.B) {
					benchSolve(b, pc.p, st.o)
				})
			}
		}
	}
}
