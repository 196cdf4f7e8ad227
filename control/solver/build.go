package solver

import (
	"math"
	"slices"
)

// piece is one column of a convex piecewise-linear function walked from a
// reference point: moving by up to width in direction dir costs cost per unit.
type piece struct {
	width, cost float64
	dir         int8
}

// piecesAround splits the convex function given by consecutive segments from
// 0 (the last may be infinitely wide) into columns around ref. It appends
// them to arena and returns the down and up pieces as sub-slices of it, each
// in order of distance from ref. Going down through a segment saves its
// slope; going up costs it. Because slopes rise, an LP that minimizes cost
// walks the pieces in order from ref outwards, so any prefix of each list is
// an exact restriction of the function's domain.
func piecesAround(segs []segment, ref float64, arena []piece) (out, down, up []piece) {
	start := len(arena)
	// Slivers left by rounding (a reference a few ulps off a breakpoint)
	// would be columns the LP cannot use; leave them out.
	sliver := 1e-9 * (1 + math.Abs(ref))
	a := 0.0
	for _, s := range segs {
		b := a + s.width
		if w := math.Min(b, ref) - a; w > sliver {
			arena = append(arena, piece{w, -s.slope, -1})
		}
		a = b
	}
	mid := len(arena)
	a = 0
	for _, s := range segs {
		b := a + s.width
		if w := b - math.Max(a, ref); w > sliver {
			arena = append(arena, piece{w, s.slope, +1})
		}
		a = b
	}
	down = arena[start:mid:mid]
	slices.Reverse(down)
	return arena, down, arena[mid:len(arena):len(arena)]
}

// mergeSegs returns the segments of the sum of two convex piecewise-linear
// functions given from 0; the sum's domain ends where the shorter one ends.
func mergeSegs(a, b []segment, out []segment) []segment {
	out = out[:0]
	i, j := 0, 0
	ra, rb := 0.0, 0.0 // width left in a[i], b[j]
	if len(a) > 0 {
		ra = a[0].width
	}
	if len(b) > 0 {
		rb = b[0].width
	}
	for i < len(a) && j < len(b) {
		w := math.Min(ra, rb)
		if w > 0 {
			out = append(out, segment{w, a[i].slope + b[j].slope})
		}
		if ra -= w; ra <= 0 {
			if i++; i < len(a) {
				ra = a[i].width
			}
		}
		if rb -= w; rb <= 0 {
			if j++; j < len(b) {
				rb = b[j].width
			}
		}
	}
	return out
}

// group is one quantity's columns in the LP: the pieces of its convex cost
// walked from the reference, touching rowA (and rowB) with coefA (coefB) for
// an up move and the negated coefficients for a down move.
type group struct {
	kind         colKind
	idx          int // route index (routeCol, soleCol), local engine (loadCol), demand row (shedCol)
	rowA, rowB   int // rowB is −1 when unused
	coefA, coefB float64
	down, up     []piece
	ref          float64
	nDown, nUp   int   // how many pieces per side are in the LP
	span         *span // nil when every piece is in the LP
}

// span is the part of a lazily built quantity's domain whose pieces are in
// the LP, as absolute bounds [lo, hi] that only ever widen. Keeping bounds
// rather than piece counts lets the reference move between rounds without
// forgetting pieces, which could otherwise cycle.
type span struct {
	lo, hi float64
	set    bool
}

// apply sets g's piece counts from the span, initializing the span to the
// pieces next to the reference (lazy) or to everything.
func (s *span) apply(g *group, ref float64, lazy bool) {
	if !s.set {
		s.set = true
		s.lo, s.hi = math.Inf(-1), math.Inf(1)
		if lazy {
			s.lo, s.hi = ref-reach(g.down, 1), ref+reach(g.up, 1)
		}
	}
	g.ref = ref
	g.nDown = countWithin(g.down, ref-s.lo)
	g.nUp = countWithin(g.up, s.hi-ref)
}

// reach is the distance from the reference covered by the first n pieces.
func reach(ps []piece, n int) float64 {
	d := 0.0
	for _, pc := range ps[:min(n, len(ps))] {
		d += pc.width
	}
	return d
}

