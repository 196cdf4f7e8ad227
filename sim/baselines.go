package sim

import (
	"cmp"
	"slices"
	"time"
)

// health is what every baseline knows from the last tick: which engines answer their
// health checks. Until the first tick every engine is presumed up.
type health struct {
	f       fleetShape
	retries int
	up      []bool
}

func newHealth(f fleetShape, retries int) health {
	up := make([]bool, f.engines)
	for i := range up {
		up[i] = true
	}
	return health{f: f, retries: retries, up: up}
}

func (h *health) tick(v *View) {
	for e, ev := range v.Engines {
		h.up[e] = ev.Up
	}
}

// uniform writes equal shares over the up engines.
func (h *health) uniform(dst []float64) {
	n := 0
	for _, u := range h.up {
		if u {
			n++
		}
	}
	for e := range dst {
		dst[e] = 0
		if h.up[e] && n > 0 {
			dst[e] = 1 / float64(n)
		}
	}
}

// upByCost refills order with the up engines in index order, setting costs[e] = cost(e)
// for each: the candidates a cost-ranking router sorts (byCost).
func (h *health) upByCost(order []int, costs []float64, cost func(e int) float64) []int {
	order = order[:0]
	for e := range h.f.engines {
		if h.up[e] {
			costs[e] = cost(e)
			order = append(order, e)
		}
	}
	return order
}

// byCost sorts order by cost[e], lowest first, keeping the order of equal costs.
func byCost(order []int, cost []float64) {
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(cost[a], cost[b]) })
}

func (h *health) route(engines []int) Route {
	return Route{Engines: engines[:min(len(engines), h.retries+1)], Retries: h.retries}
}

// roundRobin cycles each cluster's requests over the up engines, ignoring load and prefix.
type roundRobin struct {
	health
	next []int
}

func newRoundRobin(f fleetShape, retries int) *roundRobin {
	return &roundRobin{health: newHealth(f, retries), next: make([]int, f.clusters)}
}

func (p *roundRobin) Route(_ time.Duration, r *Request) Route {
	var out []int
	for i := 0; i < p.f.engines && len(out) <= p.retries; i++ {
		e := (p.next[r.Cluster] + i) % p.f.engines
		if p.up[e] {
			out = append(out, e)
		}
	}
	if len(out) > 0 {
		p.next[r.Cluster] = (out[0] + 1) % p.f.engines
	}
	return p.route(out)
}

func (p *roundRobin) Observe(time.Duration, Outcome) {}
func (p *roundRobin) Tick(_ time.Duration, v *View)  { p.tick(v) }
func (p *roundRobin) Weights(_ int, dst []float64)   { p.uniform(dst) }

// leastRequest sends each request to the up engine with the fewest requests in flight from
// the same cluster (each proxy only counts its own, as Envoy's LEAST_REQUEST does). Ties go
// round robin.
type leastRequest struct {
	health
	inflight [][]int // [cluster][engine]
	next     []int
	order    []int
}

func newLeastRequest(f fleetShape, retries int) *leastRequest {
	p := &leastRequest{health: newHealth(f, retries), next: make([]int, f.clusters)}
	for range f.clusters {
		p.inflight = append(p.inflight, make([]int, f.engines))
	}
	return p
}

func (p *leastRequest) Route(_ time.Duration, r *Request) Route {
	counts := p.inflight[r.Cluster]
	start := p.next[r.Cluster]
	p.next[r.Cluster] = (start + 1) % p.f.engines
	p.order = p.order[:0]
	for i := range p.f.engines {
		if e := (start + i) % p.f.engines; p.up[e] {
			p.order = append(p.order, e)
		}
	}
	slices.SortStableFunc(p.order, func(a, b int) int { return counts[a] - counts[b] })
	return p.route(slices.Clone(p.order))
}

func (p *leastRequest) Observe(_ time.Duration, o Outcome) {
	switch o.Kind {
	case Sent:
		p.inflight[o.Request.Cluster][o.Engine]++
	case Done, Failed:
		p.inflight[o.Request.Cluster][o.Engine]--
	}
}

func (p *leastRequest) Tick(_ time.Duration, v *View) { p.tick(v) }
func (p *leastRequest) Weights(_ int, dst []float64)  { p.uniform(dst) }

// prefixHash sends each request to the engine its prefix key hashes to, by rendezvous
// hashing over the up engines with equal weights: perfect affinity, no load awareness.
type prefixHash struct {
	health
	w     []float64
	score []float64
	order []int
}

func newPrefixHash(f fleetShape, retries int) *prefixHash {
	return &prefixHash{health: newHealth(f, retries), w: make([]float64, f.engines), score: make([]float64, f.engines)}
}

func (p *prefixHash) Route(_ time.Duration, r *Request) Route {
	for e := range p.w {
		p.w[e] = 0
		if p.up[e] {
			p.w[e] = 1
		}
	}
	p.order = rendezvous(r.Key, p.w, p.order, p.score)
	return p.route(slices.Clone(p.order))
}

func (p *prefixHash) Observe(time.Duration, Outcome) {}
func (p *prefixHash) Tick(_ time.Duration, v *View)  { p.tick(v) }
func (p *prefixHash) Weights(_ int, dst []float64)   { p.uniform(dst) }
