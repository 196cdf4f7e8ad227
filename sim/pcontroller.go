package sim

import (
	"slices"
	"time"
)

// P-controller parameters: the old design's loop. Every tick each cluster moves an engine's
// weight by pcGain times the relative gap between the engine's smoothed TTFT and the
// cluster's weighted mean. These values were the best TTFT p99 on the steady Mooncake run
// among gains 0.02-0.3 and weight bounds from [0.05, 8] to [0.5, 2]: wider bounds let all
// clusters pile onto the engine that looked fastest, which is the design's known failure.
const (
	pcGain      = 0.1
	pcAlpha     = 0.2 // EWMA weight of a new latency sample
	pcMinWeight = 0.5 // weights stay in [pcMinWeight, pcMaxWeight] (mean 1)
	pcMaxWeight = 2
	pcFailure   = 30 * time.Second // latency sample recorded for a failed attempt
	pcPeriod    = time.Second      // how often the weights move
)

// pController is the old IRB design: each cluster routes by weighted consistent hashing on
// the prefix key, and a proportional feedback loop on observed latency moves the weights.
// It has no model of load, no view of other clusters and no damping of movement.
type pController struct {
	health
	w     [][]float64 // [cluster][engine], mean 1 over up engines
	lat   [][]float64 // EWMA of TTFT in seconds; 0 = no sample yet
	eff   []float64
	score []float64
	order []int
	last  time.Duration // last adjustment
}

func newPController(f fleetShape, retries int) *pController {
	p := &pController{health: newHealth(f, retries), eff: make([]float64, f.engines), score: make([]float64, f.engines),
		last: -pcPeriod}
	for range f.clusters {
		w := make([]float64, f.engines)
		for e := range w {
			w[e] = 1
		}
		p.w = append(p.w, w)
		p.lat = append(p.lat, make([]float64, f.engines))
	}
	return p
}

func (p *pController) Route(_ time.Duration, r *Request) Route {
	for e := range p.eff {
		p.eff[e] = 0
		if p.up[e] {
			p.eff[e] = p.w[r.Cluster][e]
		}
	}
	p.order = rendezvous(r.Key, p.eff, p.order, p.score)
	return p.route(slices.Clone(p.order))
}

func (p *pController) Observe(_ time.Duration, o Outcome) {
	var sample float64
	switch o.Kind {
	case FirstToken:
		sample = o.TTFT.Seconds()
	case Failed:
		if o.Rejected {
			return // a bad request's answer says nothing of the engine's latency
		}
		sample = pcFailure.Seconds()
	default:
		return
	}
	l := &p.lat[o.Request.Cluster][o.Engine]
	if *l == 0 {
		*l = sample
		return
	}
	*l += pcAlpha * (sample - *l)
}

func (p *pController) Tick(now time.Duration, v *View) {
	p.tick(v)
	if now-p.last < pcPeriod {
		return
	}
	p.last = now
	for c := range p.w {
		p.adjust(p.w[c], p.lat[c])
	}
}

// adjust applies one proportional step to one cluster's weights.
func (p *pController) adjust(w, lat []float64) {
	sum, wsum := 0.0, 0.0
	for e := range w {
		if p.up[e] && lat[e] > 0 {
			sum += w[e] * lat[e]
			wsum += w[e]
		}
	}
	if wsum == 0 {
		return
	}
	mean := sum / wsum
	total, n := 0.0, 0
	for e := range w {
		if !p.up[e] {
			continue
		}
		if lat[e] > 0 {
			w[e] *= 1 - pcGain*(lat[e]-mean)/mean
			w[e] = min(max(w[e], pcMinWeight), pcMaxWeight)
		}
		total += w[e]
		n++
	}
	for e := range w {
		if p.up[e] {
			w[e] *= float64(n) / total
		}
	}
}

func (p *pController) Weights(c int, dst []float64) {
	total := 0.0
	for e := range dst {
		dst[e] = 0
		if p.up[e] {
			dst[e] = p.w[c][e]
			total += dst[e]
		}
	}
	for e := range dst {
		if total > 0 {
			dst[e] /= total
		}
	}
}
