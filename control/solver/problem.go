package solver

import (
	"errors"
	"fmt"
	"math"
)

// Engine is one inference engine as the solver sees it.
type Engine struct {
	// Name identifies the engine across solves; Problem.Prev is matched by name.
	Name string `json:"name"`
	// Models lists indices into Problem.Models that the engine serves.
	Models []int `json:"models"`
	// Capacity is the arrival rate (req/s) at which the engine saturates. The
	// solver never loads an engine above Params.RhoMax·Capacity. Callers fold
	// local penalties in here (capacity × penalty) so lost capacity is priced.
	Capacity float64 `json:"capacity_rps"`
	// Healthy is false for engines that must get no traffic at all (down,
	// draining, or suspect because their signals stopped).
	Healthy bool  `json:"healthy"`
	Curve   Curve `json:"curve"`
}

// Params are the knobs of the optimization. Build them with DefaultParams and
// override fields; Validate rejects values it cannot use instead of fixing them.
type Params struct {
	// RhoMax is the highest utilization the solver may plan, in (0, 1).
	RhoMax float64 `json:"rho_max"`
	// Segments is the number of linear pieces approximating each engine's
	// convex load cost, in [1, 64].
	Segments int `json:"segments"`
	// ShedCost is the price, in seconds, of not serving one request. Solve
	// raises it when needed to a bound above any routed request's marginal
	// cost (see Solution.Stats.ShedCost), so nothing is shed while any path
	// to spare capacity exists, whatever value is given here.
	ShedCost float64 `json:"shed_cost_seconds"`
	// MoveCost (μ) is the price, in seconds, of moving one req/s of a
	// (cluster, model) flow away from or onto an engine relative to
	// Problem.Prev: it stands for the KV-cache locality the move destroys.
	// Moving δ req/s from one engine to another costs 2μδ. Ignored when
	// Problem.Prev is nil.
	MoveCost float64 `json:"move_cost_seconds"`
	// FarMoveCost is added to MoveCost for moving flow onto an engine farther
	// from the cluster than its nearest engines for the model (RTT more than
	// farTolerance above the nearest's): the price of leaving home, not of
	// coming back. A flow that left for a far engine under load then returns
	// as soon as the latency it gains back pays MoveCost, where a symmetric
	// price would hold it away for good (the LP is myopic: it weighs a one-off
	// price against one period's gain). Ignored when Problem.Prev is nil.
	FarMoveCost float64 `json:"far_move_cost_seconds"`
}

// farTolerance is how much more RTT than a cluster's nearest engine for a model an engine
// may have and still count as near (FarMoveCost): a region's engines, not a hop away.
const farTolerance = 0.002

// DefaultParams returns the parameters the control server starts from.
//
// 32 segments, because coarse chords invent incentives: with 8, the slope
// jumps between neighbouring chords at low load exceed a 40 ms RTT, and
// demand noise of ±2 % made plans hop between breakpoints (the closed-loop
// test measures it). Column generation only brings the pieces next to each
// engine's load into the LP, so more segments cost little time. μ = 20 ms
// stands for the extra prefill a request pays on an engine without its
// prefix cached, times the chance it had one.
func DefaultParams() Params {
	return Params{RhoMax: 0.9, Segments: 32, ShedCost: 1000, MoveCost: 0.02}
}

// Validate reports the first unusable field, naming it.
func (p Params) Validate() error {
	switch {
	case !(p.RhoMax > 0 && p.RhoMax < 1):
		return fmt.Errorf("params.rho_max %v must be in (0, 1)", p.RhoMax)
	case p.Segments < 1 || p.Segments > maxSegments:
		return fmt.Errorf("params.segments %d must be in [1, %d]", p.Segments, maxSegments)
	case !(p.ShedCost > 0) || math.IsInf(p.ShedCost, 1):
		return fmt.Errorf("params.shed_cost_seconds %v must be finite and > 0", p.ShedCost)
	case !finiteNonNeg(p.MoveCost):
		return fmt.Errorf("params.move_cost_seconds %v must be finite and ≥ 0", p.MoveCost)
	case !finiteNonNeg(p.FarMoveCost):
		return fmt.Errorf("params.far_move_cost_seconds %v must be finite and ≥ 0", p.FarMoveCost)
	}
	return nil
}

const maxSegments = 64

