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
//	x[c,m,e]  = x0 + Σ up − Σ down   (route flow; cost RTT·x + μ|x − prev|)
//	load[e]   = L0 + Σ up − Σ down   (engine load; cost Σ_k slope_k·segment_k)
//	shed[c,m] = s0 + up − down       (cost M·shed)
//
//	rows  demand (c,m):  Σ_e Δx + Δs = D − Σ_e x0 − s0
//	      load e:        Σ Δx − ΔL  = L0 − Σ x0
//
// Each piece is a bounded column costing ± the slope of the stretch of the
// convex function it walks; convexity makes the LP walk pieces in order, so
// no extra rows are needed (the movement term of design.md §10 is the case
// x0 = prev). lanl/clp cannot load a starting basis, so every round is a
// fresh solve; the reference point is how a round starts where the last one
// ended. Round 0's reference is a greedy feasible assignment that keeps
// Prev's flows where they fit (seed.go); every later round's is the previous
// round's solution (rebase), where all rows start balanced and the primal
// simplex is quick.
//
// Rows are what the simplex spends its time on (at least one pivot each), so
// the LP keeps few: only engines reached by two or more active routes get a
// load row. An engine with a single route folds its cost into that route's
// columns (soleCol), and routes that carry nothing and would not help are
// dropped after each round (once; a route priced back in stays). Engine load
// pieces beyond the ones next to the reference join only when priced in.
//
// After each LP every left-out column is priced with the row duals u and v:
// a route (x0 = prev = 0, one up column) costs RTT + μ(+far) − u[c,m] − v[e], with
// v[e] from engineDuals when the engine has no row. Negative reduced costs
// join the next round; when none is left, the LP optimum is the full
// problem's. After maxRounds one LP with every route settles it.
//
// Pricing uses one dual solution of a degenerate LP, so late rounds can add
// columns that an equally valid dual would not, and gain nothing: on the
// 128 × 4096 × 4 benchmark one component spent its last 14 of 29 rounds
// gaining 4e-4 latency-seconds in all out of 33,000. stallRounds rounds in a
// row that each gain less than stallTol per request/s of demand end the
// search (TestStallEndsTheSearch).
type compSolver struct {
	p        *Problem
	ix       *index
	o        options
	engines  []int       // problem engine index by local index
	local    map[int]int // problem engine index → local index
	rows     []demandRow
	routeAt  []int32 // [row·len(engines) + local engine] → index in routes, −1 when inactive
	dropped  []uint8 // same index: how many times the route was dropped as idle
	routes   []route
	engRow   []int     // LP row of each local engine, −1 without active routes
	load0    []float64 // reference load per local engine
	shed0    []float64 // reference shed per row
	mu, far  float64   // movement prices (Params.MoveCost, FarMoveCost), 0 without Prev
	shedCost float64
	b        lp
	cols     []colRef // what each LP column moves, for extract
	nRoutes  []int    // active routes per local engine
	nLPRows  int
	groups   []group
	soleSpan []span    // by local engine: lazy pieces of its sole route
	loadSpan []span    // by local engine: lazy pieces of its load
	x, shed  []float64 // the last LP's route flows and shed per row
	v        []float64 // engine duals for pricing
	scratchA []segment
	scratchB []segment
	arena    []piece // this round's pieces; groups hold sub-slices
	stats    Stats   // this component's, merged into the Solution's by solve
}

type demandRow struct {
	c, m   int
	demand float64
	cands  []cand  // allowed routes, cheapest first when idle
	near   float64 // the least RTT of its cands: routes within farTolerance of it are near
}

type cand struct {
	le   int
	rtt  float64
	idle float64 // rtt + the engine's first slope: the route's cost at zero load
}

type route struct {
	r, le         int
	rtt, prev, x0 float64
	// sticky routes are never dropped as idle: they were dropped and priced
	// back in maxDrops times already, and dropping them again could cycle.
	sticky bool
}

// colRef says which quantity an LP column moves and in which direction.
type colRef struct {
	kind colKind
	dir  int8
	idx  int32 // route index, or row index for shed
}

type colKind uint8

const (
	routeCol colKind = iota // a route to an engine with a load row
	soleCol                 // the only route to an engine without a load row
	loadCol
	shedCol
)

