package optimizer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/signals"
	"github.com/meridian-router/meridian/control/solver"
	"github.com/meridian-router/meridian/policy"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// Config configures the optimizer.
type Config struct {
	Params solver.Params
	// DefaultCurve is each engine's latency curve until one is fitted from observations.
	DefaultCurve solver.Curve
	// WeightTotal is what each (node, model)'s EDS weights sum to.
	WeightTotal uint32
	// MinShareChange is the smallest change of any engine's share of a (node, model) flow
	// that is worth publishing. The default, 0.05, was measured against 0.02 on the
	// simulator's traces (docs/results/README.md, "The latest round"): republishing for
	// smaller moves moved keys off the engines that cache them for no gain in balance.
	MinShareChange float64
	// MaxShareStep is the most any engine's share of a (node, model) flow moves in one
	// period while every engine that had a share is still eligible and not suspect: a
	// larger move of the LP's solution is published as the fraction of it that moves no
	// share further than this, and the rest follows in later periods. An LP solution sits
	// on a vertex and jumps between near-equal engines when demand is noisy; the limit
	// turns those jumps into steps the engines' caches and the sidecars' bounded loads can
	// follow. An engine that turns ineligible or suspect is dropped at once, unlimited.
	// 1 disables the limit.
	MaxShareStep float64
	// ProbeDemand stands in for a (node, model) demand of zero, in req/s, so that every
	// node still gets the split it would get for its first requests.
	ProbeDemand float64
	// RetryBudget is sent to every sidecar in its policy; it replaces the sidecar's own
	// retry curve from the first policy on (meridian-control's --retry-* flags).
	RetryBudget policy.RetryCurve
	// SolveTimeout bounds one solve.
	SolveTimeout time.Duration
	// ShedBacklog, when > 0, holds the LP's shed fraction back from a node until the
	// engines its flow uses hold this much queue: their waiting requests at the last
	// scrape (vllm:num_requests_waiting), flow-weighted, in seconds of their capacity
	// (waiting / (capacity × penalty)). The LP sheds whatever smoothed demand exceeds
	// RhoMax × capacity, bursts included; with a backlog required, a burst the engines'
	// queues absorb is served, and demand they cannot hold is shed once it queues. A node
	// whose engines' queues are not known (last scrape failed or stale, or no
	// vllm:num_requests_waiting) gets the LP's fraction as is. 0 (the default) sends the
	// fraction whenever the LP sheds. Engines that admit every request into their running
	// batch (chunked prefill, a large max_num_seqs) never queue: their overload shows as
	// a growing batch and inter-token latency, which this does not see.
	ShedBacklog time.Duration
}

// DefaultConfig is the control server's default.
func DefaultConfig() Config {
	params := solver.DefaultParams()
	// The move cost is paid once, in the period a flow moves, while the latency gained is
	// earned every period after. Moving δ req/s costs 2μδ, so a flow returns to an engine
	// RTT r closer only when 2μ < r: μ = 5 ms lets a 10 ms RTT gain win, and still damps
	// moves that chase noise.
	params.MoveCost = 0.005
	return Config{
		Params:         params,
		DefaultCurve:   solver.Curve{Base: 0.2, Queue: 0.2},
		WeightTotal:    1000,
		MinShareChange: 0.05,
		MaxShareStep:   0.1,
		ProbeDemand:    0.01,
		RetryBudget:    policy.DefaultRetryCurve(),
		SolveTimeout:   5 * time.Second,
	}
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	if err := c.Params.Validate(); err != nil {
		return err
	}
	if err := c.DefaultCurve.Validate(); err != nil {
		return fmt.Errorf("default curve: %w", err)
	}
	if err := c.RetryBudget.Validate("retry_budget"); err != nil {
		return err
	}
	switch {
	case c.WeightTotal < 10:
		return fmt.Errorf("weight total %d must be >= 10", c.WeightTotal)
	case !(c.MinShareChange >= 0 && c.MinShareChange < 1):
		return fmt.Errorf("min share change %v must be in [0, 1)", c.MinShareChange)
	case !(c.MaxShareStep > 0 && c.MaxShareStep <= 1):
		return fmt.Errorf("max share step %v must be in (0, 1] (1: no limit)", c.MaxShareStep)
	case !(c.ProbeDemand > 0):
		return fmt.Errorf("probe demand %v must be > 0", c.ProbeDemand)
	case c.SolveTimeout <= 0:
		return errors.New("solve timeout must be > 0")
	case c.ShedBacklog < 0:
		return fmt.Errorf("shed backlog %v must be >= 0 (0: shed whenever the plan does)", c.ShedBacklog)
	}
	return nil
}

