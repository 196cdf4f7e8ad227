package solver

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// twoRegions is cluster "east" next to engine "e-east" and "west" next to
// "e-west", 40 ms apart, one model.
func twoRegions(demandEast, demandWest float64, curve Curve, capacity float64) *Problem {
	return &Problem{
		Clusters: []string{"east", "west"},
		Models:   []string{"m"},
		Engines: []Engine{
			{Name: "e-east", Models: []int{0}, Capacity: capacity, Healthy: true, Curve: curve},
			{Name: "e-west", Models: []int{0}, Capacity: capacity, Healthy: true, Curve: curve},
		},
		Demand: [][]float64{{demandEast}, {demandWest}},
		RTT:    [][]float64{{0.001, 0.041}, {0.041, 0.001}},
		Params: DefaultParams(),
	}
}

func mustSolve(t *testing.T, p *Problem) *Solution {
	t.Helper()
	sol, err := Solve(context.Background(), p)
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	return sol
}

// TestTwoRegionsStayLocal: with equal loads nothing is gained by crossing,
// so each region serves itself.
func TestTwoRegionsStayLocal(t *testing.T) {
	p := twoRegions(30, 30, Curve{Base: 0.1, Queue: 0.05}, 100)
	sol := mustSolve(t, p)
	want := [][]float64{{30, 0}, {0, 30}}
	for c := range want {
		for e := range want[c] {
			if got := sol.Flow[c][0][e]; math.Abs(got-want[c][e]) > 1e-6 {
				t.Errorf("flow %s→%s = %.6f, want %.6f", p.Clusters[c], p.Engines[e].Name, got, want[c][e])
			}
		}
	}
}

// marginalCost is d/dλ [λ·L(λ)] for the Curve model, derived by hand:
// L = B + Q·ρ/(1−ρ) gives B + Q·(ρ/(1−ρ) + ρ/(1−ρ)²).
func marginalCost(c Curve, load, capacity float64) float64 {
	rho := load / capacity
	return c.Base + c.Queue*(rho/(1-rho)+rho/((1-rho)*(1-rho)))
}

// TestFarEngineBeatsOverloadedNearOne checks "a farther engine can beat a
// nearby overloaded one" against the continuous optimum: east's demand is
// split where the marginal costs meet, RTT_near + C'(x) = RTT_far + C'(D−x),
// found here by bisection, independently of the solver. The LP's answer may
// differ from it only by the piecewise-linear resolution.
func TestFarEngineBeatsOverloadedNearOne(t *testing.T) {
	curve := Curve{Base: 0.1, Queue: 0.05}
	const capacity, demand = 100.0, 120.0
	p := twoRegions(demand, 0, curve, capacity)
	p.Params.Segments = 64
	sol := mustSolve(t, p)

	lo, hi := 0.0, demand
	for range 200 {
		x := (lo + hi) / 2
		near := 0.001 + marginalCost(curve, x, capacity)
		far := 0.041 + marginalCost(curve, demand-x, capacity)
		if near < far {
			lo = x
		} else {
			hi = x
		}
	}
	want := lo
	// The widest chord of 64 next to the optimum; the LP stops at a breakpoint.
	tol := capacity * p.Params.RhoMax * 2.0 / 64
	got := sol.Flow[0][0][0]
	if math.Abs(got-want) > tol {
		t.Fatalf("east→e-east = %.3f req/s, want %.3f ± %.3f (marginal costs equal)", got, want, tol)
	}
	if far := sol.Flow[0][0][1]; math.Abs(got+far-demand) > 1e-6 || far < 20 {
		t.Fatalf("east→e-west = %.3f req/s: the far engine must take the excess %.3f − %.3f", far, demand, got)
	}
	if s := sol.Shed[0][0]; s != 0 {
		t.Fatalf("shed %.6f req/s with spare capacity", s)
	}
}

