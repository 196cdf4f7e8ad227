package solver

import (
	"math"
	"slices"
	"sort"
	"time"
)

// Solution is the optimizer's answer for one Problem. It is immutable once
// Solve returns it and safe to read from many goroutines; it may be passed
// back as the next Problem.Prev.
type Solution struct {
	// Clusters, Models and Engines are the problem's names, in its order; the
	// slices below are indexed the same way.
	Clusters []string `json:"clusters"`
	Models   []string `json:"models"`
	Engines  []string `json:"engines"`
	// Demand[c][m] copies the problem's demand (req/s).
	Demand [][]float64 `json:"demand_rps"`
	// Flow[c][m][e] is the planned rate (req/s) from cluster c to engine e for model m.
	Flow [][][]float64 `json:"flow_rps"`
	// Shed[c][m] is the rate (req/s) the cluster should refuse for model m.
	Shed [][]float64 `json:"shed_rps"`
	// Load[e] is the engine's planned arrival rate (req/s), summed over clusters and models.
	Load []float64 `json:"load_rps"`
	// Marginal[e] is the cost, in seconds, of one more req/s at engine e:
	// the dual price of its load, including any capacity shadow price.
	Marginal []float64 `json:"marginal_seconds"`
	// Fallback[c][m] is the engine that takes (c, m)'s traffic when the plan
	// routes none of it (zero demand, or everything shed): the eligible engine
	// with the least RTT + Marginal. −1 when no engine may serve the pair.
	Fallback [][]int `json:"fallback"`
	// Objective is the optimized cost in seconds per second: Σ flow·RTT +
	// Σ piecewise-linear engine cost + shed cost·shed + μ·Σ|flow − prev flow|.
	Objective float64 `json:"objective"`
	// MeanLatency is the demand-weighted expected latency (seconds) of routed
	// requests under the exact Curve, RTT included; 0 when nothing is routed.
	MeanLatency float64       `json:"mean_latency_seconds"`
	Duration    time.Duration `json:"duration_ns"`
	Stats       Stats         `json:"stats"`
}

// Stats describe how a solve went, for introspection and benchmarks.
type Stats struct {
	// Components is the number of independent sub-problems (groups of models
	// linked by shared engines) solved separately.
	Components int `json:"components"`
	// Rounds counts LP solves, summed over components (column generation adds
	// rounds until no left-out (cluster, engine) pair could lower the cost).
	Rounds int `json:"rounds"`
	// Stalled counts the components whose search ended because rounds
	// stopped paying (options.stallRounds), not because no column was left.
	Stalled int `json:"stalled,omitempty"`
	// Pairs is the number of (cluster, model, engine) routes in the last LP
	// of each component, summed; Candidates is how many routes were allowed.
	Pairs      int `json:"pairs"`
	Candidates int `json:"candidates"`
	// Rows and Columns are the largest LP's dimensions.
	Rows    int `json:"rows"`
	Columns int `json:"columns"`
	// ShedCost is the shed price the LP used (≥ Params.ShedCost).
	ShedCost float64 `json:"shed_cost_seconds"`
}

// ShedFraction returns the share of cluster c's demand for model m that the
// data plane should shed, in [0, 1]; 0 when there is no demand.
func (s *Solution) ShedFraction(c, m int) float64 {
	d := s.Demand[c][m]
	if d <= 0 {
		return 0
	}
	return math.Min(1, math.Max(0, s.Shed[c][m]/d))
}

// Weights quantizes cluster c's split of model m across engines into integer
// EDS weights summing to total (when total ≥ the number of engines kept).
// The result is indexed by engine; 0 means "leave the engine out of this
// node's assignment", and every kept engine has a weight ≥ 1, because EDS
// rejects a weight of 0. An engine whose share is below half a unit
// (share·total < 0.5) is left out. When the plan routes nothing for (c, m),
// the whole weight goes to Fallback[c][m]; all zeros when there is none.
// Equal inputs give equal outputs: ties break by engine index.
func (s *Solution) Weights(c, m int, total uint32) []uint32 {
	w := make([]uint32, len(s.Engines))
	if total == 0 {
		return w
	}
	flows := s.Flow[c][m]
	sum := 0.0
	for _, f := range flows {
		sum += f
	}
	if !(sum > 0) {
		if f := s.Fallback[c][m]; f >= 0 {
			w[f] = total
		}
		return w
	}
	quantize(flows, sum, total, w)
	return w
}

// quantize is the largest-remainder method with a floor of 1 for every kept
// entry. Entries below half a unit are dropped, except that the largest is
// always kept; when more entries remain than units, the largest total keep
// one unit each. It writes into w.
func quantize(flows []float64, sum float64, total uint32, w []uint32) {
	type part struct {
		e       int
		q, frac float64
	}
	parts := make([]part, 0, 16)
	best := -1
	for e, f := range flows {
		q := f / sum * float64(total)
		if best < 0 || f > flows[best] {
			best = e
		}
		if q >= 0.5 {
			parts = append(parts, part{e: e, q: q})
		}
	}
	if len(parts) == 0 {
		w[best] = total
		return
	}
	if len(parts) > int(total) {
		sort.SliceStable(parts, func(i, j int) bool { return parts[i].q > parts[j].q })
		for _, p := range parts[:total] {
			w[p.e] = 1
		}
		return
	}
	var left int64 = int64(total)
	for i := range parts {
		fl := math.Floor(parts[i].q)
		parts[i].frac = parts[i].q - fl
		w[parts[i].e] = uint32(math.Max(1, fl))
		left -= int64(w[parts[i].e])
	}
	// Hand out the remainder to the largest fractions first.
	sort.SliceStable(parts, func(i, j int) bool { return parts[i].frac > parts[j].frac })
	for i := 0; left > 0; i = (i + 1) % len(parts) {
		w[parts[i].e]++
		left--
	}
	// Bumps to 1 can overshoot: take units back from entries that can spare
	// one, smallest fractions first. There are at most total entries, so
	// this ends with the sum at total.
	for i := len(parts) - 1; left < 0; i = (i - 1 + len(parts)) % len(parts) {
		if w[parts[i].e] > 1 {
			w[parts[i].e]--
			left++
		}
	}
}

// SpreadWeights splits cluster c's traffic for model m, as EDS weights summing to total,
// over the engines whose price for a first request (RTT + Marginal) is within tol seconds
// of the best, in proportion to the capacity each has left below RhoMax. It is for pairs
// with no demand yet: the plan's flow for a tiny stand-in demand sits on one LP vertex, so
// a node's first requests would all land on one engine. The solution must be p's. All
// zeros when no engine may serve the pair; Weights' fallback when none has room.
func (s *Solution) SpreadWeights(p *Problem, c, m int, tol float64, total uint32) []uint32 {
	best := math.Inf(1)
	for e, eng := range p.Engines {
		if eng.Healthy && slices.Contains(eng.Models, m) {
			best = math.Min(best, p.RTT[c][e]+s.Marginal[e])
		}
	}
	room := make([]float64, len(p.Engines))
	sum := 0.0
	for e, eng := range p.Engines {
		if !eng.Healthy || !slices.Contains(eng.Models, m) || p.RTT[c][e]+s.Marginal[e] > best+tol {
			continue
		}
		if r := eng.Capacity*p.Params.RhoMax - s.Load[e]; r > 0 {
			room[e] = r
			sum += r
		}
	}
	if !(sum > 0) {
		return s.Weights(c, m, total)
	}
	w := make([]uint32, len(p.Engines))
	quantize(room, sum, total, w)
	return w
}
