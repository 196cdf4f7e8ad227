package solver

import "math"

// seed picks the first LP's columns and the reference point. Column
// generation is exact whatever the seed, but each round is a fresh CLP solve
// (lanl/clp cannot warm-start), so a seed close to the optimum saves whole
// rounds and simplex iterations. It takes:
//   - a greedy feasible assignment that keeps Prev's flows where they still
//     fit and places the rest by least RTT + marginal slope (the reference);
//   - every route within seedSlack of its row's cheapest route at the
//     greedy's marginal prices, because the optimum spreads load across
//     near-ties, and the initialK routes that are cheapest when idle.
func (cs *compSolver) seed() {
	g := cs.greedy()
	for r, row := range cs.rows {
		best := math.Inf(1)
		for _, cd := range row.cands {
			best = math.Min(best, cd.rtt+g.slope[cd.le])
		}
		for i, cd := range row.cands {
			if i < cs.o.initialK || (!math.IsInf(best, 1) && cd.rtt+g.slope[cd.le] <= best+cs.o.seedSlack) {
				cs.activate(r, cd.le)
			}
		}
	}
}

// greedyState tracks engine loads while the greedy assignment fills them.
type greedyState struct {
	heaps []pickHeap // per row, built on first use
	seg   []int      // index of the segment the load sits in; len(segs) when full
	room  []float64  // req/s left in that segment
	slope []float64  // that segment's slope; +Inf when full
}

// greedy sets every route's x0, the engines' load0 and the rows' shed0 to a
// feasible assignment and activates the routes it uses.
func (cs *compSolver) greedy() greedyState {
	n := len(cs.engines)
	g := greedyState{heaps: make([]pickHeap, len(cs.rows)), seg: make([]int, n), room: make([]float64, n), slope: make([]float64, n)}
	for le, e := range cs.engines {
		first := cs.ix.segs[e][0]
		g.room[le], g.slope[le] = first.width, first.slope
	}
	left := make([]float64, len(cs.rows))
	for r, row := range cs.rows {
		left[r] = row.demand
	}
	cs.keepPrev(&g, left)
	slice := make([]float64, len(cs.rows))
	for r := range cs.rows {
		slice[r] = left[r] / float64(cs.o.slices)
	}
	for range cs.o.slices {
		for r := range cs.rows {
			cs.shed0[r] += cs.greedyPlace(&g, r, slice[r])
		}
	}
	return g
}

// keepPrev puts Prev's flows back where they fit, scaled down when the
// row's demand fell, and subtracts them from left.
func (cs *compSolver) keepPrev(g *greedyState, left []float64) {
	prevSum := make([]float64, len(cs.rows))
	for i := range cs.routes {
		prevSum[cs.routes[i].r] += cs.routes[i].prev
	}
	for i := range cs.routes {
		rt := &cs.routes[i]
		if rt.prev <= 0 {
			continue
		}
		want := rt.prev * math.Min(1, cs.rows[rt.r].demand/prevSum[rt.r])
		put := cs.fill(g, rt.le, want)
		rt.x0 += put
		left[rt.r] -= put
	}
	for r := range left {
		left[r] = math.Max(0, left[r])
	}
}

// greedyPlace routes amount of row r's demand, one segment at a time, and
// returns what found no room.
func (cs *compSolver) greedyPlace(g *greedyState, r int, amount float64) float64 {
	row := &cs.rows[r]
	eps := 1e-12 * row.demand
	for amount > eps {
		best := cs.greedyPick(g, r)
		if best < 0 {
			return amount
		}
		put := cs.fill(g, best, math.Min(amount, g.room[best]))
		cs.routes[cs.activate(r, best)].x0 += put
		amount -= put
	}
	return 0
}

// greedyPick returns the route with the least RTT + marginal slope for row
// r, or −1 when every engine is full. Each row keeps a min-heap of its routes
// keyed by a cost that may be stale: an engine's cost only rises as it fills
// (the one exception, a route's first use dropping the movement price, is at
// the top already), so a top whose cost is current is the true minimum.
func (cs *compSolver) greedyPick(g *greedyState, r int) int {
	h := &g.heaps[r]
	if *h == nil {
		for _, cd := range cs.rows[r].cands {
			*h = append(*h, pick{cs.greedyCost(g, r, cd.le, cd.rtt), cd.rtt, cd.le})
		}
		h.init()
	}
	for len(*h) > 0 {
		top := &(*h)[0]
		cur := cs.greedyCost(g, r, top.le, top.rtt)
		switch {
		case math.IsInf(cur, 1):
			h.pop() // full engines never come back in the greedy
		case cur == top.cost:
			return top.le
		default:
			top.cost = cur
			h.down(0)
		}
	}
	return -1
}

func (cs *compSolver) greedyCost(g *greedyState, r, le int, rtt float64) float64 {
	cost := rtt + g.slope[le]
	if cs.routeAt[r*len(cs.engines)+le] < 0 {
		cost += cs.up(r, rtt) // a new route pays the movement price
	}
	return cost
}

// pick is a route in a row's greedy heap.
type pick struct {
	cost, rtt float64
	le        int
}

// pickHeap is a binary min-heap by (cost, engine), so ties break the same
// way every time.
type pickHeap []pick

func (h pickHeap) less(i, j int) bool {
	return h[i].cost < h[j].cost || (h[i].cost == h[j].cost && h[i].le < h[j].le)
}

func (h pickHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h pickHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func (h *pickHeap) pop() {
	n := len(*h) - 1
	(*h)[0] = (*h)[n]
	*h = (*h)[:n]
	h.down(0)
}

// fill adds up to amount to engine le's load, crossing segments, and
// returns how much fit. It keeps room > 0 for every engine that is not full,
// so the greedy never picks an engine it cannot add to.
func (cs *compSolver) fill(g *greedyState, le int, amount float64) float64 {
	segs := cs.ix.segs[cs.engines[le]]
	put := 0.0
	for amount > 0 && g.seg[le] < len(segs) {
		take := math.Min(amount, g.room[le])
		put += take
		amount -= take
		cs.load0[le] += take
		g.room[le] -= take
		if g.room[le] <= 1e-12*segs[g.seg[le]].width {
			g.seg[le]++
			g.room[le], g.slope[le] = 0, math.Inf(1)
			if g.seg[le] < len(segs) {
				g.room[le], g.slope[le] = segs[g.seg[le]].width, segs[g.seg[le]].slope
			}
		}
	}
	return put
}
