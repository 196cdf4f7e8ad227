package optimizer

import (
	"context"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/signals"
)

const twoRegions = `
models: [{name: m}]
clusters: [{name: region-a, region: a}, {name: region-b, region: b}]
engines:
  - {name: a-0, address: "127.0.0.1:8001", region: a, models: [m], capacity_rps: 10}
  - {name: a-1, address: "127.0.0.1:8002", region: a, models: [m], capacity_rps: 10}
  - {name: b-0, address: "127.0.0.1:8003", region: b, models: [m], capacity_rps: 10}
  - {name: b-1, address: "127.0.0.1:8004", region: b, models: [m], capacity_rps: 10}
rtt_ms: {region-a: {a: 1, b: 40}, region-b: {a: 40, b: 1}}
`

func mustFleet(t *testing.T, y string) *fleet.Fleet {
	t.Helper()
	f, err := fleet.Parse("fleet.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func shareOf(w map[string]uint32, engines ...string) float64 {
	var in, all float64
	for e, v := range w {
		all += float64(v)
		for _, x := range engines {
			if e == x {
				in += float64(v)
			}
		}
	}
	return in / all
}

func demand(a, b float64) Inputs {
	return Inputs{Demand: map[string]map[string]float64{"region-a": {"m": a}, "region-b": {"m": b}}}
}

func TestLocalUntilOverloadedThenSpillsToFarRegion(t *testing.T) {
	f := mustFleet(t, twoRegions)
	cfg := DefaultConfig()
	cfg.MaxShareStep = 1 // the LP's own split; TestShareStepsAreLimited covers the limit
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := o.Step(ctx, f, demand(4, 4))
	if err != nil {
		t.Fatal(err)
	}
	if s := shareOf(res.Weights["region-a"]["m"], "a-0", "a-1"); s != 1 {
		t.Fatalf("light load: region-a sends %.2f locally, want all of it", s)
	}
	// Region-a's demand exceeds its engines' 2×10×0.9 = 18 req/s: the excess must cross.
	res, err = o.Step(ctx, f, demand(26, 4))
	if err != nil {
		t.Fatal(err)
	}
	far := shareOf(res.Weights["region-a"]["m"], "b-0", "b-1")
	if far < 0.25 || far > 0.45 {
		t.Fatalf("region-a at 26 req/s sends %.2f to region-b; at least the 8/26 excess over ρmax·capacity must go", far)
	}
	if !res.Changed {
		t.Fatal("a large shift did not count as a change")
	}
	for e, l := range res.Solution.Load {
		if l > 9.0001 {
			t.Fatalf("engine %s planned at %.2f req/s > ρmax·capacity 9", res.Solution.Engines[e], l)
		}
	}
	if len(res.Policies["region-a"].GetShed()) != 0 {
		t.Fatal("shed while total capacity covers demand")
	}
	if u := res.Policies["region-a"].GetUtilization(); u < 0.5 || u > 1 {
		t.Fatalf("region-a planned utilization %.2f", u)
	}
}

func TestShedsOnlyTheExcess(t *testing.T) {
	f := mustFleet(t, twoRegions)
	o, _ := New(DefaultConfig())
	// Capacity at ρmax is 36 req/s; 50 offered, 14 must be shed.
	res, err := o.Step(context.Background(), f, demand(25, 25))
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, p := range res.Policies {
		for _, s := range p.GetShed() {
			total += s.GetFraction() * 25
		}
		if p.GetUtilization() < 1 {
			t.Fatalf("a shedding node reports utilization %.2f < 1", p.GetUtilization())
		}
	}
	if total < 13.9 || total > 14.1 {
		t.Fatalf("shed %.2f req/s, want the 14 req/s excess", total)
	}
}

// The prefix cache gives capacity back: with half of every request's cold engine time in
// prefill and half of the prompt tokens served from cache, each engine serves 10/(1-0.25)
// = 13.3 req/s, and 40 req/s fit under ρmax (4 × 13.3 × 0.9 = 48) that cold capacity (36)
// would shed 4 of.
func TestPrefixCacheHitsCreditCapacity(t *testing.T) {
	shed := func(y string, hit float64) float64 {
		t.Helper()
		o, _ := New(DefaultConfig())
		in := demand(20, 20)
		in.Engines = map[string]EngineInput{}
		for _, e := range []string{"a-0", "a-1", "b-0", "b-1"} {
			in.Engines[e] = EngineInput{ClassHitRate: hit}
		}
		res, err := o.Step(context.Background(), mustFleet(t, y), in)
		if err != nil {
			t.Fatal(err)
		}
		return res.ShedRPS()
	}
	credited := strings.Replace(twoRegions, "models: [{name: m}]", "models: [{name: m, prefill_share: 0.5}]", 1)
	if got := shed(twoRegions, 0.5); math.Abs(got-4) > 0.01 {
		t.Errorf("no prefill_share: shed %.2f req/s, want the 4 over cold capacity", got)
	}
	if got := shed(credited, 0); math.Abs(got-4) > 0.01 {
		t.Errorf("prefill_share 0.5, no hits yet: shed %.2f req/s, want 4", got)
	}
	if got := shed(credited, 0.5); got > 1e-6 {
		t.Errorf("prefill_share 0.5, half the prompt tokens hit: shed %.2f req/s, want none", got)
	}
}

// Where the prefix caches serve most prompt tokens, a move costs the moved requests their
// cache: a small imbalance between regions that moves flow across without caching does
// not move it when the caches serve 90% of the prompt tokens.
func TestAMoveIsPricedAtTheCacheItLeaves(t *testing.T) {
	far := func(hit float64) float64 {
		t.Helper()
		cfg := DefaultConfig()
		cfg.MaxShareStep = 1
		cfg.MinShareChange = 0.02 // the uncached spill is a few points
		o, _ := New(cfg)
		in := func(a, b float64) Inputs {
			in := demand(a, b)
			in.Engines = map[string]EngineInput{}
			for _, e := range []string{"a-0", "a-1", "b-0", "b-1"} {
				in.Engines[e] = EngineInput{ClassHitRate: hit}
			}
			return in
		}
		f := mustFleet(t, twoRegions)
		if _, err := o.Step(context.Background(), f, in(9, 9)); err != nil {
			t.Fatal(err)
		}
		res, err := o.Step(context.Background(), f, in(9.8, 8.2))
		if err != nil {
			t.Fatal(err)
		}
		return shareOf(res.Weights["region-a"]["m"], "b-0", "b-1")
	}
	if got := far(0); got < 0.02 {
		t.Errorf("no prefix caching: region-a at 9.8 req/s against 8.2 sends %.3f to region-b, want some", got)
	}
	if got := far(0.9); got != 0 {
		t.Errorf("90%% of prompt tokens cached: region-a sends %.3f to region-b, want none", got)
	}
}

func TestSmallMovesAreNotPublished(t *testing.T) {
	f := mustFleet(t, twoRegions)
	cfg := DefaultConfig()
	cfg.MinShareChange = 0.05
	o, _ := New(cfg)
	ctx := context.Background()
	first, _ := o.Step(ctx, f, demand(20, 4))
	w := first.Weights
	second, err := o.Step(ctx, f, demand(20.2, 4))
	if err != nil {
		t.Fatal(err)
	}
	if second.Changed {
		t.Fatal("a 1% demand change was published")
	}
	if shareOf(second.Weights["region-a"]["m"], "b-0", "b-1") != shareOf(w["region-a"]["m"], "b-0", "b-1") {
		t.Fatal("unpublished weights changed")
	}
}

// A sliver of spill (1.2% on each far engine) that comes with demand is not published.
// One in force is taken away alone when it ends, with nothing else of the new plan: at
// once on an engine that turns suspect, and when demand goes home (the spill must not
// stay for good).
func TestSliversComeUnpublishedAndEndAlone(t *testing.T) {
	f := mustFleet(t, twoRegions)
	cfg := DefaultConfig()
	cfg.MaxShareStep = 1
	cfg.MinShareChange = 0.02 // the moves below are 1 to 3 points
	o, _ := New(cfg)
	ctx := context.Background()
	if _, err := o.Step(ctx, f, demand(12, 12)); err != nil {
		t.Fatal(err)
	}
	res, err := o.Step(ctx, f, demand(13, 12)) // the LP sends 1.2% to each of b-0, b-1
	if err != nil {
		t.Fatal(err)
	}
	if res.Changed || res.Weights["region-a"]["m"]["b-0"] != 0 {
		t.Fatalf("a sliver of spill was published: %v", res.Weights["region-a"]["m"])
	}
	// withSliver returns an optimizer with 1.2% on each far engine in force.
	withSliver := func() (*Optimizer, map[string]uint32) {
		o, _ := New(cfg)
		if _, err := o.Step(ctx, f, demand(14, 12)); err != nil { // 3.3% each: published
			t.Fatal(err)
		}
		res, err := o.Step(ctx, f, demand(13, 12)) // back to 1.2%: 2.1 points less, published
		if err != nil {
			t.Fatal(err)
		}
		w := maps.Clone(res.Weights["region-a"]["m"])
		if !res.Changed || w["b-0"] == 0 || w["b-1"] == 0 {
			t.Fatalf("the spill shrinking past the threshold was not published: %v", w)
		}
		return o, w
	}
	o2, before := withSliver()
	if res, err = o2.Step(ctx, f, demand(12, 12)); err != nil { // demand goes home
		t.Fatal(err)
	}
	home := res.Weights["region-a"]["m"]
	if !res.Changed || home["b-0"] != 0 || home["b-1"] != 0 || home["a-0"] != before["a-0"] || home["a-1"] != before["a-1"] {
		t.Fatalf("the spill's end was not published alone: changed %v, %v, before %v", res.Changed, home, before)
	}
	if res, err = o2.Step(ctx, f, demand(12, 12)); err != nil {
		t.Fatal(err)
	}
	if res.Changed {
		t.Fatalf("nothing ended, yet weights were published: %v", res.Weights["region-a"]["m"])
	}
	o3, _ := withSliver()
	in := demand(13, 12)
	in.Engines = map[string]EngineInput{"b-0": {Suspect: true}}
	if res, err = o3.Step(ctx, f, in); err != nil {
		t.Fatal(err)
	}
	if !res.Changed || res.Weights["region-a"]["m"]["b-0"] != 0 {
		t.Fatalf("a suspect engine kept its sliver: changed %v, %v", res.Changed, res.Weights["region-a"]["m"])
	}
}

func TestStaticNodesKeepTheirWeights(t *testing.T) {
	f := mustFleet(t, twoRegions+"weights: {region-b: {b-0: 5, b-1: 5}}\n")
	o, _ := New(DefaultConfig())
	res, err := o.Step(context.Background(), f, demand(4, 4))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.Weights["region-b"]; ok {
		t.Fatal("the optimizer set weights for a node with static weights")
	}
	if len(res.Weights["region-a"]["m"]) == 0 {
		t.Fatal("region-a got no weights")
	}
}

func TestSuspectAndPenalizedEngines(t *testing.T) {
	f := mustFleet(t, twoRegions)
	o, _ := New(DefaultConfig())
	in := demand(12, 4)
	in.Engines = map[string]EngineInput{"a-0": {Suspect: true}, "a-1": {Penalty: 0.5}}
	res, err := o.Step(context.Background(), f, in)
	if err != nil {
		t.Fatal(err)
	}
	if res.Weights["region-a"]["m"]["a-0"] != 0 {
		t.Fatal("a suspect engine kept weight")
	}
	for e, name := range res.Solution.Engines {
		if name == "a-1" && res.Solution.Load[e] > 4.5001 {
			t.Fatalf("a-1 at half capacity planned %.2f req/s > 0.9×5", res.Solution.Load[e])
		}
	}
}

// A node with no demand yet spreads its weights over its region's engines, by the room each
// has left, instead of the single engine the LP's stand-in flow lands on; once demand is
// known, the plan's flow decides.
func TestNoDemandSpreadsOverTheNearestEngines(t *testing.T) {
	f := mustFleet(t, twoRegions)
	o, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := o.Step(ctx, f, demand(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	w := res.Weights["region-a"]["m"]
	if s0, s1 := shareOf(w, "a-0"), shareOf(w, "a-1"); s0 < 0.4 || s1 < 0.4 {
		t.Fatalf("no demand: region-a's weights %v put %.2f on a-0 and %.2f on a-1, want about half each", w, s0, s1)
	}
	if far := shareOf(w, "b-0", "b-1"); far != 0 {
		t.Fatalf("no demand: %.2f of region-a's weight on region-b, 40 ms away", far)
	}
	// Region-b's demand fills b-0 and b-1 and spills onto a-0/a-1 unevenly; region-a, still
	// without demand, weighs its engines by the room they have left.
	res, err = o.Step(ctx, f, demand(0, 22))
	if err != nil {
		t.Fatal(err)
	}
	w = res.Weights["region-a"]["m"]
	sol := res.Solution
	room := map[string]float64{}
	for e, name := range sol.Engines {
		room[name] = 10*0.9 - sol.Load[e]
	}
	if room["a-0"] <= 0 || room["a-1"] <= 0 {
		t.Fatalf("the plan left no room on a region-a engine (%v): the fleet no longer tests the split", room)
	}
	want := room["a-0"] / (room["a-0"] + room["a-1"])
	if got := shareOf(w, "a-0"); got < want-0.02 || got > want+0.02 {
		t.Fatalf("region-a's share on a-0 %.3f, want its share of the room left %.3f (room %v)", got, want, room)
	}
}

// A large move of the LP's split is published in steps of at most MaxShareStep per period
// and reaches the LP's split; an engine that turns suspect loses its share at once.
func TestShareStepsAreLimited(t *testing.T) {
	f := mustFleet(t, twoRegions)
	ctx := context.Background()
	free := DefaultConfig()
	free.MaxShareStep = 1
	ref, _ := New(free)
	o, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	limit := DefaultConfig().MaxShareStep
	if _, err := ref.Step(ctx, f, demand(4, 4)); err != nil {
		t.Fatal(err)
	}
	first, err := o.Step(ctx, f, demand(4, 4))
	if err != nil {
		t.Fatal(err)
	}
	r, err := ref.Step(ctx, f, demand(26, 4))
	if err != nil {
		t.Fatal(err)
	}
	want := shareOf(r.Weights["region-a"]["m"], "b-0", "b-1")
	if want < 2*limit {
		t.Fatalf("the LP moves %.2f of region-a's flow: too little to need steps", want)
	}
	prevW := first.Weights["region-a"]["m"]
	prev, steps := 0.0, 0
	for ; steps < 10; steps++ {
		res, err := o.Step(ctx, f, demand(26, 4))
		if err != nil {
			t.Fatal(err)
		}
		w := res.Weights["region-a"]["m"]
		for _, e := range []string{"a-0", "a-1", "b-0", "b-1"} {
			if d := math.Abs(shareOf(w, e) - shareOf(prevW, e)); d > limit+0.002 {
				t.Fatalf("step %d: %s's share moved %.3f, want at most %.2f", steps, e, d, limit)
			}
		}
		far := shareOf(w, "b-0", "b-1")
		if far < prev-1e-9 {
			t.Fatalf("step %d: region-a's far share fell %.3f -> %.3f on the way to %.3f", steps, prev, far, want)
		}
		prev, prevW = far, w
		// Reached: no engine's share is further from the LP's than a change worth publishing.
		reached := true
		for _, e := range []string{"a-0", "a-1", "b-0", "b-1"} {
			reached = reached && math.Abs(shareOf(w, e)-shareOf(r.Weights["region-a"]["m"], e)) <= DefaultConfig().MinShareChange
		}
		if reached {
			break
		}
	}
	if steps < 1 || steps >= 10 { // steps counts the periods after the first
		t.Fatalf("reached the LP's far share %.3f after %d more steps, want a few steps of at most %.2f", want, steps, limit)
	}
	in := demand(26, 4)
	in.Engines = map[string]EngineInput{"a-0": {Suspect: true}}
	res, err := o.Step(ctx, f, in)
	if err != nil {
		t.Fatal(err)
	}
	if w := res.Weights["region-a"]["m"]["a-0"]; w != 0 {
		t.Fatalf("a suspect engine kept weight %d: the step limit must not hold it", w)
	}
}

// shedRPS sums what the policies tell the sidecars of both regions (25 req/s each) to shed.
func shedRPS(res *Result) float64 {
	return (res.ShedFraction("region-a", "m") + res.ShedFraction("region-b", "m")) * 25
}

// queues gives every engine of twoRegions (10 req/s each) a scraped queue of waiting requests.
func queues(in Inputs, waiting float64) Inputs {
	in.Engines = map[string]EngineInput{}
	for _, e := range []string{"a-0", "a-1", "b-0", "b-1"} {
		in.Engines[e] = EngineInput{Waiting: waiting, WaitingKnown: true}
	}
	return in
}

// With ShedBacklog set, demand above the plan's capacity is shed only once the engines
// queue: a burst their queues absorb (nothing waiting) is served, a fleet whose queues
// hold more than the backlog sheds the LP's excess, and engines whose queue is not known
// get the LP's shedding. Either way the policies say demand exceeds capacity, so the
// retry budget closes.
func TestShedWaitsForTheEnginesToQueue(t *testing.T) {
	f := mustFleet(t, twoRegions)
	cfg := DefaultConfig()
	cfg.ShedBacklog = 500 * time.Millisecond
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Capacity at ρmax is 36 req/s; 50 offered: the LP sheds 14.
	res, err := o.Step(ctx, f, queues(demand(25, 25), 0))
	if err != nil {
		t.Fatal(err)
	}
	if s := shedRPS(res); s != 0 {
		t.Fatalf("shed %.2f req/s with nothing waiting at any engine: the queues absorb a burst", s)
	}
	if s := res.ShedRPS(); s != 0 {
		t.Fatalf("Result.ShedRPS %.2f with no policy shedding", s)
	}
	for node, p := range res.Policies {
		if p.GetUtilization() < 1 {
			t.Fatalf("%s: utilization %.2f < 1 while demand exceeds capacity", node, p.GetUtilization())
		}
	}
	// 4 waiting at 10 req/s is 0.4 s of queue: still below the backlog.
	if res, err = o.Step(ctx, f, queues(demand(25, 25), 4)); err != nil {
		t.Fatal(err)
	}
	if s := shedRPS(res); s != 0 {
		t.Fatalf("shed %.2f req/s with 0.4 s queued, below the 0.5 s backlog", s)
	}
	// 6 waiting is 0.6 s: the fleet is not keeping up.
	if res, err = o.Step(ctx, f, queues(demand(25, 25), 6)); err != nil {
		t.Fatal(err)
	}
	if s := shedRPS(res); s < 13.9 || s > 14.1 {
		t.Fatalf("shed %.2f req/s with 0.6 s queued, want the 14 req/s excess", s)
	}
	if s := res.ShedRPS(); s < 13.9 || s > 14.1 {
		t.Fatalf("Result.ShedRPS %.2f, want the 14 req/s the policies shed", s)
	}
	// One engine's queue unknown (its scrape failed): its nodes get the LP's shedding.
	in := queues(demand(25, 25), 0)
	in.Engines["a-0"] = EngineInput{}
	if res, err = o.Step(ctx, f, in); err != nil {
		t.Fatal(err)
	}
	if res.ShedFraction("region-a", "m") == 0 && res.ShedFraction("region-b", "m") == 0 {
		t.Fatal("no shedding although an engine the plan uses has no known queue")
	}
}

// The default sends the LP's shedding as is, whatever the queues.
func TestShedBacklogOffByDefault(t *testing.T) {
	if b := DefaultConfig().ShedBacklog; b != 0 {
		t.Fatalf("default shed backlog %v, want 0", b)
	}
	o, _ := New(DefaultConfig())
	res, err := o.Step(context.Background(), mustFleet(t, twoRegions), queues(demand(25, 25), 0))
	if err != nil {
		t.Fatal(err)
	}
	if s := shedRPS(res); s < 13.9 || s > 14.1 {
		t.Fatalf("shed %.2f req/s, want the 14 req/s excess", s)
	}
	cfg := DefaultConfig()
	cfg.ShedBacklog = -time.Second
	if _, err := New(cfg); err == nil {
		t.Fatal("a negative shed backlog was accepted")
	}
}

// An engine's queue counts only from a fresh, successful scrape that has the metric.
func TestInputsFromKnowsAQueueOnlyFromAFreshScrape(t *testing.T) {
	snap := signals.Snapshot{Engines: map[string]signals.EngineState{
		"fresh":    {State: signals.OK, Waiting: 2, LastWaiting: 7},
		"stale":    {State: signals.Degraded, LastWaiting: 7},
		"failed":   {State: signals.OK, LastWaiting: 7, LastError: "connection refused"},
		"nometric": {State: signals.OK, Missing: []string{"vllm:num_requests_waiting"}},
		"unknown":  {State: signals.Unknown},
	}}
	in := InputsFrom(snap)
	if e := in.Engines["fresh"]; !e.WaitingKnown || e.Waiting != 7 {
		t.Fatalf("fresh scrape: %+v, want the last scrape's 7 waiting, known", e)
	}
	for _, name := range []string{"stale", "failed", "nometric", "unknown"} {
		if in.Engines[name].WaitingKnown {
			t.Errorf("%s: queue taken as known", name)
		}
	}
}
