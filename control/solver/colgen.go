package solver

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// compSolver solves one component by column generation. Every quantity is
// written as a reference value plus convex piecewise-linear moves around it:
//
//	x[c,m,e] = x0 + Σ up − Σ down   (route flow; cost RTT·x + μ|x − prev|)
//	load[e]  = L0 + Σ up − Σ down   (engine load; cost Σ_k slope_k·segment_k)
//	shed[c,m] = s0 + up − down      (cost M·shed)
//
//	rows  demand (c,m):  Σ_e Δx + Δs = D − Σ_e x0 − s0
//	      load e:        Σ Δx − ΔL  = L0 − Σ x0
//
// Each piece is a bounded column whose cost is ± the slope of the piece of
// the convex function it walks; convexity makes the LP walk pieces in order,
// so no extra rows are needed (the movement term of design.md §10 is the
// special case x0 = prev). The reference is a greedy feasible assignment that
// starts from Prev, so all rows start balanced and the simplex begins at a
// point already close to the optimum: lanl/clp cannot load a starting basis,
// and this is the warm start its API allows.
//
// Only active routes have columns, and only engines with an active route
// have a row. After each LP every left-out route (x0 = prev = 0, so a single
// up column) is priced with the row duals u and v: RTT + μ − u[c,m] − v[e],
// with v[e] = −slope₁ for an engine without a row. Routes with negative
// reduced cost join; when none is left the LP optimum is the full problem's.
type compSolver struct {
	p        *Problem
	ix       *index
	o        options
	engines  []int       // problem engine index by local index
	local    map[int]int // problem engine index → local index
	rows     []demandRow
	routeAt  []int32 // [row·len(engines) + local engine] → index in routes, −1 when inactive
	routes   []route
	engRow   []int     // LP row of each local engine, −1 without active routes
	load0    []float64 // reference load per local engine
	shed0    []float64 // reference shed per row
	mu       float64
	shedCost float64
	b        lp
	cols     []colRef // what each LP column moves, for extract
	pieces   []piece  // scratch
	fsegs    []segment
}

type demandRow struct {
	c, m   int
	demand float64
	cands  []cand // allowed routes, cheapest first when idle
}

type cand struct {
	le  int
	rtt float64
}

type route struct {
	r, le         int
	rtt, prev, x0 float64
}

// colRef says which quantity an LP column moves and in which direction.
type colRef struct {
	kind colKind
	dir  int8
	idx  int32 // route index, or row index for shed
}

type colKind uint8

const (
	routeCol colKind = iota
	loadCol
	shedCol
)

func newCompSolver(p *Problem, ix *index, comp component, o options) *compSolver {
	cs := &compSolver{p: p, ix: ix, o: o, engines: comp.engines, local: make(map[int]int, len(comp.engines))}
	for le, e := range comp.engines {
		cs.local[e] = le
	}
	if ix.hasPrev {
		cs.mu = p.Params.MoveCost
	}
	maxRTT := 0.0
	for _, m := range comp.models {
		for c := range p.Clusters {
			if p.Demand[c][m] <= 0 {
				continue
			}
			row := demandRow{c: c, m: m, demand: p.Demand[c][m]}
			for _, e := range ix.modelEngines[m] {
				if rtt := p.RTT[c][e]; !math.IsInf(rtt, 1) {
					row.cands = append(row.cands, cand{cs.local[e], rtt})
					maxRTT = math.Max(maxRTT, rtt)
				}
			}
			slices.SortStableFunc(row.cands, func(a, b cand) int {
				return cmp.Compare(a.rtt+cs.firstSlope(a.le), b.rtt+cs.firstSlope(b.le))
			})
			cs.rows = append(cs.rows, row)
		}
	}
	cs.shedCost = cs.shedBound(maxRTT)
	cs.routeAt = make([]int32, len(cs.rows)*len(cs.engines))
	for i := range cs.routeAt {
		cs.routeAt[i] = -1
	}
	cs.engRow = make([]int, len(cs.engines))
	cs.load0 = make([]float64, len(cs.engines))
	cs.shed0 = make([]float64, len(cs.rows))
	return cs
}

func (cs *compSolver) firstSlope(le int) float64 { return cs.ix.segs[cs.engines[le]][0].slope }

// shedBound returns a shed price above the cost change of any augmenting
// path that reaches spare capacity: each of at most len(engines) hops moves
// flow by at most maxRTT + 2μ, and the last engine's slope is at most its
// top segment's. Shedding is then never cheaper than routing, which is what
// "nothing is shed while capacity covers demand" requires.
func (cs *compSolver) shedBound(maxRTT float64) float64 {
	topSlope := 0.0
	for _, e := range cs.engines {
		segs := cs.ix.segs[e]
		topSlope = math.Max(topSlope, segs[len(segs)-1].slope)
	}
	bound := 2 * (topSlope + float64(len(cs.engines))*(maxRTT+2*cs.mu) + 1)
	return math.Max(cs.p.Params.ShedCost, bound)
}