// Inputs are what the fleet reported, as of one instant.
type Inputs struct {
	// Demand[node][model] in req/s.
	Demand map[string]map[string]float64
	// Engines by name; engines missing here get the defaults (no penalty, default curve).
	Engines map[string]EngineInput
}

// EngineInput is what is known of one engine.
type EngineInput struct {
	// Curve is the fitted latency curve, or nil for the default.
	Curve *solver.Curve
	// Suspect engines stopped reporting: they get no traffic rather than being mistaken for idle.
	Suspect bool
	// Penalty in (0, 1] scales the engine's capacity (sidecars' outlier penalties).
	Penalty float64
	// Waiting is the engine's queue at its last scrape, vllm:num_requests_waiting,
	// when WaitingKnown: its last scrape succeeded, is fresh and has the metric.
	Waiting      float64
	WaitingKnown bool
	// ClassHitRate is the share of prompt tokens the prefix caches of the engine's class
	// served lately (signals.EngineState.ClassHitRate): with the fleet's prefill_share it
	// credits the engine's capacity with what its cache saves (see Optimizer.capacity).
	ClassHitRate float64
}

// InputsFrom takes what control/signals aggregated (smoothed demand, fitted curves,
// suspect engines, penalties) as the optimizer's inputs.
func InputsFrom(snap signals.Snapshot) Inputs {
	in := Inputs{Demand: snap.Demand, Engines: make(map[string]EngineInput, len(snap.Engines))}
	for name, st := range snap.Engines {
		ei := EngineInput{Suspect: st.Suspect, Penalty: st.Penalty, Waiting: st.LastWaiting, ClassHitRate: st.ClassHitRate,
			WaitingKnown: st.State == signals.OK && st.LastError == "" && !slices.Contains(st.Missing, waitingMetric)}
		if st.Fitted {
			c := st.Curve
			ei.Curve = &c
		}
		in.Engines[name] = ei
	}
	return in
}

// waitingMetric is the vLLM signal behind EngineInput.Waiting.
const waitingMetric = "vllm:num_requests_waiting"

// Result is one period's outcome.
type Result struct {
	Solution *solver.Solution
	// Weights[node][model][engine] is the split in force (published now or earlier).
	Weights map[string]map[string]map[string]uint32
	// Changed reports that Weights differ from the previous period's.
	Changed bool
	// Policies[node] is what the node's sidecars should enforce.
	Policies map[string]*meridianv1.Policy
}

// ShedFraction is the share of node's demand for model that its policy tells the sidecars
// to shed: the LP's, unless Config.ShedBacklog holds it back.
func (r *Result) ShedFraction(node, model string) float64 {
	for _, s := range r.Policies[node].GetShed() {
		if s.GetModel() == model {
			return s.GetFraction()
		}
	}
	return 0
}

// ShedRPS is the rate, in req/s, the policies tell the sidecars to shed.
func (r *Result) ShedRPS() float64 {
	total := 0.0
	for c, node := range r.Solution.Clusters {
		for m, model := range r.Solution.Models {
			total += r.ShedFraction(node, model) * r.Solution.Demand[c][m]
		}
	}
	return total
}

// Optimizer keeps the state carried between periods.
type Optimizer struct {
	cfg     Config
	prev    *solver.Solution
	weights map[string]map[string]map[string]uint32
	seq     uint64
}

// New returns an optimizer.
func New(cfg Config) (*Optimizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Optimizer{cfg: cfg}, nil
}

