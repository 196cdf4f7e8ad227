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

// Issue 14's capacity targets for meridian as shipped.
const (
	regionCapacityRatio = 1.25 // capacity per region >= 1.25x the best anchor's, same deployment
	globalCapacityRatio = 1.0  // as one global pool: >= the best anchor's
	maxSteadyShareStep  = 0.2  // no flips
)

// CapacityTargets evaluates issue 14's capacity targets for meridian-defaults on a
// capacity search's results (those whose policies are present): its capacity against the
// best anchor's per deployment (1.25x per region, 1.0x global); per region, its KV hit
// rate at its capacity against that anchor's at its own, its steady-state churn against
// the p-controller's at its own capacity, and its steady max share step; and no shedding
// in the run at 0.9x its capacity (CapacityConfig.BelowCapacity), when the search made one.
func CapacityTargets(caps []Capacity) []Target {
	get := func(policy, dep string) (Capacity, bool) {
		for _, c := range caps {
			if c.Policy == policy && c.Deployment == dep {
				return c, true
			}
		}
		return Capacity{}, false
	}
	var out []Target
	for _, dep := range []Deployment{DeployRegion, DeployGlobal} {
		m, ok := get("meridian-defaults", string(dep))
		if !ok {
			continue
		}
		where := Scenario(fmt.Sprintf("capacity, %s x%d", dep, m.Replicas))
		var best Capacity
		for _, p := range anchors {
			if a, ok := get(p, string(dep)); ok && a.CapacityRPS > best.CapacityRPS {
				best = a
			}
		}
		if best.Policy != "" {
			want := regionCapacityRatio
			if dep == DeployGlobal {
				want = globalCapacityRatio
			}
			ratio := m.CapacityRPS / best.CapacityRPS
			out = append(out, Target{where, fmt.Sprintf("meridian-defaults' capacity >= %.2fx the best anchor's", want),
				fmt.Sprintf("%.3f vs %s %.3f req/s (%.2fx)", m.CapacityRPS, best.Policy, best.CapacityRPS, ratio),
				m.Bracketed && ratio >= want})
			if dep == DeployRegion && m.KVHitUpperBound > 0 { // a trace without prefixes hits nothing
				out = append(out, Target{where, "KV hit rate at the capacity >= the best anchor's at its own",
					fmt.Sprintf("%.3f vs %s %.3f", m.KVHitRate, best.Policy, best.KVHitRate), m.KVHitRate >= best.KVHitRate})
			}
		}
		if dep != DeployRegion {
			continue
		}
		if pc, ok := get("p-controller", string(dep)); ok {
			out = append(out, Target{where, "steady-state churn at the capacity <= the p-controller's at its own",
				fmt.Sprintf("%.3f vs %.3f shares/min (whole run %.3f vs %.3f)", m.SteadyWeightChurn, pc.SteadyWeightChurn,
					m.WeightChurn, pc.WeightChurn),
				m.SteadyWeightChurn <= pc.SteadyWeightChurn})
		}
		out = append(out, Target{where, fmt.Sprintf("steady-state max share step at the capacity <= %.1f", maxSteadyShareStep),
			fmt.Sprintf("%.3f (whole run %.3f)", m.SteadyMaxShareStep, m.MaxShareStep), m.SteadyMaxShareStep <= maxSteadyShareStep})
		if b := m.Below; b != nil {
			out = append(out, Target{where, fmt.Sprintf("no shedding at %.2gx its capacity", b.Load/m.CapacityLoad),
				fmt.Sprintf("%d of %d shed at %.3f req/s (%.3f x cold)", b.Shed, b.Requests, b.OfferedRPS, b.Load), b.Shed == 0})
		}
	}
	return out
}
