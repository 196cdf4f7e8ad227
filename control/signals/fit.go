package signals

import (
	"math"
	"time"

	"github.com/meridian-router/meridian/control/solver"
)

// FitConfig controls how an engine's latency curve is learned.
type FitConfig struct {
	// HalfLife weights older (load, TTFT) points down: a point this old
	// counts half as much as a new one.
	HalfLife time.Duration `json:"half_life"`
	// MinWeight is the total point weight (about the number of recent
	// points) below which the configured default curve is used.
	MinWeight float64 `json:"min_weight"`
	// MinSpread is the least standard deviation of the queueing feature
	// ρ/(1−ρ) that lets the queueing coefficient be fitted; below it only
	// the base latency is fitted and the default queueing coefficient kept.
	MinSpread float64 `json:"min_spread"`
	// Window is how many recent points each engine keeps.
	Window int `json:"window"`
}

// point is one observation: the engine's arrival rate and the mean TTFT of
// the requests that started in the same interval.
type point struct {
	load, ttft float64
	at         time.Time
}

// fitter keeps an engine's recent points in a ring.
type fitter struct {
	pts  []point
	next int
}

func (f *fitter) add(p point, window int) {
	if len(f.pts) < window {
		f.pts = append(f.pts, p)
		return
	}
	f.pts[f.next] = p
	f.next = (f.next + 1) % window
}

// minQueueShare is the least queueing coefficient a fitted curve keeps, as a share of its
// base latency: an M/D/1 queue's, the least any queue of requests that each need Base of
// one server's time can wait (Pollaczek-Khinchine: Base·ρ/(2(1−ρ)) with constant service
// times). Points taken below an engine's knee show no queueing (TTFT flat in load), and
// a fit without it would make the plan's cost linear in load: the LP then fills the
// nearest engines to RhoMax before it spreads, and flips between equal engines.
const minQueueShare = 0.5

// fit least-squares fits L(λ) = Base + Queue·ρ/(1−ρ) (solver.Curve, with
// ρ = λ/capacity) to the points, weighting each by 2^(−age/HalfLife). It
// returns def and false until the points weigh MinWeight; it keeps
// def.Queue when the load has not varied enough to tell queueing from base
// latency. Both coefficients are kept non-negative. Points at or above 98 %
// of capacity are left out: there the feature explodes and one noisy point
// would dominate.
func (f *fitter) fit(capacity float64, now time.Time, cfg FitConfig, def solver.Curve) (c solver.Curve, weight float64, fitted bool) {
	var sw, sx, sy float64
	ws := make([]float64, len(f.pts))
	xs := make([]float64, len(f.pts))
	for i, p := range f.pts {
		rho := p.load / capacity
		if !(capacity > 0) || rho < 0 || rho >= 0.98 {
			continue
		}
		w := math.Exp2(-now.Sub(p.at).Seconds() / cfg.HalfLife.Seconds())
		ws[i], xs[i] = w, rho/(1-rho)
		sw += w
		sx += w * xs[i]
		sy += w * p.ttft
	}
	if sw < cfg.MinWeight {
		return def, sw, false
	}
	mx, my := sx/sw, sy/sw
	var vxx, vxy, sxx, sxy float64
	for i, p := range f.pts {
		dx := xs[i] - mx
		vxx += ws[i] * dx * dx
		vxy += ws[i] * dx * (p.ttft - my)
		sxx += ws[i] * xs[i] * xs[i]
		sxy += ws[i] * xs[i] * p.ttft
	}
	if math.Sqrt(vxx/sw) < cfg.MinSpread {
		return solver.Curve{Base: math.Max(0, my-def.Queue*mx), Queue: def.Queue}, sw, true
	}
	q := vxy / vxx
	b := my - q*mx
	if b < 0 { // through the origin instead
		q, b = math.Max(0, sxy/sxx), 0
	}
	if q < minQueueShare*b {
		b = my / (1 + minQueueShare*mx)
		q = minQueueShare * b
	}
	return solver.Curve{Base: b, Queue: q}, sw, true
}