// Step solves one period. Nodes with static weights in the fleet file are left to them:
// they appear in the problem (their demand loads the engines) but their weights are not
// replaced.
func (o *Optimizer) Step(ctx context.Context, f *fleet.Fleet, in Inputs) (*Result, error) {
	p := o.problem(f, in)
	ctx, cancel := context.WithTimeout(ctx, o.cfg.SolveTimeout)
	defer cancel()
	sol, err := solver.Solve(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("solve: %w", err)
	}
	o.prev = sol
	next := o.quantize(f, p, sol, in)
	if o.weights != nil && o.cfg.MaxShareStep < 1 {
		o.limitSteps(f, in, next)
	}
	changed := o.weights == nil || movedMoreThan(o.weights, next, o.cfg.MinShareChange)
	if changed {
		o.weights = next
		o.seq++
	} else if trimmed := withoutEnded(o.weights, next); trimmed != nil {
		o.weights, changed = trimmed, true
		o.seq++
	}
	return &Result{Solution: sol, Weights: o.weights, Changed: changed, Policies: o.policies(f, sol, in)}, nil
}

func (o *Optimizer) problem(f *fleet.Fleet, in Inputs) *solver.Problem {
	p := &solver.Problem{Params: o.cfg.Params, Prev: o.prev}
	modelIdx := map[string]int{}
	for i, m := range f.Models {
		p.Models = append(p.Models, m.Name)
		modelIdx[m.Name] = i
	}
	for _, c := range f.Clusters {
		p.Clusters = append(p.Clusters, c.Name)
		row := make([]float64, len(p.Models))
		for i, m := range p.Models {
			row[i] = in.Demand[c.Name][m]
			if row[i] <= 0 {
				row[i] = o.cfg.ProbeDemand
			}
		}
		p.Demand = append(p.Demand, row)
		rtt := make([]float64, len(f.Engines))
		for e, eng := range f.Engines {
			rtt[e] = f.RTTSeconds(c.Name, eng)
		}
		p.RTT = append(p.RTT, rtt)
	}
	for _, e := range f.Engines {
		ei, known := in.Engines[e.Name]
		curve := o.cfg.DefaultCurve
		if known && ei.Curve != nil {
			curve = *ei.Curve
		}
		penalty := 1.0
		if known && ei.Penalty > 0 && ei.Penalty < 1 {
			penalty = ei.Penalty
		}
		se := solver.Engine{Name: e.Name, Capacity: o.capacity(f, e, in) * penalty, Healthy: !e.Draining && !(known && ei.Suspect), Curve: curve}
		for _, m := range e.Models {
			se.Models = append(se.Models, modelIdx[m])
		}
		p.Engines = append(p.Engines, se)
	}
	p.Params.FarMoveCost = max(p.Params.FarMoveCost, o.cacheMovePrice(f, in))
	return p
}

// cacheMovePrice is what moving one request to an engine that lacks its cached prefix
// costs it, in seconds: the prefill the engine must redo, which is the share of prompt
// tokens the fleet's prefix caches serve (the engines' class hit rates, averaged over the
// fleet) of a request's latency at no load (the default curve's base, --default-latency).
// The plan prices leaving a node's nearest engines for farther ones at least this much
// on top of MoveCost (solver.Params.FarMoveCost): a flow leaves home only for a latency
// gain that outweighs the cache it leaves behind, not for every wobble of demand between
// regions, and comes back at MoveCost once the reason to leave is gone. With no prefix
// caching (or before any prompt was asked of the caches) it is 0.
func (o *Optimizer) cacheMovePrice(f *fleet.Fleet, in Inputs) float64 {
	if len(f.Engines) == 0 {
		return 0
	}
	h := 0.0
	for _, e := range f.Engines {
		h += min(max(in.Engines[e.Name].ClassHitRate, 0), 1)
	}
	return o.cfg.DefaultCurve.Base * h / float64(len(f.Engines))
}

// capacity is the request rate the plan gives engine e before penalties: its capacity_rps,
// which the fleet file states for requests that find nothing of their prompt cached,
// credited with what its class's prefix caches save. A hit rate h on prompt tokens saves
// h of the prefill, which takes the share p (Fleet.PrefillShare) of a cold request's
// engine time, so the engine serves capacity_rps / (1 - p·h) requests/s. With no share
// set, or before any prompt was asked of the class's caches, it is capacity_rps.
func (o *Optimizer) capacity(f *fleet.Fleet, e fleet.Engine, in Inputs) float64 {
	p := f.PrefillShare(e)
	h := min(max(in.Engines[e.Name].ClassHitRate, 0), 1)
	return e.CapacityRPS / (1 - p*h)
}