func newCompSolver(p *Problem, ix *index, comp component, o options) *compSolver {
	cs := &compSolver{p: p, ix: ix, o: o, engines: comp.engines, local: make(map[int]int, len(comp.engines))}
	for le, e := range comp.engines {
		cs.local[e] = le
	}
	if ix.hasPrev {
		cs.mu, cs.far = p.Params.MoveCost, p.Params.FarMoveCost
	}
	maxRTT := 0.0
	for _, m := range comp.models {
		for c := range p.Clusters {
			if p.Demand[c][m] <= 0 {
				continue
			}
			row := demandRow{c: c, m: m, demand: p.Demand[c][m], near: nearestRTT(p, ix, c, m)}
			for _, e := range ix.modelEngines[m] {
				if rtt := p.RTT[c][e]; !math.IsInf(rtt, 1) {
					le := cs.local[e]
					row.cands = append(row.cands, cand{le, rtt, rtt + ix.segs[e][0].slope})
					maxRTT = math.Max(maxRTT, rtt)
				}
			}
			slices.SortFunc(row.cands, func(a, b cand) int {
				return cmp.Or(cmp.Compare(a.idle, b.idle), cmp.Compare(a.le, b.le))
			})
			cs.rows = append(cs.rows, row)
		}
	}
	cs.shedCost = cs.shedBound(maxRTT)
	cs.routeAt = make([]int32, len(cs.rows)*len(cs.engines))
	for i := range cs.routeAt {
		cs.routeAt[i] = -1
	}
	cs.dropped = make([]uint8, len(cs.routeAt))
	cs.engRow = make([]int, len(cs.engines))
	cs.nRoutes = make([]int, len(cs.engines))
	cs.soleSpan = make([]span, len(cs.engines))
	cs.loadSpan = make([]span, len(cs.engines))
	cs.load0 = make([]float64, len(cs.engines))
	cs.shed0 = make([]float64, len(cs.rows))
	return cs
}

func (cs *compSolver) firstSlope(le int) float64 { return cs.ix.segs[cs.engines[le]][0].slope }

// up is the movement price of adding flow to row r's route at the given RTT: MoveCost, plus
// FarMoveCost when the route is far (see Params.FarMoveCost).
func (cs *compSolver) up(r int, rtt float64) float64 {
	return upPrice(cs.mu, cs.far, rtt, cs.rows[r].near)
}

// upPrice is the movement price of adding flow to a route of rtt for a cluster whose
// nearest engine for the model is near.
func upPrice(mu, far, rtt, near float64) float64 {
	if rtt > near+farTolerance {
		return mu + far
	}
	return mu
}

// nearestRTT is the least RTT from cluster c to an engine that may serve model m (+Inf
// when none may).
func nearestRTT(p *Problem, ix *index, c, m int) float64 {
	near := math.Inf(1)
	for _, e := range ix.modelEngines[m] {
		near = math.Min(near, p.RTT[c][e])
	}
	return near
}

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
	bound := 2 * (topSlope + float64(len(cs.engines))*(maxRTT+2*cs.mu+cs.far) + 1)
	return math.Max(cs.p.Params.ShedCost, bound)
}

func (cs *compSolver) run(ctx context.Context, sol *Solution) error {
	if len(cs.rows) == 0 {
		return nil
	}
	cs.stats.Components = 1
	cs.activatePrev()
	if cs.o.colgen {
		cs.seed()
	} else {
		cs.activateAll()
		cs.referenceFromPrev()
	}
	var res lpResult
	rebase := cs.o.colgen && cs.o.rebase
	stalled, stallTol := 0, cs.o.stallTol*cs.demand()
	for round := 0; ; round++ {
		last := !cs.o.colgen || round == cs.o.maxRounds
		if last {
			// Tailing off: settle it with every route and piece in one LP.
			cs.activateAll()
			cs.o.lazyLoad, rebase = false, false
		}
		var err error
		if res, err = cs.solveRound(ctx, sol, round); err != nil {
			return err
		}
		cs.readFlows(res)
		if rebase && cs.b.gain(res) <= stallTol {
			stalled++
		} else {
			stalled = 0
		}
		if cs.o.stallRounds > 0 && stalled >= cs.o.stallRounds {
			// What is left is far below what weights in thousandths can show.
			cs.stats.Stalled++
			break
		}
		v := cs.engineDuals(res.dual)
		var idle []int
		if rebase {
			idle = cs.idleRoutes(res.dual, v)
		}
		added := cs.price(res.dual, v)
		if added == 0 || last {
			break
		}
		if rebase {
			cs.rebase(idle)
		}
	}
	cs.extract(sol)
	return nil
}

// demand is the component's total demand, requests/s.
func (cs *compSolver) demand() float64 {
	total := 0.0
	for _, row := range cs.rows {
		total += row.demand
	}
	return total
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
	cs.routes = append(cs.routes, route{r: r, le: le, rtt: rtt, sticky: cs.dropped[k] >= cs.o.maxDrops})
	return len(cs.routes) - 1
}

func (cs *compSolver) activateAll() {
	for r, row := range cs.rows {
		for _, cd := range row.cands {
			cs.activate(r, cd.le)
		}
	}
}