// TestPiecewiseOptimumIsExact uses two segments so that the LP optimum is
// known exactly: the near engine's first chord is cheaper than the far
// engine's, its second is dearer, so the near engine fills to the first
// breakpoint ρ₁ = ρmax·(1 − (1 − 1/2)²) and the rest goes far.
func TestPiecewiseOptimumIsExact(t *testing.T) {
	curve := Curve{Base: 0.1, Queue: 0.05}
	const capacity, demand = 100.0, 100.0
	p := twoRegions(demand, 0, curve, capacity)
	p.Params.Segments = 2
	sol := mustSolve(t, p)
	bp := capacity * p.Params.RhoMax * 0.75
	// Chord slopes, by hand: Cost(λ)/λ on the first piece, then the secant.
	s1 := curve.Latency(bp, capacity)
	full := capacity * p.Params.RhoMax
	s2 := (full*curve.Latency(full, capacity) - bp*s1) / (full - bp)
	if !(0.001+s1 < 0.041+s1 && 0.041+s1 < 0.001+s2) {
		t.Fatalf("test premise broken: slopes %.4f %.4f", s1, s2)
	}
	if got := sol.Flow[0][0][0]; math.Abs(got-bp) > 1e-6 {
		t.Fatalf("near flow %.6f, want the first breakpoint %.6f", got, bp)
	}
	if got := sol.Flow[0][0][1]; math.Abs(got-(demand-bp)) > 1e-6 {
		t.Fatalf("far flow %.6f, want %.6f", got, demand-bp)
	}
}

func TestCapacityAndShed(t *testing.T) {
	tests := []struct {
		name        string
		utilization float64 // demand over Σ RhoMax·capacity
	}{
		{"light", 0.3},
		{"near full", 0.97},
		{"exactly full", 1.0},
		{"overloaded", 1.3},
		{"far overloaded", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := synthFleet{clusters: 8, engines: 24, models: 1, regions: 4, utilization: tt.utilization, seed: 3}
			p := f.problem()
			sol := mustSolve(t, p)
			totalCap, totalDemand, totalShed := 0.0, 0.0, 0.0
			for e, eng := range p.Engines {
				limit := eng.Capacity * p.Params.RhoMax
				totalCap += limit
				if sol.Load[e] > limit*(1+1e-7) {
					t.Errorf("engine %s load %.6f above ρmax·capacity %.6f", eng.Name, sol.Load[e], limit)
				}
			}
			for c := range p.Clusters {
				totalDemand += p.Demand[c][0]
				totalShed += sol.Shed[c][0]
				routed := 0.0
				for _, x := range sol.Flow[c][0] {
					routed += x
				}
				if d := p.Demand[c][0]; math.Abs(routed+sol.Shed[c][0]-d) > 1e-6*d {
					t.Errorf("cluster %d: routed %.6f + shed %.6f ≠ demand %.6f", c, routed, sol.Shed[c][0], d)
				}
			}
			wantShed := math.Max(0, totalDemand-totalCap)
			if math.Abs(totalShed-wantShed) > 1e-6*totalDemand {
				t.Fatalf("shed %.6f req/s, want exactly the excess %.6f", totalShed, wantShed)
			}
		})
	}
}

func TestUnhealthyAndZeroCapacityEnginesGetNothing(t *testing.T) {
	p := benchFleet(8, 32).problem()
	p.Engines[0].Healthy = false
	p.Engines[5].Healthy = false
	p.Engines[9].Capacity = 0
	prev := mustSolve(t, benchFleet(8, 32).problem()) // had flow on them
	p.Prev = prev
	sol := mustSolve(t, p)
	for _, e := range []int{0, 5, 9} {
		if sol.Load[e] != 0 {
			t.Errorf("engine %s load %v, want 0", p.Engines[e].Name, sol.Load[e])
		}
		for c := range p.Clusters {
			if w := sol.Weights(c, 0, 1000); w[e] != 0 {
				t.Errorf("cluster %d weight %d for engine %s, want it left out", c, w[e], p.Engines[e].Name)
			}
		}
	}
	if prev.Load[0] == 0 && prev.Load[5] == 0 {
		t.Fatal("test premise: the previous plan should have used the engines now down")
	}
}

