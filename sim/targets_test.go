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
