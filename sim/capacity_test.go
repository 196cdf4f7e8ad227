package sim

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// prefillBoundConfig is one region with one engine that prefills 1000 tokens/s, fed
// evenly spaced 1000-token prompts with no shared prefix and one output token each: it
// serves at most about 1 request/s (less the 10 ms step overhead), and below that a
// request's TTFT is about 1 s. Its capacity at a 3 s TTFT SLO is therefore just under
// 1 request/s: above it the queue grows by the excess every second.
func prefillBoundConfig(t *testing.T) Config {
	t.Helper()
	var b strings.Builder
	for i := range 240 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1000, "output_length": 1, "hash_ids": [%d, %d]}`+"\n",
			i*1000, 2*i, 2*i+1)
	}
	reqs, err := trace.Read(strings.NewReader(b.String()), "t.jsonl", trace.FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	ecfg := engine.Config{MaxNumSeqs: 8, MaxBatchedTokens: 8192, BlockTokens: trace.BlockTokens,
		KVBlocks: 1000, PrefillTokensPerSec: 1000, ContextTokensPerSec: 1e9,
		StepBase: 10 * time.Millisecond, DecodeSeqCost: time.Millisecond}
	return Config{Trace: reqs, Regions: []string{"r0"}, EnginesPerRegion: 1, RTT: [][]time.Duration{{0}},
		Engine: ecfg, Load: 1, Scenario: Steady, Policies: []string{"round-robin"}, Seed: 1,
		Retries: 0, SLO: SLO{TTFTBase: 3 * time.Second, MaxITL: time.Second}}
}

func TestCapacitySearchFindsThePrefillBound(t *testing.T) {
	cc := DefaultCapacityConfig(prefillBoundConfig(t))
	cc.Policies, cc.Replicas, cc.Precision = []string{"round-robin", "least-request"}, 1, 0.02
	var runs int
	caps, err := RunCapacity(context.Background(), cc, func(CapacityProgress) { runs++ })
	if err != nil {
		t.Fatal(err)
	}
	if len(caps) != 2 {
		t.Fatalf("%d capacities for 2 policies", len(caps))
	}
	for _, c := range caps {
		if !c.Bracketed || c.CapacityRPS < 0.93 || c.CapacityRPS > 1.0 {
			t.Errorf("%s: capacity %.3f req/s (bracketed %v), want just under 1: %+v", c.Policy, c.CapacityRPS, c.Bracketed, c.Points)
		}
		if c.SLOAttainment < cc.Target || c.Deployment != "region" || c.Replicas != 1 {
			t.Errorf("%s: measured %+v", c.Policy, c)
		}
		// The point just above the capacity missed; every run was bounded.
		above := false
		for _, pt := range c.Points {
			if pt.Load > c.CapacityLoad && !pt.Pass && pt.Load <= c.CapacityLoad*(1+cc.Precision)+1e-9 {
				above = true
			}
		}
		// The search ends with one run at 0.9x the capacity, where the SLO holds.
		if b := c.Below; b == nil || math.Abs(b.Load-0.9*c.CapacityLoad) > 1e-9 || b.SLOAttainment < cc.Target || b.Shed != 0 {
			t.Errorf("%s: run below the capacity %+v, want one at 0.9 x %.3f meeting the SLO", c.Policy, b, c.CapacityLoad)
		}
		if !above || len(c.Points) > cc.MaxRuns {
			t.Errorf("%s: no failing rate within %v above the capacity, or too many runs: %+v", c.Policy, cc.Precision, c.Points)
		}
	}
	t.Logf("capacities %.3f %.3f", caps[0].CapacityRPS, caps[1].CapacityRPS)
	if runs != len(caps[0].Points)+len(caps[1].Points)+2 {
		t.Errorf("progress reported %d runs of %d", runs, len(caps[0].Points)+len(caps[1].Points)+2)
	}
}

func TestRunStopsOnceTheSLOIsOutOfReach(t *testing.T) {
	cfg := prefillBoundConfig(t)
	cfg.Load = 2 // twice what the engine can prefill
	full, _, err := Run(context.Background(), &cfg, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg.StopBelow = 0.9
	stopped, _, err := Run(context.Background(), &cfg, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := full[0]; r.Stopped || r.SLOAttainment >= 0.5 || r.Completed != r.Requests {
		t.Errorf("full overloaded run: %+v", r)
	}
	if r := stopped[0]; !r.Stopped || r.SLOAttainment >= 0.9 || r.SLOAttainment < full[0].SLOAttainment || r.Completed >= full[0].Completed {
		t.Errorf("stopped run: stopped %v, attainment %v (full %v), completed %d (full %d)",
			r.Stopped, r.SLOAttainment, full[0].SLOAttainment, r.Completed, full[0].Completed)
	}
	cfg.Load, cfg.StopBelow = 0.5, 0.9
	easy, _, err := Run(context.Background(), &cfg, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := easy[0]; r.Stopped || r.SLOAttainment != 1 {
		t.Errorf("half load: stopped %v, attainment %v, want all requests within the SLO", r.Stopped, r.SLOAttainment)
	}
}

func TestCapacityConfigValidate(t *testing.T) {
	cc := DefaultCapacityConfig(prefillBoundConfig(t))
	cc.Base.SLO = SLO{}
	cc.Policies = []string{"random"}
	cc.Deployments = []Deployment{"planet"}
	cc.Target, cc.Workers = 1.5, 0
	err := cc.Validate()
	for _, field := range []string{"Base.SLO", "Policies", "Deployments", "Target", "Workers"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("error %v does not name %s", err, field)
		}
	}
}

// TestSearchNarrowsWhereTheAttainmentCrossesTheTarget: between a passing and a failing
// run, the next rate is where the line through their attainments crosses the target,
// kept a precision step inside the bracket; the midpoint when the failing run stopped
// early or the bracket is within two steps.
func TestSearchNarrowsWhereTheAttainmentCrossesTheTarget(t *testing.T) {
	s := &search{c: &CapacityConfig{Target: 0.9, Precision: 0.03}}
	near := func(got, want float64) bool { return math.Abs(got/want-1) < 1e-9 }
	// 0.95 at 1 and 0.70 at 2: the line (in log rate) crosses 0.9 a fifth of the way.
	if got, want := s.inside(1, 2, 0.95, 0.70, true), math.Pow(2, 0.2); !near(got, want) {
		t.Errorf("inside = %v, want %v", got, want)
	}
	// A crossing just past the passing rate is held a step above it, one just short of
	// the failing rate a step below it.
	if got := s.inside(1, 2, 0.901, 0.5, true); !near(got, 1.03) {
		t.Errorf("a crossing next to lo: inside = %v, want 1.03", got)
	}
	if got := s.inside(1, 2, 0.99, 0.899, true); !near(got, 2/1.03) {
		t.Errorf("a crossing next to hi: inside = %v, want %v", got, 2/1.03)
	}
	// A failing run that stopped early states only a bound: bisect.
	if got := s.inside(1, 2, 0.95, 0.4, false); !near(got, math.Sqrt2) {
		t.Errorf("hi stopped: inside = %v, want the midpoint", got)
	}
	// Within two steps, the midpoint closes the bracket whatever its run says.
	if got := s.inside(1, 1.05, 0.95, 0.70, true); !near(got, math.Sqrt(1.05)) {
		t.Errorf("narrow bracket: inside = %v, want the midpoint", got)
	}
}

// TestCapacitySeedsPoolTheirRuns: with Seeds 2 a rate is judged by one run per seed, from
// Base.Seed up, their requests pooled; with Seeds 1 it is the run at Base.Seed as it was.
func TestCapacitySeedsPoolTheirRuns(t *testing.T) {
	base := prefillBoundConfig(t)
	// Two regions of one engine each: a seed redraws which region each conversation enters
	// through, so the two seeds' runs differ.
	base.Regions, base.RTT = []string{"r0", "r1"}, [][]time.Duration{{0, 0}, {0, 0}}
	cc := DefaultCapacityConfig(base)
	cc.Replicas, cc.Seeds = 1, 2
	s := &search{c: &cc, policy: "round-robin", dep: DeployRegion, sem: make(chan struct{}, 2)}
	ctx := context.Background()
	const load = 1.9
	var points []CapacityPoint
	s.onRun = func(pt CapacityPoint, _ time.Duration) { points = append(points, pt) }
	pooled, _, err := s.runAt(ctx, load)
	if err != nil {
		t.Fatal(err)
	}
	var one [2]Result
	for i := range one {
		if one[i], _, _, err = s.runSeed(ctx, load, base.Seed+uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if one[0].SLOAttainment == one[1].SLOAttainment && one[0].TTFTP90 == one[1].TTFTP90 {
		t.Fatalf("seeds %d and %d ran alike (%+v): the seed was not applied", base.Seed, base.Seed+1, one[0])
	}
	met := one[0].SLOAttainment*float64(one[0].Requests) + one[1].SLOAttainment*float64(one[1].Requests)
	if n := one[0].Requests + one[1].Requests; pooled.Requests != n || math.Abs(pooled.SLOAttainment-met/float64(n)) > 1e-12 {
		t.Errorf("pooled %d requests at attainment %v, want %d at %v", pooled.Requests, pooled.SLOAttainment, n, met/float64(n))
	}
	if want := (one[0].TTFTP90 + one[1].TTFTP90) / 2; math.Abs(pooled.TTFTP90-want) > 1e-9 {
		t.Errorf("pooled TTFT p90 %v, want the mean %v", pooled.TTFTP90, want)
	}
	if len(points) != 1 || points[0].SLOAttainment != pooled.SLOAttainment {
		t.Errorf("progress saw %+v, want one point at the pooled attainment", points)
	}
	// One seed: the run at Base.Seed, untouched.
	cc.Seeds = 1
	single, _, err := s.runAt(ctx, load)
	if err != nil {
		t.Fatal(err)
	}
	if single.SLOAttainment != one[0].SLOAttainment || single.Requests != one[0].Requests || single.TTFTP90 != one[0].TTFTP90 {
		t.Errorf("one seed: %+v, want the run at seed %d: %+v", single, base.Seed, one[0])
	}
	// A stopped run makes the pooled attainment a bound; the largest share step is kept.
	p := poolResults([]Result{{Requests: 10, SLOAttainment: 1, MaxShareStep: 0.1}, {Requests: 30, SLOAttainment: 0.2, Stopped: true, MaxShareStep: 0.3}})
	if !p.Stopped || p.MaxShareStep != 0.3 || math.Abs(p.SLOAttainment-0.4) > 1e-12 {
		t.Errorf("pooled %+v: want stopped, share step 0.3, attainment 0.4", p)
	}
	// Shed reasons, the scenario's event and the home-retention bands pool by request.
	p = poolResults([]Result{
		{Requests: 10, ShedReasons: map[string]int{"shed_quota": 2}, Event: EventResult{Requests: 4, SLOAttainment: 1, SLOGoodputRPS: 2},
			HomeRetention: []RetentionBucket{{WritesFrom: 0.25, WritesTo: 0.5, Requests: 1, PromptCached: 1, Returned: 1}}},
		{Requests: 10, ShedReasons: map[string]int{"shed_quota": 1, "too_large": 3}, Event: EventResult{Requests: 12, SLOAttainment: 0.5, SLOGoodputRPS: 4},
			HomeRetention: []RetentionBucket{{WritesFrom: 0, WritesTo: 0.25, Requests: 2, PromptCached: 1}, {WritesFrom: 0.25, WritesTo: 0.5, Requests: 3, PromptCached: 0.5}}},
	})
	if p.ShedReasons["shed_quota"] != 3 || p.ShedReasons["too_large"] != 3 {
		t.Errorf("pooled shed reasons %v, want shed_quota 3, too_large 3", p.ShedReasons)
	}
	if p.Event.Requests != 16 || math.Abs(p.Event.SLOAttainment-0.625) > 1e-12 || p.Event.SLOGoodputRPS != 3 {
		t.Errorf("pooled event %+v, want 16 requests, attainment 0.625, goodput 3", p.Event)
	}
	want := []RetentionBucket{{WritesFrom: 0, WritesTo: 0.25, Requests: 2, PromptCached: 1}, {WritesFrom: 0.25, WritesTo: 0.5, Requests: 4, PromptCached: 0.625, Returned: 0.25}}
	if !slices.Equal(p.HomeRetention, want) {
		t.Errorf("pooled retention %+v, want %+v", p.HomeRetention, want)
	}
	cc.Seeds = 0
	if err := cc.Validate(); err == nil || !strings.Contains(err.Error(), "Seeds") {
		t.Errorf("Seeds 0: %v, want an error naming Seeds", err)
	}
}
