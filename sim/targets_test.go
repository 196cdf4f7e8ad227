package sim

import "testing"

func TestTargets(t *testing.T) {
	res := func(policy string, p99, hit, churn, shedRate float64) Result {
		return Result{Policy: policy, Requests: 100, Shed: int(shedRate * 100), ShedRate: shedRate,
			TTFTP99: p99, KVHitRate: hit, WeightChurn: churn}
	}
	results := map[Scenario][]Result{
		Steady: {res("round-robin", 10000, 0.05, 0, 0), res("least-request", 8000, 0.05, 0, 0),
			res("p-controller", 9000, 0.2, 1, 0), res("prefix-hash", 12000, 0.3, 0, 0), res("meridian", 4000, 0.25, 0.1, 0)},
		Step:     {res("p-controller", 1, 0, 0.9, 0), res("meridian", 1, 0, 0.2, 0)},
		Overload: {res("meridian", 9000, 0, 0, 0.36)},
	}
	want := map[string]bool{
		"meridian TTFT p99 <= 0.5x the best of round-robin, least-request, p-controller": true, // 4000 <= 4000
		"meridian kv_hit_rate >= 2x round-robin's":                                       true,
		"meridian kv_hit_rate >= 0.9x prefix-hash's":                                     false, // 0.25 < 0.27
		"meridian sheds nothing":                                                         true,
		"p-controller weight churn >= 3x meridian's":                                     true,  // 4.5x
		"meridian sheds <= the excess over capacity + 2 points":                          false, // 36% > 35.3%
		"meridian TTFT p99 of admitted requests <= 2x its steady p99":                    false, // 9000 > 8000
	}
	got := Targets(results)
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d:\n%s", len(got), len(want), TargetTable(got))
	}
	for _, tg := range got {
		if w, ok := want[tg.What]; !ok || w != tg.Met {
			t.Errorf("%s: met=%v (%s), want %v", tg.What, tg.Met, tg.Measured, w)
		}
	}
}

// The step and outage targets compare the SLO goodput of the requests the scenario acts
// on with the best anchor's, and an anchor that serves none of them fails any ratio.
func TestEventTargets(t *testing.T) {
	ev := func(policy string, good float64) Result {
		return Result{Policy: policy, Event: EventResult{Requests: 100, SLOGoodputRPS: good, SLOAttainment: good / 10}}
	}
	results := map[Scenario][]Result{
		Step:   {ev("llm-d", 1), ev("llm-d-precise", 2.5), ev("dynamo", 1), ev("sglang", 0.5), ev("meridian-defaults", 4.9)},
		Outage: {ev("llm-d", 0), ev("llm-d-precise", 0), ev("dynamo", 0), ev("sglang", 0), ev("meridian-defaults", 3)},
	}
	got := Targets(results)
	if len(got) != 2 {
		t.Fatalf("%d targets, want the step and outage ones:\n%s", len(got), TargetTable(got))
	}
	for _, tg := range got {
		want := tg.Scenario == Outage // step: 4.9 < 2 x 2.5
		if tg.Met != want {
			t.Errorf("%s: met=%v (%s), want %v", tg.Scenario, tg.Met, tg.Measured, want)
		}
	}
}

// The capacity targets compare meridian-defaults with the best anchor of the same
// deployment, and its steady churn with the p-controller's.
func TestCapacityTargets(t *testing.T) {
	c := func(policy string, dep Deployment, rps, hit, churn, step float64) Capacity {
		return Capacity{Policy: policy, Deployment: string(dep), Replicas: 4, CapacityRPS: rps, CapacityLoad: rps / 10,
			Bracketed: true, KVHitRate: hit, KVHitUpperBound: 0.5, SteadyWeightChurn: churn, SteadyMaxShareStep: step}
	}
	caps := []Capacity{}
	caps = append(caps,
		c("llm-d", DeployRegion, 8, 0.5, 0, 0), c("dynamo", DeployRegion, 10, 0.3, 0, 0),
		c("p-controller", DeployRegion, 3, 0, 0.2, 0.05),
		c("meridian-defaults", DeployRegion, 12.6, 0.31, 0.1, 0.25),
		c("dynamo", DeployGlobal, 11, 0.3, 0, 0), c("meridian-defaults", DeployGlobal, 10.9, 0.3, 0, 0))
	caps[3].Below = &BelowCapacity{Load: 0.9 * 1.26, Requests: 1000, Shed: 3}
	want := map[string]bool{
		"capacity, region x4: meridian-defaults' capacity >= 1.25x the best anchor's":              true, // 12.6 vs dynamo's 10
		"capacity, region x4: KV hit rate at the capacity >= the best anchor's at its own":         true, // dynamo's, not llm-d's 0.5
		"capacity, region x4: steady-state churn at the capacity <= the p-controller's at its own": true,
		"capacity, region x4: steady-state max share step at the capacity <= 0.2":                  false, // 0.25
		"capacity, region x4: no shedding at 0.9x its capacity":                                    false, // 3 of 1000
		"capacity, global x4: meridian-defaults' capacity >= 1.00x the best anchor's":              false, // 10.9 < 11
	}
	got := CapacityTargets(caps)
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d:\n%s", len(got), len(want), TargetTable(got))
	}
	for _, tg := range got {
		key := string(tg.Scenario) + ": " + tg.What
		if w, ok := want[key]; !ok || w != tg.Met {
			t.Errorf("%s: met=%v (%s), want %v (known: %v)", key, tg.Met, tg.Measured, w, ok)
		}
	}
}