// TestModelsAndEligibility: engines serve one or two of three models; flow
// for a model only reaches engines that serve it, and models linked by a
// shared engine are solved together.
func TestModelsAndEligibility(t *testing.T) {
	curve := Curve{Base: 0.1, Queue: 0.05}
	p := &Problem{
		Clusters: []string{"a", "b"},
		Models:   []string{"chat", "code", "embed"},
		Engines: []Engine{
			{Name: "chat-1", Models: []int{0}, Capacity: 50, Healthy: true, Curve: curve},
			{Name: "both-1", Models: []int{0, 1}, Capacity: 50, Healthy: true, Curve: curve},
			{Name: "code-1", Models: []int{1}, Capacity: 50, Healthy: true, Curve: curve},
			{Name: "embed-1", Models: []int{2}, Capacity: 10, Healthy: true, Curve: curve},
		},
		Demand: [][]float64{{30, 20, 5}, {10, 25, 12}},
		RTT:    [][]float64{{0.001, 0.01, 0.02, 0.001}, {0.02, 0.01, 0.001, 0.001}},
		Params: DefaultParams(),
	}
	sol := mustSolve(t, p)
	if sol.Stats.Components != 2 {
		t.Errorf("components = %d, want 2 (chat+code share both-1; embed alone)", sol.Stats.Components)
	}
	for c := range p.Clusters {
		for m := range p.Models {
			routed := 0.0
			for e, x := range sol.Flow[c][m] {
				routed += x
				if x > 0 && !serves(p.Engines[e], m) {
					t.Errorf("%s sends %s to %s, which does not serve it", p.Clusters[c], p.Models[m], p.Engines[e].Name)
				}
			}
			if d := p.Demand[c][m]; math.Abs(routed+sol.Shed[c][m]-d) > 1e-6 {
				t.Errorf("%s/%s: routed %.4f + shed %.4f ≠ %.4f", p.Clusters[c], p.Models[m], routed, sol.Shed[c][m], d)
			}
		}
	}
	// embed: 17 req/s offered, 9 req/s servable (ρmax 0.9 × 10).
	shed := sol.Shed[0][2] + sol.Shed[1][2]
	if math.Abs(shed-8) > 1e-6 {
		t.Errorf("embed shed %.6f, want 8", shed)
	}
	if sol.Shed[0][0]+sol.Shed[0][1]+sol.Shed[1][0]+sol.Shed[1][1] != 0 {
		t.Errorf("chat/code shed with spare capacity: %v", sol.Shed)
	}
}

func serves(e Engine, m int) bool {
	for _, x := range e.Models {
		if x == m {
			return true
		}
	}
	return false
}

func TestForbiddenPairGetsNothing(t *testing.T) {
	p := twoRegions(10, 10, Curve{Base: 0.1, Queue: 0.05}, 100)
	p.RTT[0][1] = math.Inf(1)
	p.Demand[0][0] = 150 // east alone cannot serve it, yet may not use west
	sol := mustSolve(t, p)
	if sol.Flow[0][0][1] != 0 {
		t.Fatalf("east→west = %v across a forbidden pair", sol.Flow[0][0][1])
	}
	if want := 150 - 90.0; math.Abs(sol.Shed[0][0]-want) > 1e-6 {
		t.Fatalf("east shed %.6f, want %.6f", sol.Shed[0][0], want)
	}
}