func (cs *compSolver) run(ctx context.Context, sol *Solution) error {
	if len(cs.rows) == 0 {
		return nil
	}
	sol.Stats.Components++
	cs.activatePrev()
	if cs.o.colgen {
		cs.seed()
	} else {
		cs.activateAll()
		cs.referenceFromPrev()
	}
	var res lpResult
	for round := 0; ; round++ {
		if cs.o.colgen && round == cs.o.maxRounds {
			cs.activateAll()
		}
		var err error
		if res, err = cs.solveRound(ctx, sol); err != nil {
			return err
		}
		if cs.price(res.dual) == 0 {
			break
		}
	}
	cs.extract(res, sol)
	return nil
}

func (cs *compSolver) serves(e, m int) bool { return slices.Contains(cs.p.Engines[e].Models, m) }

// activatePrev gives every route that carried flow in Prev a column: its
// movement cost depends on prev, so it can never be priced as left out.
func (cs *compSolver) activatePrev() {
	for r, row := range cs.rows {
		for _, f := range cs.ix.prev[row.c][row.m] {
			le, ok := cs.local[f.e]
			if ok && !math.IsInf(cs.p.RTT[row.c][f.e], 1) && cs.serves(f.e, row.m) {
				cs.routes[cs.activate(r, le)].prev = f.x
			}
		}
	}
}

// referenceFromPrev sets the reference to Prev's flows, capped by capacity
// and demand; what does not fit stays as row residuals.
func (cs *compSolver) referenceFromPrev() {
	routed := make([]float64, len(cs.rows))
	for i := range cs.routes {
		rt := &cs.routes[i]
		rt.x0 = rt.prev
		cs.load0[rt.le] += rt.prev
		routed[rt.r] += rt.prev
	}
	for le, e := range cs.engines {
		segs := cs.ix.segs[e]
		cs.load0[le] = math.Min(cs.load0[le], capOf(segs))
	}
	for r, row := range cs.rows {
		cs.shed0[r] = math.Max(0, row.demand-routed[r])
	}
}

func capOf(segs []segment) float64 {
	total := 0.0
	for _, s := range segs {
		total += s.width
	}
	return total
}

// activate gives route (r, le) columns from the next round on and returns
// its index.
func (cs *compSolver) activate(r, le int) int {
	k := r*len(cs.engines) + le
	if i := cs.routeAt[k]; i >= 0 {
		return int(i)
	}
	cs.routeAt[k] = int32(len(cs.routes))
	rtt := cs.p.RTT[cs.rows[r].c][cs.engines[le]]
	cs.routes = append(cs.routes, route{r: r, le: le, rtt: rtt})
	return len(cs.routes) - 1
}

func (cs *compSolver) activateAll() {
	for r, row := range cs.rows {
		for _, cd := range row.cands {
			cs.activate(r, cd.le)
		}
	}
}

// price adds, for each demand row, at most addPerRow left-out routes with
// negative reduced cost, most negative first, and returns how many.
func (cs *compSolver) price(dual []float64) int {
	const tol = 1e-7
	type priced struct {
		le int
		d  float64
	}
	var neg []priced
	added := 0
	for r, row := range cs.rows {
		neg = neg[:0]
		for _, cd := range row.cands {
			if cs.routeAt[r*len(cs.engines)+cd.le] >= 0 {
				continue
			}
			v := -cs.firstSlope(cd.le)
			if er := cs.engRow[cd.le]; er >= 0 {
				v = dual[er]
			}
			if d := cd.rtt + cs.mu - dual[r] - v; d < -tol {
				neg = append(neg, priced{cd.le, d})
			}
		}
		slices.SortFunc(neg, func(a, b priced) int { return cmp.Or(cmp.Compare(a.d, b.d), cmp.Compare(a.le, b.le)) })
		for _, pr := range neg[:min(cs.o.addPerRow, len(neg))] {
			cs.activate(r, pr.le)
			added++
		}
	}
	return added
}

func (cs *compSolver) solveRound(ctx context.Context, sol *Solution) (lpResult, error) {
	if err := ctx.Err(); err != nil {
		return lpResult{}, err
	}
	maxSeconds := 0.0
	if dl, ok := ctx.Deadline(); ok {
		maxSeconds = time.Until(dl).Seconds()
		if maxSeconds <= 0 {
			return lpResult{}, context.DeadlineExceeded
		}
	}
	cs.build()
	sol.Stats.Rounds++
	sol.Stats.Rows = max(sol.Stats.Rows, len(cs.b.rowLo))
	sol.Stats.Columns = max(sol.Stats.Columns, cs.b.cols())
	res, err := cs.b.solve(cs.o.method, maxSeconds)
	if err != nil {
		return lpResult{}, fmt.Errorf("round %d: %w", sol.Stats.Rounds, err)
	}
	return res, nil
}