// probeTolerance is how much dearer than the best (RTT + marginal latency) an engine may be
// and still share the traffic of a node and model with no demand yet: the engines of one
// region, not those a network hop away.
const probeTolerance = 0.002

// quantize turns the solution into weights for every node without static weights. A
// (node, model) with no demand yet is spread over its best engines (SpreadWeights), so
// that its first requests do not all land on the one engine the LP's stand-in flow chose.
func (o *Optimizer) quantize(f *fleet.Fleet, p *solver.Problem, sol *solver.Solution, in Inputs) map[string]map[string]map[string]uint32 {
	out := map[string]map[string]map[string]uint32{}
	for c, node := range sol.Clusters {
		if _, static := f.Weights[node]; static {
			continue
		}
		out[node] = map[string]map[string]uint32{}
		for m, model := range sol.Models {
			var w []uint32
			if in.Demand[node][model] > 0 {
				w = sol.Weights(c, m, o.cfg.WeightTotal)
			} else {
				w = sol.SpreadWeights(p, c, m, probeTolerance, o.cfg.WeightTotal)
			}
			ws := map[string]uint32{}
			for e, v := range w {
				// Engines that may serve the pair but get no share stay as failovers (0).
				if v > 0 || eligible(f, sol.Engines[e], model) {
					ws[sol.Engines[e]] = v
				}
			}
			out[node][model] = ws
		}
	}
	return out
}

// limitSteps replaces each (node, model) split in next that moves some share by more than
// Config.MaxShareStep from the one in force by the point on the way to it that moves no
// share further, unless an engine with a share in force is no longer eligible or is
// suspect (then the solution applies at once).
func (o *Optimizer) limitSteps(f *fleet.Fleet, in Inputs, next map[string]map[string]map[string]uint32) {
	for node, models := range next {
		for model, nw := range models {
			pw, ok := o.weights[node][model]
			if !ok || len(pw) != len(nw) {
				continue
			}
			ps, ns := sum(pw), sum(nw)
			if ps == 0 || ns == 0 {
				continue
			}
			step, safe := 0.0, true
			for e, v := range pw {
				nv, ok := nw[e]
				if !ok || (v > 0 && (!eligible(f, e, model) || in.Engines[e].Suspect)) {
					safe = false
					break
				}
				step = max(step, math.Abs(share(nv, ns)-share(v, ps)))
			}
			if !safe || step <= o.cfg.MaxShareStep {
				continue
			}
			a := o.cfg.MaxShareStep / step
			limited := make(map[string]uint32, len(nw))
			for e, v := range pw {
				sp := share(v, ps)
				limited[e] = uint32(math.Round((sp + a*(share(nw[e], ns)-sp)) * float64(o.cfg.WeightTotal)))
			}
			if sum(limited) > 0 {
				models[model] = limited
			}
		}
	}
}

func eligible(f *fleet.Fleet, engine, model string) bool {
	e, ok := f.Engine(engine)
	return ok && !e.Draining && e.Serves(model)
}

// withoutEnded returns the weights in force with every share that next ends taken away
// (and nothing else changed), or nil when next ends none. Below MinShareChange, a share's
// end is not worth adopting the rest of next for (its other moves are as small), but the
// sliver must not stay for good: a spill left behind once demand went home, or a share on
// an engine that turned ineligible or suspect, which must get nothing.
func withoutEnded(cur, next map[string]map[string]map[string]uint32) map[string]map[string]map[string]uint32 {
	var out map[string]map[string]map[string]uint32
	copied := map[string]bool{} // nodes of out that are copies (cur is in force, read by others)
	for node, models := range cur {
		for model, cw := range models {
			var trimmed map[string]uint32
			for e, v := range cw {
				if v > 0 && next[node][model][e] == 0 {
					if trimmed == nil {
						trimmed = maps.Clone(cw)
					}
					trimmed[e] = 0
				}
			}
			if trimmed == nil || sum(trimmed) == 0 {
				continue
			}
			if out == nil {
				out = maps.Clone(cur)
			}
			if !copied[node] {
				out[node], copied[node] = maps.Clone(cur[node]), true
			}
			out[node][model] = trimmed
		}
	}
	return out
}