func TestDeterministic(t *testing.T) {
	p := synthFleet{clusters: 12, engines: 96, models: 2, regions: 4, utilization: 0.8, seed: 11}.problem()
	a := mustSolve(t, p)
	q := perturbed(p, 0.2, 5)
	q.Prev = a
	b1, b2 := mustSolve(t, q), mustSolve(t, q)
	a2 := mustSolve(t, p)
	for _, pair := range [][2]*Solution{{a, a2}, {b1, b2}} {
		x, y := *pair[0], *pair[1]
		x.Duration, y.Duration = 0, 0
		if !reflect.DeepEqual(x, y) {
			t.Fatal("two solves of the same problem differ")
		}
	}
}

// TestColumnGenerationMatchesFullLP: the fast path must reach the same
// optimum as one LP holding every route and piece.
func TestColumnGenerationMatchesFullLP(t *testing.T) {
	for _, f := range []synthFleet{
		{clusters: 6, engines: 40, models: 1, regions: 3, utilization: 0.7, seed: 1},
		{clusters: 10, engines: 60, models: 3, regions: 5, utilization: 0.9, seed: 2},
		{clusters: 8, engines: 50, models: 2, regions: 4, utilization: 1.2, seed: 3},
		{clusters: 16, engines: 128, models: 1, regions: 8, utilization: 0.6, seed: 4},
	} {
		p := f.problem()
		for _, prevCase := range []string{"none", "prev", "prev+far"} {
			withPrev := prevCase != "none"
			q := p
			if withPrev {
				q = perturbed(p, 0.3, f.seed)
				q.Prev = mustSolve(t, p)
			}
			if prevCase == "prev+far" {
				q.Params.FarMoveCost = 0.05
			}
			full, err := solve(context.Background(), q, options{method: dualSimplex, bigMethod: dualSimplex})
			if err != nil {
				t.Fatal(err)
			}
			// Also cut column generation short, so that the fallback (one LP
			// with every route after maxRounds) is exercised.
			cut := defaultOptions()
			cut.maxRounds = 1
			for name, o := range map[string]options{"default": defaultOptions(), "maxRounds=1": cut} {
				fast, err := solve(context.Background(), q, o)
				if err != nil {
					t.Fatal(err)
				}
				if d := math.Abs(fast.Objective - full.Objective); d > 1e-6*math.Abs(full.Objective) {
					t.Errorf("%+v %s %s: objective %.9g, full LP %.9g", f, prevCase, name, fast.Objective, full.Objective)
				}
			}
		}
	}
}

// TestPrevOptimumIsKept: when Prev is already optimal for the same demand,
// any other optimum would pay the movement price, so nothing moves.
func TestPrevOptimumIsKept(t *testing.T) {
	p := benchFleet(16, 64).problem()
	first := mustSolve(t, p)
	q := *p
	q.Prev = first
	second := mustSolve(t, &q)
	for c := range first.Flow {
		for e, x := range first.Flow[c][0] {
			if d := math.Abs(second.Flow[c][0][e] - x); d > 1e-6 {
				t.Fatalf("flow %d→%d moved by %.3g with unchanged demand", c, e, d)
			}
		}
	}
}

// TestMovementPenaltyLimitsChurn: after a demand change, the plan with a
// movement price moves less flow than the plan without one.
func TestMovementPenaltyLimitsChurn(t *testing.T) {
	p := benchFleet(16, 64).problem()
	first := mustSolve(t, p)
	moved := func(mu float64) float64 {
		q := perturbed(p, 0.15, 9)
		q.Prev = first
		q.Params.MoveCost = mu
		sol := mustSolve(t, q)
		total := 0.0
		for c := range sol.Flow {
			for e, x := range sol.Flow[c][0] {
				total += math.Abs(x - first.Flow[c][0][e])
			}
		}
		return total
	}
	free, priced := moved(0), moved(0.02)
	if !(priced < free) {
		t.Fatalf("moved %.3f req/s with μ = 0.02, %.3f with μ = 0: the penalty should reduce churn", priced, free)
	}
}