// countWithin is how many leading pieces fit in distance d from the
// reference, up to rounding.
func countWithin(ps []piece, d float64) int {
	r := 0.0
	for i, pc := range ps {
		r += pc.width
		if r > d+1e-9*(1+r) {
			return i
		}
	}
	return len(ps)
}

// widen extends the span over g's next n pieces on one side.
func (s *span) widen(g *group, down bool, n int) {
	if down {
		s.lo = math.Min(s.lo, g.ref-reach(g.down, g.nDown+n))
	} else {
		s.hi = math.Max(s.hi, g.ref+reach(g.up, g.nUp+n))
	}
}

// rowDot is Σ coef·dual over the group's rows for an up move.
func (g *group) rowDot(dual []float64) float64 {
	d := g.coefA * dual[g.rowA]
	if g.rowB >= 0 {
		d += g.coefB * dual[g.rowB]
	}
	return d
}

// routeSegs is a route's cost as a function of its flow x: RTT·x + μ|x − prev|, with
// FarMoveCost added to μ above prev on a far route.
func (cs *compSolver) routeSegs(rt *route, out []segment) []segment {
	out = out[:0]
	if rt.prev > 0 {
		out = append(out, segment{rt.prev, rt.rtt - cs.mu})
	}
	return append(out, segment{math.Inf(1), rt.rtt + cs.up(rt.r, rt.rtt)})
}

// engineModes gives each engine a load row if two or more routes reach it.
// An engine with a single route needs no row: its load is that route's flow,
// so the engine's cost joins the route's columns (a soleCol group). In a
// basic optimum the routes form a forest, so most engines have one route
// and the LP keeps few rows: the simplex needs at least one pivot per row,
// and rows are what it spends its time on.
func (cs *compSolver) engineModes() {
	clear(cs.nRoutes)
	for i := range cs.routes {
		cs.nRoutes[cs.routes[i].le]++
	}
	next := len(cs.rows)
	for le, n := range cs.nRoutes {
		cs.engRow[le] = -1
		if n >= 2 {
			cs.engRow[le] = next
			next++
		}
	}
	cs.nLPRows = next
}

// groups lists every quantity's columns for this round.
func (cs *compSolver) makeGroups() {
	cs.groups = cs.groups[:0]
	cs.arena = cs.arena[:0]
	lazy := cs.o.colgen && cs.o.lazyLoad
	for i := range cs.routes {
		rt := &cs.routes[i]
		g := group{kind: routeCol, idx: i, rowA: rt.r, coefA: 1, rowB: cs.engRow[rt.le], coefB: 1}
		cs.scratchA = cs.routeSegs(rt, cs.scratchA)
		segs := cs.scratchA
		if g.rowB < 0 {
			g.kind = soleCol
			cs.scratchB = mergeSegs(segs, cs.ix.segs[cs.engines[rt.le]], cs.scratchB)
			segs = cs.scratchB
		}
		cs.arena, g.down, g.up = piecesAround(segs, rt.x0, cs.arena)
		g.nDown, g.nUp = len(g.down), len(g.up)
		if g.kind == soleCol && lazy {
			g.span = &cs.soleSpan[rt.le]
			g.span.apply(&g, rt.x0, true)
		}
		cs.groups = append(cs.groups, g)
	}
	for le, er := range cs.engRow {
		if er < 0 {
			continue
		}
		g := group{kind: loadCol, idx: le, rowA: er, coefA: -1, rowB: -1}
		cs.arena, g.down, g.up = piecesAround(cs.ix.segs[cs.engines[le]], cs.load0[le], cs.arena)
		g.nDown, g.nUp = len(g.down), len(g.up)
		if lazy {
			g.span = &cs.loadSpan[le]
			g.span.apply(&g, cs.load0[le], true)
		}
		cs.groups = append(cs.groups, g)
	}
	for r, row := range cs.rows {
		g := group{kind: shedCol, idx: r, rowA: r, coefA: 1, rowB: -1}
		cs.scratchA = append(cs.scratchA[:0], segment{row.demand, cs.shedCost})
		cs.arena, g.down, g.up = piecesAround(cs.scratchA, cs.shed0[r], cs.arena)
		g.nDown, g.nUp = len(g.down), len(g.up)
		cs.groups = append(cs.groups, g)
	}
}