// movedMoreThan reports whether any engine's share of any (node, model) differs by more
// than threshold between a and b, or the engines listed differ. An engine whose share
// turns from nothing to less than threshold, or from that to nothing, does not count:
// the LP's spill to a far region comes and goes in such slivers as demand wobbles, and
// each one republished every node's weights and moved keys (withoutEnded takes a sliver
// away alone).
func movedMoreThan(a, b map[string]map[string]map[string]uint32, threshold float64) bool {
	if len(a) != len(b) {
		return true
	}
	for node, am := range a {
		bm, ok := b[node]
		if !ok || len(am) != len(bm) {
			return true
		}
		for model, aw := range am {
			bw, ok := bm[model]
			if !ok {
				return true
			}
			as, bs := sum(aw), sum(bw)
			for e := range union(aw, bw) {
				_, inA := aw[e]
				_, inB := bw[e]
				if inA != inB || math.Abs(share(aw[e], as)-share(bw[e], bs)) > threshold {
					return true
				}
			}
		}
	}
	return false
}

func sum(w map[string]uint32) float64 {
	s := 0.0
	for _, v := range w {
		s += float64(v)
	}
	return s
}

func share(v uint32, total float64) float64 {
	if total == 0 {
		return 0
	}
	return float64(v) / total
}

func union(a, b map[string]uint32) map[string]struct{} {
	u := make(map[string]struct{}, len(a)+len(b))
	for k := range a {
		u[k] = struct{}{}
	}
	for k := range b {
		u[k] = struct{}{}
	}
	return u
}

// policies derives each node's shed fractions and planned utilization. The LP's shed
// fraction for a (node, model) is sent only while the engines its flow uses hold a backlog
// (Config.ShedBacklog); the planned utilization says demand exceeds capacity either way,
// so the retry budget still closes.
func (o *Optimizer) policies(f *fleet.Fleet, sol *solver.Solution, in Inputs) map[string]*meridianv1.Policy {
	capacity := map[string]float64{}
	for _, e := range f.Engines {
		capacity[e.Name] = o.capacity(f, e, in)
	}
	out := map[string]*meridianv1.Policy{}
	budget := o.cfg.RetryBudget.Proto()
	for c, node := range sol.Clusters {
		p := &meridianv1.Policy{RetryBudget: budget}
		var flow, util float64
		over := false
		for m, model := range sol.Models {
			if fr := sol.ShedFraction(c, m); fr > 1e-6 {
				over = true
				if o.cfg.ShedBacklog <= 0 || o.backlog(sol, c, m, capacity, in) >= o.cfg.ShedBacklog.Seconds() {
					p.Shed = append(p.Shed, &meridianv1.ModelShed{Model: model, Fraction: fr})
				}
			}
			for e, x := range sol.Flow[c][m] {
				if x > 0 && capacity[sol.Engines[e]] > 0 {
					flow += x
					util += x * sol.Load[e] / capacity[sol.Engines[e]]
				}
			}
		}
		if flow > 0 {
			p.Utilization = util / flow // flow-weighted utilization of the engines this node uses
		}
		if over {
			p.Utilization = math.Max(p.Utilization, 1) // demand exceeds capacity
		}
		p.Version = policyVersion(p)
		out[node] = p
	}
	return out
}

// backlog is the queued work, in seconds of capacity, that the engines cluster c's flow of
// model m uses hold (flow-weighted): +Inf when some queue is not known.
func (o *Optimizer) backlog(sol *solver.Solution, c, m int, capacity map[string]float64, in Inputs) float64 {
	var flow, queued float64
	for e, x := range sol.Flow[c][m] {
		if x <= 0 {
			continue
		}
		name := sol.Engines[e]
		ei, known := in.Engines[name]
		engCap := capacity[name]
		if known && ei.Penalty > 0 && ei.Penalty < 1 {
			engCap *= ei.Penalty
		}
		if !known || !ei.WaitingKnown || engCap <= 0 {
			return math.Inf(1)
		}
		flow += x
		queued += x * ei.Waiting / engCap
	}
	if flow <= 0 {
		return math.Inf(1)
	}
	return queued / flow
}

// policyVersion fingerprints a policy so that sidecars only see a change when there is one.
func policyVersion(p *meridianv1.Policy) string {
	s := fmt.Sprintf("u%.3f", p.Utilization)
	for _, m := range p.Shed {
		s += fmt.Sprintf("|%s:%.3f", m.Model, m.Fraction)
	}
	return s
}
