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
// 0 (the last may be infinitely wide) into columns around ref. Going down
// through a segment saves its slope; going up costs it. Because slopes rise,
// an LP that minimizes cost walks the pieces in order from ref outwards.
func piecesAround(segs []segment, ref float64, out []piece) []piece {
	out = out[:0]
	a := 0.0
	for _, s := range segs {
		b := a + s.width
		if w := math.Min(b, ref) - a; w > 0 {
			out = append(out, piece{w, -s.slope, -1})
		}
		if w := b - math.Max(a, ref); w > 0 {
			out = append(out, piece{w, s.slope, +1})
		}
		a = b
	}
	return out
}

// routeSegs is a route's cost as a function of its flow x: RTT·x + μ|x − prev|.
func (cs *compSolver) routeSegs(rt *route) []segment {
	inf := math.Inf(1)
	cs.fsegs = cs.fsegs[:0]
	if rt.prev > 0 {
		cs.fsegs = append(cs.fsegs, segment{rt.prev, rt.rtt - cs.mu})
	}
	cs.fsegs = append(cs.fsegs, segment{inf, rt.rtt + cs.mu})
	return cs.fsegs
}

// build writes the LP for the active routes around the reference point.
func (cs *compSolver) build() {
	nr := len(cs.rows)
	for le := range cs.engRow {
		cs.engRow[le] = -1
	}
	for i := range cs.routes {
		cs.engRow[cs.routes[i].le] = 0
	}
	rows := nr
	for le := range cs.engRow {
		if cs.engRow[le] == 0 {
			cs.engRow[le] = rows
			rows++
		}
	}
	b := &cs.b
	b.reset(rows)
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
		er := cs.engRow[rt.le]
		rhs[rt.r] -= rt.x0
		rhs[er] -= rt.x0
		cs.pieces = piecesAround(cs.routeSegs(rt), rt.x0, cs.pieces)
		for _, pc := range cs.pieces {
			d := float64(pc.dir)
			b.col2(0, pc.width, pc.cost, rt.r, d, er, d)
			cs.cols = append(cs.cols, colRef{routeCol, pc.dir, int32(i)})
		}
	}
	for le, er := range cs.engRow {
		if er < 0 {
			continue
		}
		cs.pieces = piecesAround(cs.ix.segs[cs.engines[le]], cs.load0[le], cs.pieces)
		for _, pc := range cs.pieces {
			b.col1(0, pc.width, pc.cost, er, -float64(pc.dir))
			cs.cols = append(cs.cols, colRef{loadCol, pc.dir, int32(le)})
		}
	}
	for r, row := range cs.rows {
		cs.pieces = piecesAround([]segment{{row.demand, cs.shedCost}}, cs.shed0[r], cs.pieces)
		for _, pc := range cs.pieces {
			b.col1(0, pc.width, pc.cost, r, float64(pc.dir))
			cs.cols = append(cs.cols, colRef{shedCol, pc.dir, int32(r)})
		}
	}
	copy(b.rowUp, rhs)
}

// extract writes the LP's flows and shed into sol.
func (cs *compSolver) extract(res lpResult, sol *Solution) {
	x := make([]float64, len(cs.routes))
	for i := range cs.routes {
		x[i] = cs.routes[i].x0
	}
	shed := slices.Clone(cs.shed0)
	for j, ref := range cs.cols {
		v := float64(ref.dir) * res.x[j]
		switch ref.kind {
		case routeCol:
			x[ref.idx] += v
		case shedCol:
			shed[ref.idx] += v
		}
	}
	for i := range cs.routes {
		rt := &cs.routes[i]
		row := cs.rows[rt.r]
		sol.Flow[row.c][row.m][cs.engines[rt.le]] = math.Max(0, clampTiny(x[i], row.demand))
	}
	for r, row := range cs.rows {
		sol.Shed[row.c][row.m] = math.Max(0, clampTiny(shed[r], row.demand))
	}
	sol.Stats.Pairs += len(cs.routes)
	for _, row := range cs.rows {
		sol.Stats.Candidates += len(row.cands)
	}
	sol.Stats.ShedCost = math.Max(sol.Stats.ShedCost, cs.shedCost)
}
