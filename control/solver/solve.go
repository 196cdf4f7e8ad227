package solver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"
)

// options are internal strategy switches. Solve uses defaultOptions; the
// benchmarks compare the alternatives (docs/performance-solver.md).
type options struct {
	// method solves the first LP, or bigMethod when it has bigRows rows or
	// more; laterMethod solves the rounds after it when rebase is on (they
	// start from a feasible reference, where the primal simplex is quicker).
	method, bigMethod, laterMethod method
	bigRows                        int
	// colgen starts from a greedy seed and adds the left-out columns whose
	// reduced cost is negative until none is; false puts every allowed route
	// and piece in one LP.
	colgen    bool
	initialK  int     // cheapest idle routes per (cluster, model) in the seed
	seedSlack float64 // seconds: seed routes this close to their row's best
	slices    int     // the greedy seed cuts each row's demand into this many turns
	addPerRow int     // most routes added per (cluster, model) per round
	rebase    bool    // each round starts from the last one's solution and drops idle routes
	maxDrops  uint8   // a route dropped this often stays for good (no cycling)
	lazyLoad  bool    // engine load pieces join only when priced in
	maxRounds int     // then one LP with every allowed route settles it
	// stallRounds rounds in a row that each lower the cost by less than
	// stallTol seconds per request/s of the component's demand end the
	// search (with rebase only, where each round's LP measures its own gain).
	stallRounds int
	stallTol    float64
}

func defaultOptions() options {
	return options{
		method: dualSimplex, bigMethod: barrierCrossover, bigRows: 512, laterMethod: primalSimplex,
		colgen: true, initialK: 2, seedSlack: 0.01, slices: 8, addPerRow: 16,
		rebase: true, maxDrops: 1, lazyLoad: true, maxRounds: 40,
		stallRounds: 2, stallTol: 1e-7,
	}
}

// Solve finds the routing that minimizes RTT + engine latency under load +
// shedding + movement away from p.Prev, as an LP on CLP. It returns an error
// wrapping ErrInvalidProblem for bad input, or the context's error when ctx
// ends first (its deadline is also passed to CLP as a time limit). Solve is
// deterministic: equal problems give identical solutions. It is safe to call
// concurrently on different problems; p is only read.
func Solve(ctx context.Context, p *Problem) (*Solution, error) {
	return solve(ctx, p, defaultOptions())
}

func solve(ctx context.Context, p *Problem, o options) (*Solution, error) {
	start := time.Now()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	ix := newIndex(p)
	sol := newSolution(p)
	if err := solveComponents(ctx, p, ix, o, sol); err != nil {
		return nil, err
	}
	sol.spreadTies(p, ix)
	sol.finish(p, ix)
	sol.Duration = time.Since(start)
	return sol, nil
}

