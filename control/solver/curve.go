package solver

import (
	"fmt"
	"math"
)

// Curve is an engine's expected latency as a function of its arrival rate:
//
//	L(λ) = Base + Queue·ρ/(1−ρ),  ρ = λ/capacity
//
// Base is the latency of a lone request (seconds) and Queue scales the queueing
// delay, which grows without bound as the load nears capacity (the M/M/1 shape).
// Capacity belongs to the Engine, not to the Curve, so that one fitted Curve
// stays valid when an operator changes an engine's capacity.
type Curve struct {
	Base  float64 `json:"base_seconds"`
	Queue float64 `json:"queue_seconds"`
}

// Validate reports whether the curve describes a non-negative, non-decreasing
// latency. It does not modify the curve.
func (c Curve) Validate() error {
	if !finiteNonNeg(c.Base) {
		return fmt.Errorf("base latency %v s must be finite and ≥ 0", c.Base)
	}
	if !finiteNonNeg(c.Queue) {
		return fmt.Errorf("queue coefficient %v s must be finite and ≥ 0", c.Queue)
	}
	return nil
}

// Latency returns L(load) in seconds for an engine of the given capacity
// (req/s). It is +Inf at or above capacity.
func (c Curve) Latency(load, capacity float64) float64 {
	rho := load / capacity
	if rho >= 1 {
		return math.Inf(1)
	}
	return c.Base + c.Queue*rho/(1-rho)
}

// Cost returns load·L(load): the latency-seconds the engine accrues per second.
// It is convex and increasing on [0, capacity), which keeps the LP exact up to
// the piecewise-linear approximation.
func (c Curve) Cost(load, capacity float64) float64 {
	if load == 0 {
		return 0
	}
	return load * c.Latency(load, capacity)
}

// segment is one piece of the piecewise-linear Cost: Width req/s at Slope
// seconds per req/s. Slopes of consecutive segments never decrease.
type segment struct {
	width, slope float64
}

// segments approximates Cost on [0, rhoMax·capacity] with n chords. The
// breakpoints are denser near the top, where Cost bends hardest:
// ρ_k = ρmax·(1 − (1 − k/n)²). The chords interpolate Cost exactly at the
// breakpoints, so the LP sees the true cost at every vertex it can stop at.
func (c Curve) segments(capacity, rhoMax float64, n int, out []segment) []segment {
	out = out[:0]
	prevLoad, prevCost := 0.0, 0.0
	for k := 1; k <= n; k++ {
		t := 1 - float64(k)/float64(n)
		load := capacity * rhoMax * (1 - t*t)
		cost := c.Cost(load, capacity)
		w := load - prevLoad
		out = append(out, segment{width: w, slope: (cost - prevCost) / w})
		prevLoad, prevCost = load, cost
	}
	return out
}

// pwlCost evaluates the piecewise-linear Cost the LP optimizes at load.
func pwlCost(segs []segment, load float64) float64 {
	total := 0.0
	for _, s := range segs {
		take := math.Min(load, s.width)
		if take <= 0 {
			break
		}
		total += take * s.slope
		load -= take
	}
	return total
}

// marginalSlope is the slope of the segment the load sits in: what one more
// req/s would cost at this engine.
func marginalSlope(segs []segment, load float64) float64 {
	for _, s := range segs {
		if load < s.width*(1-1e-9) {
			return s.slope
		}
		load -= s.width
	}
	return math.Inf(1)
}

func finiteNonNeg(v float64) bool { return v >= 0 && !math.IsInf(v, 1) && !math.IsNaN(v) }
