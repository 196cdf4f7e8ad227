package sim

import (
	"fmt"
	"strings"
)

// Target is one of the acceptance checks, evaluated on measured results.
type Target struct {
	Scenario Scenario
	What     string
	Measured string
	Met      bool
}

// Targets evaluates the checks that apply to the scenarios present in results (keyed by
// scenario), for the policy named "meridian" against the baselines.
func Targets(results map[Scenario][]Result) []Target {
	get := func(sc Scenario, policy string) (Result, bool) {
		for _, r := range results[sc] {
			if r.Policy == policy {
				return r, true
			}
		}
		return Result{}, false
	}
	var out []Target
	m, ok := get(Steady, "meridian")
	if ok {
		out = append(out, steadyTargets(m, func(p string) (Result, bool) { return get(Steady, p) })...)
	}
	if mStep, ok := get(Step, "meridian"); ok {
		if pc, ok := get(Step, "p-controller"); ok {
			ratio := pc.WeightChurn / mStep.WeightChurn
			out = append(out, Target{Step, "p-controller weight churn >= 3x meridian's",
				fmt.Sprintf("%.3f vs %.3f per min (%.1fx)", pc.WeightChurn, mStep.WeightChurn, ratio), ratio >= 3})
		}
	}
	for _, sc := range []Scenario{Step, Outage} {
		if t, ok := eventTarget(sc, func(p string) (Result, bool) { return get(sc, p) }); ok {
			out = append(out, t)
		}
	}
	if mo, ok := get(Overload, "meridian"); ok {
		excess := 1 - 1/overloadFactor
		out = append(out, Target{Overload, "meridian sheds <= the excess over capacity + 2 points",
			fmt.Sprintf("shed %.1f%%, excess %.1f%%", 100*mo.ShedRate, 100*excess), mo.ShedRate <= excess+0.02})
		if ms, ok := get(Steady, "meridian"); ok {
			out = append(out, Target{Overload, "meridian TTFT p99 of admitted requests <= 2x its steady p99",
				fmt.Sprintf("%.1f s vs steady %.1f s (%.2fx)", mo.TTFTP99/1000, ms.TTFTP99/1000, mo.TTFTP99/ms.TTFTP99),
				mo.TTFTP99 <= 2*ms.TTFTP99})
		}
	}
	return out
}

// anchors are the open routers' own algorithms, which issue 14's targets compare with.
var anchors = []string{"llm-d", "llm-d-precise", "dynamo", "sglang"}

// eventTarget is issue 14's check for step and outage: meridian as shipped serves at least
// twice the SLO goodput of the best anchor to the requests the scenario acts on (region 0's,
// in the middle third).
func eventTarget(sc Scenario, get func(string) (Result, bool)) (Target, bool) {
	m, ok := get("meridian-defaults")
	if !ok {
		return Target{}, false
	}
	best, bestName := 0.0, ""
	for _, p := range anchors {
		if r, ok := get(p); ok && (bestName == "" || r.Event.SLOGoodputRPS > best) {
			best, bestName = r.Event.SLOGoodputRPS, p
		}
	}
	if bestName == "" {
		return Target{}, false
	}
	ratio := "no goodput at all for the anchors"
	if best > 0 {
		ratio = fmt.Sprintf("%.2fx", m.Event.SLOGoodputRPS/best)
	}
	return Target{sc, "meridian-defaults' SLO goodput for the requests the scenario acts on >= 2x the best anchor's",
		fmt.Sprintf("%.3f vs %s %.3f req/s (%s; SLO attainment %.3f vs %.3f)", m.Event.SLOGoodputRPS, bestName, best, ratio,
			m.Event.SLOAttainment, func() float64 { r, _ := get(bestName); return r.Event.SLOAttainment }()),
		m.Event.SLOGoodputRPS >= 2*best}, true
}

func steadyTargets(m Result, get func(string) (Result, bool)) []Target {
	var out []Target
	best, bestName := 0.0, ""
	for _, p := range []string{"round-robin", "least-request", "p-controller"} {
		if r, ok := get(p); ok && (bestName == "" || r.TTFTP99 < best) {
			best, bestName = r.TTFTP99, p
		}
	}
	if bestName != "" {
		out = append(out, Target{Steady, "meridian TTFT p99 <= 0.5x the best of round-robin, least-request, p-controller",
			fmt.Sprintf("%.1f s vs %s %.1f s (%.2fx)", m.TTFTP99/1000, bestName, best/1000, m.TTFTP99/best),
			m.TTFTP99 <= best/2})
	}
	if rr, ok := get("round-robin"); ok {
		out = append(out, Target{Steady, "meridian kv_hit_rate >= 2x round-robin's",
			fmt.Sprintf("%.3f vs %.3f", m.KVHitRate, rr.KVHitRate), m.KVHitRate >= 2*rr.KVHitRate})
	}
	if ph, ok := get("prefix-hash"); ok {
		out = append(out, Target{Steady, "meridian kv_hit_rate >= 0.9x prefix-hash's",
			fmt.Sprintf("%.3f vs %.3f (%.2fx)", m.KVHitRate, ph.KVHitRate, m.KVHitRate/ph.KVHitRate),
			m.KVHitRate >= 0.9*ph.KVHitRate})
	}
	out = append(out, Target{Steady, "meridian sheds nothing", fmt.Sprintf("%d of %d shed", m.Shed, m.Requests), m.Shed == 0})
	return out
}

// TargetTable renders targets as a markdown table.
func TargetTable(ts []Target) string {
	var b strings.Builder
	b.WriteString("| scenario | target | measured | met |\n|---|---|---|---|\n")
	for _, t := range ts {
		met := "no"
		if t.Met {
			met = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.Scenario, t.What, t.Measured, met)
	}
	return b.String()
}