func TestWeights(t *testing.T) {
	p := synthFleet{clusters: 8, engines: 40, models: 1, regions: 2, utilization: 0.8, seed: 7}.problem()
	p.Demand[3][0] = 0
	sol := mustSolve(t, p)
	for c := range p.Clusters {
		for _, total := range []uint32{1, 7, 100, 1000} {
			w := sol.Weights(c, 0, total)
			sum, kept := uint32(0), 0
			for e, x := range w {
				sum += x
				if x > 0 {
					kept++
					if sol.Flow[c][0][e] == 0 && p.Demand[c][0] > 0 {
						t.Errorf("cluster %d total %d: engine %d weighted %d with no planned flow", c, total, e, x)
					}
				}
			}
			if kept == 0 {
				t.Fatalf("cluster %d total %d: no engine kept", c, total)
			}
			if sum != total {
				t.Errorf("cluster %d: weights %v sum to %d, want %d", c, w, sum, total)
			}
		}
	}
	if fb := sol.Fallback[3][0]; fb < 0 || sol.Weights(3, 0, 100)[fb] != 100 {
		t.Errorf("zero-demand cluster: fallback %d, weights %v", fb, sol.Weights(3, 0, 100))
	}
}

func TestQuantize(t *testing.T) {
	tests := []struct {
		flows []float64
		total uint32
		want  []uint32
	}{
		{[]float64{1, 1, 1}, 3, []uint32{1, 1, 1}},
		{[]float64{1, 1, 1}, 100, []uint32{34, 33, 33}},
		{[]float64{10, 0.001, 5}, 100, []uint32{67, 0, 33}},
		{[]float64{0.6, 0.6, 98.8}, 100, []uint32{1, 1, 98}},
		{[]float64{0.6, 0.6, 0.6, 98.2}, 100, []uint32{1, 1, 1, 97}},
		{[]float64{1, 1, 1, 1}, 2, []uint32{1, 1, 0, 0}},
		{[]float64{1, 2, 1, 1}, 1, []uint32{0, 1, 0, 0}},
		{[]float64{0.2, 0.3, 0.2}, 1, []uint32{0, 1, 0}},
	}
	for _, tt := range tests {
		sum := 0.0
		for _, f := range tt.flows {
			sum += f
		}
		got := make([]uint32, len(tt.flows))
		quantize(tt.flows, sum, tt.total, got)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("quantize(%v, %d) = %v, want %v", tt.flows, tt.total, got, tt.want)
		}
	}
}