// build writes this round's LP. Every row's right-hand side is the
// reference's residual, zero when the reference is feasible.
func (cs *compSolver) build() {
	cs.engineModes()
	cs.makeGroups()
	b := &cs.b
	b.reset(cs.nLPRows)
	cs.cols = cs.cols[:0]
	rhs := b.rowLo
	for r, row := range cs.rows {
		rhs[r] = row.demand - cs.shed0[r]
	}
	for le, er := range cs.engRow {
		if er >= 0 {
			rhs[er] = cs.load0[le]
		}
	}
	for i := range cs.routes {
		rt := &cs.routes[i]
		rhs[rt.r] -= rt.x0
		if er := cs.engRow[rt.le]; er >= 0 {
			rhs[er] -= rt.x0
		}
	}
	for gi := range cs.groups {
		g := &cs.groups[gi]
		for _, pc := range g.down[:g.nDown] {
			cs.addPiece(g, pc)
		}
		for _, pc := range g.up[:g.nUp] {
			cs.addPiece(g, pc)
		}
	}
	copy(b.rowUp, rhs)
}

func (cs *compSolver) addPiece(g *group, pc piece) {
	d := float64(pc.dir)
	if g.rowB >= 0 {
		a, bb, ca, cb := g.rowA, g.rowB, d*g.coefA, d*g.coefB
		if a > bb {
			a, bb, ca, cb = bb, a, cb, ca
		}
		cs.b.col2(0, pc.width, pc.cost, a, ca, bb, cb)
	} else {
		cs.b.col1(0, pc.width, pc.cost, g.rowA, d*g.coefA)
	}
	cs.cols = append(cs.cols, colRef{g.kind, pc.dir, int32(g.idx)})
}

// priceGroups widens each lazy group over the pieces on each side that have a
// negative reduced cost, and returns how many pieces it added.
func (cs *compSolver) priceGroups(dual []float64) int {
	added := 0
	for gi := range cs.groups {
		g := &cs.groups[gi]
		if g.span == nil {
			continue
		}
		dot := g.rowDot(dual)
		// Pieces cost more the further they walk (convexity), so the ones with a
		// negative reduced cost are the next few on each side: all of them join.
		up := 0
		for g.nUp+up < len(g.up) && g.up[g.nUp+up].cost-dot < -priceTol {
			up++
		}
		down := 0
		for g.nDown+down < len(g.down) && g.down[g.nDown+down].cost+dot < -priceTol {
			down++
		}
		if up > 0 {
			g.span.widen(g, false, up)
		}
		if down > 0 {
			g.span.widen(g, true, down)
		}
		added += up + down
	}
	return added
}

// readFlows sets cs.x (route flows) and cs.shed from an LP solution.
func (cs *compSolver) readFlows(res lpResult) {
	cs.x = resize(cs.x, len(cs.routes))
	for i := range cs.routes {
		cs.x[i] = cs.routes[i].x0
	}
	cs.shed = append(cs.shed[:0], cs.shed0...)
	for j, ref := range cs.cols {
		v := float64(ref.dir) * res.x[j]
		switch ref.kind {
		case routeCol, soleCol:
			cs.x[ref.idx] += v
		case shedCol:
			cs.shed[ref.idx] += v
		}
	}
}

// extract writes the last LP's flows and shed into sol.
func (cs *compSolver) extract(sol *Solution) {
	for i := range cs.routes {
		rt := &cs.routes[i]
		row := cs.rows[rt.r]
		sol.Flow[row.c][row.m][cs.engines[rt.le]] = math.Max(0, clampTiny(cs.x[i], row.demand))
	}
	for r, row := range cs.rows {
		sol.Shed[row.c][row.m] = math.Max(0, clampTiny(cs.shed[r], row.demand))
	}
	cs.stats.Pairs += len(cs.routes)
	for _, row := range cs.rows {
		cs.stats.Candidates += len(row.cands)
	}
	cs.stats.ShedCost = math.Max(cs.stats.ShedCost, cs.shedCost)
}