// Problem is one period's routing decision: which share of each cluster's
// demand for each model goes to which engine. Solve does not modify it.
type Problem struct {
	// Clusters names the data-plane clusters (Envoy node ids).
	Clusters []string
	// Models names the models; Engine.Models and Demand index into it.
	Models  []string
	Engines []Engine
	// Demand[c][m] is cluster c's offered load for model m, in req/s.
	Demand [][]float64
	// RTT[c][e] is the network round trip from cluster c to engine e, in
	// seconds. +Inf forbids the pair (for example a policy boundary).
	RTT [][]float64
	// Prev is the previous period's solution, or nil. It is matched by
	// cluster, model and engine name, so fleets may change between periods,
	// and its flows are rescaled to this period's demand: the movement price
	// (Params.MoveCost) is paid for changing shares, not for volume.
	Prev   *Solution
	Params Params
}

// ErrInvalidProblem is wrapped by every error that Validate returns.
var ErrInvalidProblem = errors.New("invalid problem")

// Validate checks shapes, names and values, and returns an error wrapping
// ErrInvalidProblem that names the offending field.
func (p *Problem) Validate() error {
	if err := p.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidProblem, err)
	}
	return nil
}

func (p *Problem) validate() error {
	if err := p.Params.Validate(); err != nil {
		return err
	}
	if err := uniqueNames("clusters", p.Clusters); err != nil {
		return err
	}
	if err := uniqueNames("models", p.Models); err != nil {
		return err
	}
	names := make([]string, len(p.Engines))
	for e := range p.Engines {
		names[e] = p.Engines[e].Name
	}
	if err := uniqueNames("engines", names); err != nil {
		return err
	}
	for e := range p.Engines {
		if err := p.validateEngine(e); err != nil {
			return err
		}
	}
	if err := p.validateDemand(); err != nil {
		return err
	}
	return p.validateRTT()
}

func (p *Problem) validateEngine(e int) error {
	eng := &p.Engines[e]
	if !finiteNonNeg(eng.Capacity) {
		return fmt.Errorf("engines[%d] (%q).capacity %v must be finite and ≥ 0", e, eng.Name, eng.Capacity)
	}
	if err := eng.Curve.Validate(); err != nil {
		return fmt.Errorf("engines[%d] (%q).curve: %w", e, eng.Name, err)
	}
	seen := make(map[int]bool, len(eng.Models))
	for i, m := range eng.Models {
		if m < 0 || m >= len(p.Models) {
			return fmt.Errorf("engines[%d] (%q).models[%d] = %d is not an index into %d models", e, eng.Name, i, m, len(p.Models))
		}
		if seen[m] {
			return fmt.Errorf("engines[%d] (%q).models[%d] repeats model %q", e, eng.Name, i, p.Models[m])
		}
		seen[m] = true
	}
	return nil
}

func (p *Problem) validateDemand() error {
	if len(p.Demand) != len(p.Clusters) {
		return fmt.Errorf("demand has %d rows, want one per cluster (%d)", len(p.Demand), len(p.Clusters))
	}
	for c, row := range p.Demand {
		if len(row) != len(p.Models) {
			return fmt.Errorf("demand[%d] (%q) has %d entries, want one per model (%d)", c, p.Clusters[c], len(row), len(p.Models))
		}
		for m, d := range row {
			if !finiteNonNeg(d) {
				return fmt.Errorf("demand[%d][%d] (%q, %q) = %v req/s must be finite and ≥ 0", c, m, p.Clusters[c], p.Models[m], d)
			}
		}
	}
	return nil
}

func (p *Problem) validateRTT() error {
	if len(p.RTT) != len(p.Clusters) {
		return fmt.Errorf("rtt has %d rows, want one per cluster (%d)", len(p.RTT), len(p.Clusters))
	}
	for c, row := range p.RTT {
		if len(row) != len(p.Engines) {
			return fmt.Errorf("rtt[%d] (%q) has %d entries, want one per engine (%d)", c, p.Clusters[c], len(row), len(p.Engines))
		}
		for e, r := range row {
			if !(r >= 0) { // also rejects NaN; +Inf is allowed and forbids the pair
				return fmt.Errorf("rtt[%d][%d] (%q, %q) = %v s must be ≥ 0 or +Inf", c, e, p.Clusters[c], p.Engines[e].Name, r)
			}
		}
	}
	return nil
}

func uniqueNames(field string, names []string) error {
	seen := make(map[string]int, len(names))
	for i, n := range names {
		if n == "" {
			return fmt.Errorf("%s[%d] has an empty name", field, i)
		}
		if j, dup := seen[n]; dup {
			return fmt.Errorf("%s[%d] repeats the name %q of %s[%d]", field, i, n, field, j)
		}
		seen[n] = i
	}
	return nil
}

// usable reports whether engine e may receive any traffic at all.
func (p *Problem) usable(e int) bool {
	eng := &p.Engines[e]
	return eng.Healthy && eng.Capacity > 0
}