func TestShedFraction(t *testing.T) {
	p := twoRegions(200, 0, Curve{Base: 0.1, Queue: 0.05}, 50)
	sol := mustSolve(t, p)
	if got, want := sol.ShedFraction(0, 0), (200-90.0)/200; math.Abs(got-want) > 1e-9 {
		t.Errorf("east shed fraction %.6f, want %.6f", got, want)
	}
	if got := sol.ShedFraction(1, 0); got != 0 {
		t.Errorf("west (no demand) shed fraction %v, want 0", got)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(p *Problem)
		want   string
	}{
		{"rho", func(p *Problem) { p.Params.RhoMax = 1 }, "params.rho_max"},
		{"segments", func(p *Problem) { p.Params.Segments = 0 }, "params.segments"},
		{"shed cost", func(p *Problem) { p.Params.ShedCost = math.NaN() }, "params.shed_cost_seconds"},
		{"move cost", func(p *Problem) { p.Params.MoveCost = -1 }, "params.move_cost_seconds"},
		{"dup cluster", func(p *Problem) { p.Clusters[1] = "east" }, `clusters[1] repeats the name "east"`},
		{"empty engine", func(p *Problem) { p.Engines[0].Name = "" }, "engines[0] has an empty name"},
		{"capacity", func(p *Problem) { p.Engines[1].Capacity = math.Inf(1) }, `engines[1] ("e-west").capacity`},
		{"curve", func(p *Problem) { p.Engines[0].Curve.Queue = -1 }, `engines[0] ("e-east").curve: queue`},
		{"model index", func(p *Problem) { p.Engines[0].Models = []int{3} }, "models[0] = 3 is not an index"},
		{"demand rows", func(p *Problem) { p.Demand = p.Demand[:1] }, "demand has 1 rows"},
		{"demand value", func(p *Problem) { p.Demand[1][0] = -2 }, `demand[1][0] ("west", "m")`},
		{"rtt width", func(p *Problem) { p.RTT[0] = p.RTT[0][:1] }, `rtt[0] ("east") has 1 entries`},
		{"rtt nan", func(p *Problem) { p.RTT[1][0] = math.NaN() }, `rtt[1][0] ("west", "e-east")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := twoRegions(1, 1, Curve{Base: 0.1}, 10)
			tt.modify(p)
			_, err := Solve(context.Background(), p)
			if !errors.Is(err, ErrInvalidProblem) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want ErrInvalidProblem mentioning %q", err, tt.want)
			}
		})
	}
}

func TestContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Solve(ctx, benchFleet(4, 16).problem()); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: error %v, want context.Canceled", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := Solve(ctx, benchFleet(64, 1024).problem()); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("1 ms deadline: error %v, want context.DeadlineExceeded", err)
	}
}

func TestEmptyAndUnservable(t *testing.T) {
	empty := &Problem{Params: DefaultParams()}
	if sol := mustSolve(t, empty); len(sol.Flow) != 0 || sol.Objective != 0 {
		t.Errorf("empty problem: %+v", sol)
	}
	// A model nobody serves: all of it is shed, and there is no fallback.
	p := twoRegions(5, 0, Curve{Base: 0.1}, 10)
	p.Models = append(p.Models, "orphan")
	p.Demand = [][]float64{{5, 3}, {0, 0}}
	sol := mustSolve(t, p)
	if sol.Shed[0][1] != 3 || sol.Fallback[0][1] != -1 || sol.ShedFraction(0, 1) != 1 {
		t.Errorf("orphan model: shed %v fallback %v", sol.Shed[0][1], sol.Fallback[0][1])
	}
	if w := sol.Weights(0, 1, 100); !reflect.DeepEqual(w, []uint32{0, 0}) {
		t.Errorf("orphan model weights %v, want none", w)
	}
}

// TestSolutionJSON: the control server serves solutions as JSON, which
// cannot hold ±Inf or NaN: full engines must not produce them.
func TestSolutionJSON(t *testing.T) {
	p := twoRegions(300, 10, Curve{Base: 0.1, Queue: 0.05}, 50)
	sol := mustSolve(t, p)
	if _, err := json.Marshal(sol); err != nil {
		t.Fatalf("marshal: %v", err)
	}
	if sol.Marginal[0] != sol.Stats.ShedCost {
		t.Errorf("a full engine's marginal cost %v, want the shed price %v", sol.Marginal[0], sol.Stats.ShedCost)
	}
}

// TestStallEndsTheSearch: on a next-period problem whose column generation
// tails off into rounds that each gain almost nothing, the stall rule stops
// early, and the plan costs what the search run to the end costs (1e-6).
func TestStallEndsTheSearch(t *testing.T) {
	q, exact := noStallProblem(t, 64, 1024, 1)
	fast, err := solve(context.Background(), q, defaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	full, err := solve(context.Background(), q, exact)
	if err != nil {
		t.Fatal(err)
	}
	if fast.Stats.Stalled == 0 || fast.Stats.Rounds >= full.Stats.Rounds {
		t.Fatalf("stall rule did not end the search early: %d stalled, %d rounds against %d", fast.Stats.Stalled, fast.Stats.Rounds, full.Stats.Rounds)
	}
	if d := math.Abs(fast.Objective - full.Objective); d > 1e-6*math.Abs(full.Objective) {
		t.Fatalf("stalled objective %.9g, searched to the end %.9g", fast.Objective, full.Objective)
	}
}