// price adds the left-out columns with negative reduced cost (load pieces,
// and for each demand row at most addPerRow routes, most negative first) and
// returns how many.
func (cs *compSolver) price(dual, v []float64) int {
	type priced struct {
		le int
		d  float64
	}
	var neg []priced
	added := cs.priceGroups(dual)
	for r, row := range cs.rows {
		neg = neg[:0]
		for _, cd := range row.cands {
			if cs.routeAt[r*len(cs.engines)+cd.le] >= 0 {
				continue
			}
			if d := cd.rtt + cs.up(r, cd.rtt) - dual[r] - v[cd.le]; d < -priceTol {
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

// priceTol is the reduced cost below which a column is worth adding; CLP's
// own dual feasibility tolerance is 1e-7.
const priceTol = 1e-7

// idleRoutes lists the routes that carry no flow, had none in Prev, and
// would only cost more with flow: rebase drops them so that the LP keeps few
// engine rows.
func (cs *compSolver) idleRoutes(dual, v []float64) []int {
	var idle []int
	for i := range cs.routes {
		rt := &cs.routes[i]
		if rt.prev > 0 || rt.sticky || cs.x[i] > 1e-9*cs.rows[rt.r].demand {
			continue
		}
		if rt.rtt+cs.up(rt.r, rt.rtt)-dual[rt.r]-v[rt.le] > -priceTol {
			idle = append(idle, i)
		}
	}
	return idle
}

// rebase moves the reference to the last LP's solution, so the next LP
// starts where this one ended, and drops the idle routes.
func (cs *compSolver) rebase(idle []int) {
	keep := cs.routes[:0]
	drop := 0
	for i, rt := range cs.routes {
		if drop < len(idle) && idle[drop] == i {
			drop++
			cs.routeAt[rt.r*len(cs.engines)+rt.le] = -1
			cs.dropped[rt.r*len(cs.engines)+rt.le]++
			continue
		}
		if i < len(cs.x) {
			rt.x0 = math.Max(0, cs.x[i])
		}
		cs.routeAt[rt.r*len(cs.engines)+rt.le] = int32(len(keep))
		keep = append(keep, rt)
	}
	cs.routes = keep
	clear(cs.load0)
	for _, rt := range cs.routes {
		cs.load0[rt.le] += rt.x0
	}
	for le, e := range cs.engines {
		cs.load0[le] = math.Min(cs.load0[le], capOf(cs.ix.segs[e]))
	}
	for r := range cs.shed0 {
		cs.shed0[r] = math.Max(0, cs.shed[r])
	}
}

// engineDuals returns a dual price v[e] for every engine's load, row or no
// row. With a row it is the row's dual. Without routes the engine is idle and
// v = −slope₁. With a sole route of flow x (no row), any v that keeps the
// split columns' reduced costs non-negative is valid:
//
//	max(−slope⁺(x), rttDown(x) − u) ≤ v ≤ min(−slope⁻(x), rttUp(x) − u)
//
// where slope± are the engine's right and left slopes at x and rtt* the
// route's cost slopes; the interval is non-empty because the merged columns
// are optimal. Pricing with its lower end adds a route only when every valid
// dual says it helps, so an empty pricing round still proves optimality.
func (cs *compSolver) engineDuals(dual []float64) []float64 {
	cs.v = resize(cs.v, len(cs.engines))
	for le := range cs.engines {
		cs.v[le] = -cs.firstSlope(le)
		if er := cs.engRow[le]; er >= 0 {
			cs.v[le] = dual[er]
		}
	}
	for i := range cs.routes {
		rt := &cs.routes[i]
		if cs.engRow[rt.le] >= 0 {
			continue
		}
		x := cs.x[i]
		lo := math.Inf(-1)
		if up := marginalSlope(cs.ix.segs[cs.engines[rt.le]], x); !math.IsInf(up, 1) {
			lo = -up
		}
		if x > 1e-9*cs.rows[rt.r].demand {
			down := rt.rtt + cs.up(rt.r, rt.rtt)
			if x <= rt.prev*(1+1e-9) {
				down = rt.rtt - cs.mu
			}
			lo = math.Max(lo, down-dual[rt.r])
		}
		cs.v[rt.le] = lo
	}
	return cs.v
}

func (cs *compSolver) solveRound(ctx context.Context, sol *Solution, round int) (lpResult, error) {
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
	cs.stats.Rounds++
	cs.stats.Rows = max(cs.stats.Rows, len(cs.b.rowLo))
	cs.stats.Columns = max(cs.stats.Columns, cs.b.cols())
	m := cs.o.method
	switch {
	case round > 0 && cs.o.colgen && cs.o.rebase:
		m = cs.o.laterMethod
	case len(cs.b.rowLo) >= cs.o.bigRows:
		m = cs.o.bigMethod
	}
	res, err := cs.b.solve(m, maxSeconds)
	if err != nil {
		return lpResult{}, fmt.Errorf("round %d: %w", cs.stats.Rounds, err)
	}
	return res, nil
}
