package solver

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// compSolver solves one component by column generation. The LP:
//
//	rows   demand (c,m):  Σ_e (p − n) + s       = D[c,m] − Σ_e prev[c,m,e]
//	       load e:        Σ_{c,m} (p − n) − Σ_k y = −Σ_{c,m} prev[c,m,e]
//	cols   p ≥ 0          cost RTT + μ   (flow added to a route)
//	       0 ≤ n ≤ prev   cost μ − RTT   (flow taken off a route)
//	       0 ≤ y_k ≤ w_k  cost slope_k   (engine load segments, convex)
//	       0 ≤ s ≤ D      cost M         (shed)
//
// so x = prev + p − n and the movement term μ|x − prev| costs no extra rows
// (design.md §10). Without a Prev there are no n columns and μ is 0. Only
// the routes in the active set get columns; after each LP, every left-out
// route (which has prev = 0, so only a p column) is priced with the row duals
// u and v: RTT + μ − u[c,m] − v[e]. Routes with negative reduced cost join
// the set, and when none is left the LP optimum is the full problem's.
type compSolver struct {
	p        *Problem
	ix       *index
	o        options
	engines  []int       // problem engine index by local index
	local    map[int]int // problem engine index → local index
	rows     []demandRow
	active   []bool // [row·len(engines) + local engine]
	pairs    []route
	mu       float64
	shedCost float64
	b        lp
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
	r, le     int
	rtt, prev float64
}

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
	cs.active = make([]bool, len(cs.rows)*len(cs.engines))
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
	cs.seed()
	var res lpResult
	for round := 0; ; round++ {
		full := !cs.o.colgen || round == cs.o.maxRounds
		if full {
			cs.activateAll()
		}
		var err error
		if res, err = cs.solveRound(ctx, sol); err != nil {
			return err
		}
		if full || cs.price(res.dual) == 0 {
			break
		}
	}
	cs.extract(res, sol)
	return nil
}

// seed activates every route that carried flow in Prev (they must keep
// their n column, or the movement term would be wrong) and the initialK
// routes that are cheapest when idle.
func (cs *compSolver) seed() {
	for r, row := range cs.rows {
		for _, f := range cs.ix.prev[row.c][row.m] {
			le, ok := cs.local[f.e]
			if ok && !math.IsInf(cs.p.RTT[row.c][f.e], 1) && cs.serves(f.e, row.m) {
				cs.activate(r, le, f.x)
			}
		}
		for _, cd := range row.cands[:min(cs.o.initialK, len(row.cands))] {
			cs.activate(r, cd.le, 0)
		}
	}
}

func (cs *compSolver) serves(e, m int) bool { return slices.Contains(cs.p.Engines[e].Models, m) }

func (cs *compSolver) activate(r, le int, prev float64) {
	k := r*len(cs.engines) + le
	if cs.active[k] {
		return
	}
	cs.active[k] = true
	rtt := cs.p.RTT[cs.rows[r].c][cs.engines[le]]
	cs.pairs = append(cs.pairs, route{r: r, le: le, rtt: rtt, prev: prev})
}

func (cs *compSolver) activateAll() {
	for r, row := range cs.rows {
		for _, cd := range row.cands {
			cs.activate(r, cd.le, 0)
		}
	}
}

// price adds the most negative reduced-cost routes, at most addPerRow per
// demand row, and returns how many it added.
func (cs *compSolver) price(dual []float64) int {
	const tol = 1e-7
	nr := len(cs.rows)
	added := 0
	var neg []cand // le and reduced cost
	for r, row := range cs.rows {
		neg = neg[:0]
		for _, cd := range row.cands {
			if cs.active[r*len(cs.engines)+cd.le] {
				continue
			}
			if d := cd.rtt + cs.mu - dual[r] - dual[nr+cd.le]; d < -tol {
				neg = append(neg, cand{cd.le, d})
			}
		}
		slices.SortFunc(neg, func(a, b cand) int {
			return cmp.Or(cmp.Compare(a.rtt, b.rtt), cmp.Compare(a.le, b.le))
		})
		for _, cd := range neg[:min(cs.o.addPerRow, len(neg))] {
			cs.activate(r, cd.le, 0)
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

// build writes the LP for the active routes. Column order: for each route
// its p (and n when prev > 0), then each engine's segments, then each row's
// shed column; extract relies on it.
func (cs *compSolver) build() {
	nr, ne := len(cs.rows), len(cs.engines)
	b := &cs.b
	b.reset(nr + ne)
	rhs := b.rowLo
	for r, row := range cs.rows {
		rhs[r] = row.demand
	}
	inf := math.Inf(1)
	for _, rt := range cs.pairs {
		b.col2(0, inf, rt.rtt+cs.mu, rt.r, 1, nr+rt.le, 1)
		if rt.prev > 0 {
			b.col2(0, rt.prev, cs.mu-rt.rtt, rt.r, -1, nr+rt.le, -1)
			rhs[rt.r] -= rt.prev
			rhs[nr+rt.le] -= rt.prev
		}
	}
	for le, e := range cs.engines {
		for _, sg := range cs.ix.segs[e] {
			b.col1(0, sg.width, sg.slope, nr+le, -1)
		}
	}
	for r, row := range cs.rows {
		b.col1(0, row.demand, cs.shedCost, r, 1)
	}
	copy(b.rowUp, rhs)
}

func (cs *compSolver) extract(res lpResult, sol *Solution) {
	j := 0
	for _, rt := range cs.pairs {
		x := rt.prev + res.x[j]
		j++
		if rt.prev > 0 {
			x -= res.x[j]
			j++
		}
		row := cs.rows[rt.r]
		sol.Flow[row.c][row.m][cs.engines[rt.le]] = math.Max(0, clampTiny(x, row.demand))
	}
	for _, e := range cs.engines {
		j += len(cs.ix.segs[e])
	}
	for r, row := range cs.rows {
		sol.Shed[row.c][row.m] = math.Max(0, clampTiny(res.x[j+r], row.demand))
	}
	sol.Stats.Pairs += len(cs.pairs)
	for _, row := range cs.rows {
		sol.Stats.Candidates += len(row.cands)
	}
	sol.Stats.ShedCost = math.Max(sol.Stats.ShedCost, cs.shedCost)
}