// solveComponents solves the independent components (groups of models linked by shared
// engines) side by side, at most GOMAXPROCS at a time. Each writes only its own models'
// rows of sol.Flow and sol.Shed and keeps its own Stats, which are merged afterwards, so
// the result does not depend on the order in which they finish.
func solveComponents(ctx context.Context, p *Problem, ix *index, o options, sol *Solution) error {
	comps := ix.components()
	solvers := make([]*compSolver, len(comps))
	errs := make([]error, len(comps))
	sem := make(chan struct{}, max(1, min(runtime.GOMAXPROCS(0), len(comps))))
	var wg sync.WaitGroup
	for i, comp := range comps {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := ctx.Err(); err != nil {
				errs[i] = fmt.Errorf("solver: %w", err)
				return
			}
			solvers[i] = newCompSolver(p, ix, comp, o)
			if err := solvers[i].run(ctx, sol); err != nil {
				errs[i] = fmt.Errorf("solver: models %v: %w", comp.modelNames(p), err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, cs := range solvers {
		st := cs.stats
		sol.Stats.Components += st.Components
		sol.Stats.Rounds += st.Rounds
		sol.Stats.Stalled += st.Stalled
		sol.Stats.Rows = max(sol.Stats.Rows, st.Rows)
		sol.Stats.Columns = max(sol.Stats.Columns, st.Columns)
		sol.Stats.Pairs += st.Pairs
		sol.Stats.Candidates += st.Candidates
		sol.Stats.ShedCost = math.Max(sol.Stats.ShedCost, st.ShedCost)
	}
	return nil
}

// index holds what every component needs: engine segments, which engines
// serve which model, and the previous flows mapped onto this problem.
type index struct {
	segs         [][]segment // [e], nil when the engine is unusable
	modelEngines [][]int     // [m] usable engines serving m, ascending
	prev         [][][]flow  // [c][m] previous flows, by engine ascending
	hasPrev      bool
}

type flow struct {
	e int
	x float64
}

func newIndex(p *Problem) *index {
	ix := &index{
		segs:         make([][]segment, len(p.Engines)),
		modelEngines: make([][]int, len(p.Models)),
		hasPrev:      p.Prev != nil,
	}
	for e := range p.Engines {
		if !p.usable(e) {
			continue
		}
		eng := &p.Engines[e]
		ix.segs[e] = eng.Curve.segments(eng.Capacity, p.Params.RhoMax, p.Params.Segments, nil)
		for _, m := range eng.Models {
			ix.modelEngines[m] = append(ix.modelEngines[m], e)
		}
	}
	ix.prev = mapPrev(p)
	return ix
}

// mapPrev matches p.Prev's flows to p's clusters, models and engines by name
// and rescales each (cluster, model)'s flows to this period's demand. The
// movement price then applies to changes in shares, which is what moves keys
// between engines; a demand that merely grows or shrinks moves nothing.
func mapPrev(p *Problem) [][][]flow {
	out := make([][][]flow, len(p.Clusters))
	for c := range out {
		out[c] = make([][]flow, len(p.Models))
	}
	if p.Prev == nil {
		return out
	}
	engIdx := nameIndex(p.Engines, func(e Engine) string { return e.Name })
	modelIdx := nameIndex(p.Models, func(s string) string { return s })
	clusterIdx := nameIndex(p.Clusters, func(s string) string { return s })
	for pc, cname := range p.Prev.Clusters {
		c, ok := clusterIdx[cname]
		if !ok {
			continue
		}
		for pm, mname := range p.Prev.Models {
			m, ok := modelIdx[mname]
			if !ok {
				continue
			}
			sum := 0.0
			for pe, x := range p.Prev.Flow[pc][pm] {
				if e, ok := engIdx[p.Prev.Engines[pe]]; ok && x > 0 {
					out[c][m] = append(out[c][m], flow{e, x})
					sum += x
				}
			}
			for i := range out[c][m] {
				out[c][m][i].x *= p.Demand[c][m] / sum
			}
			slices.SortFunc(out[c][m], func(a, b flow) int { return cmp.Compare(a.e, b.e) })
		}
	}
	return out
}

func nameIndex[T any](items []T, name func(T) string) map[string]int {
	m := make(map[string]int, len(items))
	for i, it := range items {
		m[name(it)] = i
	}
	return m
}

// component is a set of models linked by engines that serve more than one of
// them, with those engines. Components share no engine, so each is an
// independent LP: this is the exact per-model decomposition.
type component struct {
	models  []int
	engines []int
}

func (c component) modelNames(p *Problem) []string {
	out := make([]string, len(c.models))
	for i, m := range c.models {
		out[i] = p.Models[m]
	}
	return out
}

func (ix *index) components() []component {
	n := len(ix.modelEngines)
	parent := make([]int, n)
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	engModels := map[int][]int{}
	for m, engs := range ix.modelEngines {
		for _, e := range engs {
			engModels[e] = append(engModels[e], m)
		}
	}
	for _, ms := range engModels {
		for _, m := range ms[1:] {
			a, b := find(ms[0]), find(m)
			parent[max(a, b)] = min(a, b) // the smaller index roots: deterministic
		}
	}
	byRoot := map[int]int{}
	var comps []component
	for m := range n {
		r := find(m)
		i, ok := byRoot[r]
		if !ok {
			i = len(comps)
			byRoot[r] = i
			comps = append(comps, component{})
		}
		comps[i].models = append(comps[i].models, m)
	}
	seen := map[int]bool{}
	for i := range comps {
		for _, m := range comps[i].models {
			for _, e := range ix.modelEngines[m] {
				if !seen[e] {
					seen[e] = true
					comps[i].engines = append(comps[i].engines, e)
				}
			}
		}
		slices.Sort(comps[i].engines)
	}
	return comps
}

func newSolution(p *Problem) *Solution {
	s := &Solution{
		Clusters: slices.Clone(p.Clusters),
		Models:   slices.Clone(p.Models),
		Engines:  make([]string, len(p.Engines)),
		Demand:   make([][]float64, len(p.Clusters)),
		Flow:     make([][][]float64, len(p.Clusters)),
		Shed:     make([][]float64, len(p.Clusters)),
		Load:     make([]float64, len(p.Engines)),
		Marginal: make([]float64, len(p.Engines)),
		Fallback: make([][]int, len(p.Clusters)),
	}
	for e := range p.Engines {
		s.Engines[e] = p.Engines[e].Name
	}
	for c := range p.Clusters {
		s.Demand[c] = slices.Clone(p.Demand[c])
		s.Shed[c] = make([]float64, len(p.Models))
		s.Fallback[c] = make([]int, len(p.Models))
		s.Flow[c] = make([][]float64, len(p.Models))
		for m := range p.Models {
			s.Flow[c][m] = make([]float64, len(p.Engines))
		}
	}
	return s
}

// finish derives the per-engine and summary fields from Flow and Shed.
func (s *Solution) finish(p *Problem, ix *index) {
	for c := range s.Flow {
		for m := range s.Flow[c] {
			for e, x := range s.Flow[c][m] {
				s.Load[e] += x
			}
		}
	}
	shedCost := math.Max(s.Stats.ShedCost, p.Params.ShedCost)
	s.Stats.ShedCost = shedCost
	for e := range p.Engines {
		s.Marginal[e] = shedCost // no room: one more req/s here is as bad as shedding it
		if segs := ix.segs[e]; segs != nil {
			if mg := marginalSlope(segs, s.Load[e]); !math.IsInf(mg, 1) {
				s.Marginal[e] = mg
			}
		}
	}
	s.setFallbacks(p, ix)
	s.setObjective(p, ix, shedCost)
}

func (s *Solution) setFallbacks(p *Problem, ix *index) {
	for c := range s.Fallback {
		for m := range s.Fallback[c] {
			best, bestCost := -1, math.Inf(1)
			for _, e := range ix.modelEngines[m] {
				if cost := p.RTT[c][e] + s.Marginal[e]; cost < bestCost {
					best, bestCost = e, cost
				}
			}
			s.Fallback[c][m] = best
		}
	}
}

func (s *Solution) setObjective(p *Problem, ix *index, shedCost float64) {
	obj, latency, routed := 0.0, 0.0, 0.0
	for c := range s.Flow {
		for m := range s.Flow[c] {
			obj += shedCost * s.Shed[c][m]
			for e, x := range s.Flow[c][m] {
				if x == 0 {
					continue
				}
				obj += x * p.RTT[c][e]
				eng := &p.Engines[e]
				latency += x * (p.RTT[c][e] + eng.Curve.Latency(s.Load[e], eng.Capacity))
				routed += x
			}
			if ix.hasPrev {
				obj += movementCost(p, s.Flow[c][m], ix.prev[c][m], p.RTT[c], nearestRTT(p, ix, c, m))
			}
		}
	}
	for e, segs := range ix.segs {
		obj += pwlCost(segs, s.Load[e])
	}
	s.Objective = obj
	if routed > 0 {
		s.MeanLatency = latency / routed
	}
}

// movementCost is the movement term for one (cluster, model): each engine's flow above
// its previous one priced at its up price (MoveCost, plus FarMoveCost if far), below it
// at MoveCost. rtt is the cluster's row of RTTs and near its least to the model's engines.
func movementCost(p *Problem, x []float64, prev []flow, rtt []float64, near float64) float64 {
	was := make(map[int]float64, len(prev))
	for _, pf := range prev {
		was[pf.e] = pf.x
	}
	mu, far := p.Params.MoveCost, p.Params.FarMoveCost
	total := 0.0
	for e, f := range x {
		if d := f - was[e]; d > 0 {
			total += d * upPrice(mu, far, rtt[e], near)
		}
	}
	for _, pf := range prev {
		if d := pf.x - x[pf.e]; d > 0 {
			total += d * mu
		}
	}
	return total
}
