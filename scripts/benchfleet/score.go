package main

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/meridian-router/meridian/examples/loadgen/load"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/trace"
)

// SLO is the per-request latency objective of issue 14, before time scaling: a request
// meets it when it completes, its TTFT is at most TTFTBase + TTFTPerToken × its prompt
// tokens, and the mean gap between its tokens is at most ITL. A shed or failed request
// misses it.
// It is the simulator's SLO (sim.SLO), so both judge requests alike.
type SLO struct{ sim.SLO }

// DefaultSLO is the simulator's: TTFT ≤ 1 s + 0.2 ms per prompt token and mean ITL ≤ 100 ms.
func DefaultSLO() SLO { return SLO{sim.DefaultSLO()} }

// Validate reports a bound that is not positive.
func (s SLO) Validate() error {
	if s.TTFTBase <= 0 || s.TTFTPerToken < 0 || s.MaxITL <= 0 {
		return errors.New("SLO: --slo-ttft and --slo-itl must be > 0 and --slo-ttft-per-token >= 0")
	}
	return nil
}

// Scaled divides every bound by k, for a run whose time runs k times faster.
func (s SLO) Scaled(k float64) SLO {
	div := func(d time.Duration) time.Duration { return time.Duration(math.Round(float64(d) / k)) }
	return SLO{sim.SLO{TTFTBase: div(s.TTFTBase), TTFTPerToken: div(s.TTFTPerToken), MaxITL: div(s.MaxITL)}}
}

// Met reports whether res, a request of promptTokens tokens, meets s.
func (s SLO) Met(res load.Result, promptTokens int) bool {
	if res.Class != load.ClassOK || res.TTFT <= 0 {
		return false
	}
	if res.TTFT > s.TTFTLimit(promptTokens) {
		return false
	}
	return len(res.ITLs) == 0 || meanITL(res) <= s.MaxITL
}

func meanITL(res load.Result) time.Duration {
	var sum time.Duration
	for _, g := range res.ITLs {
		sum += g
	}
	return sum / time.Duration(max(len(res.ITLs), 1))
}

// ConfigResult is one configuration's outcome. Latencies are wall-clock milliseconds of
// the time-scaled run (multiply by the speed for the unscaled figure).
type ConfigResult struct {
	Sent   int `json:"requests_sent"`
	OK     int `json:"ok"`
	Shed   int `json:"shed"`
	Failed int `json:"failed"`
	// Errors counts the failed requests by HTTP status or failure class.
	Errors map[string]int `json:"errors,omitempty"`
	// SLOAttainment is the share of sent requests that met the (scaled) SLO.
	SLOAttainment float64 `json:"slo_attainment"`
	TTFTP50       float64 `json:"ttft_p50_ms"`
	TTFTP90       float64 `json:"ttft_p90_ms"`
	// ITLMean is the mean gap between tokens, pooled over every ok stream.
	ITLMean float64 `json:"itl_mean_ms"`
	// KVHitRate is Σ vllm:prefix_cache_hits_total / Σ vllm:prefix_cache_queries_total over
	// the engines, which start the configuration with empty caches and zero counters.
	KVHitRate float64 `json:"kv_hit_rate"`
	// CrossRegion is the share of ok requests served outside the region they entered.
	CrossRegion float64 `json:"cross_region_share"`
	// Engines counts ok responses per engine.
	Engines map[string]int `json:"engines"`
	// ReplayS is the wall time from the first request to the last answer.
	ReplayS float64 `json:"replay_s"`
	// SLOAttainmentRuns lists each repeat's attainment when there are several (the other
	// fields are then medians over the repeats, field by field).
	SLOAttainmentRuns []float64 `json:"slo_attainment_runs,omitempty"`
}

// attempt is one request's schedule entry and outcome.
type attempt struct {
	req    trace.Request
	region string
	res    load.Result
	done   bool
}

// score summarizes one configuration's attempts; engineRegion maps engine names to their
// regions, and hits and queries are the engines' prefix-cache counters.
func score(attempts []attempt, slo SLO, engineRegion map[string]string, hits, queries float64, replay time.Duration) (ConfigResult, error) {
	r := ConfigResult{Engines: map[string]int{}, ReplayS: round3(replay.Seconds())}
	var ttft []float64
	var itlSum time.Duration
	itlN, good, cross := 0, 0, 0
	for i, a := range attempts {
		if !a.done {
			return r, fmt.Errorf("request %d of the subset was never sent", i)
		}
		r.Sent++
		switch a.res.Class {
		case load.ClassOK:
		case load.ClassShed:
			r.Shed++
			continue
		default:
			r.Failed++
			if r.Errors == nil {
				r.Errors = map[string]int{}
			}
			r.Errors[a.res.Class]++
			continue
		}
		r.OK++
		r.Engines[a.res.Engine]++
		if er, ok := engineRegion[a.res.Engine]; ok && er != a.region {
			cross++
		}
		if slo.Met(a.res, a.req.InputTokens) {
			good++
		}
		if a.res.TTFT > 0 {
			ttft = append(ttft, float64(a.res.TTFT)/float64(time.Millisecond))
		}
		for _, g := range a.res.ITLs {
			itlSum += g
			itlN++
		}
	}
	slices.Sort(ttft)
	r.SLOAttainment = round3(float64(good) / float64(max(r.Sent, 1)))
	r.TTFTP50, r.TTFTP90 = round3(trace.Percentile(ttft, 50)), round3(trace.Percentile(ttft, 90))
	if itlN > 0 {
		r.ITLMean = round3(float64(itlSum) / float64(itlN) / float64(time.Millisecond))
	}
	if queries > 0 {
		r.KVHitRate = round3(hits / queries)
	}
	if r.OK > 0 {
		r.CrossRegion = round3(float64(cross) / float64(r.OK))
	}
	return r, nil
}

// median combines repeats field by field; with one run it is that run.
func median(runs []ConfigResult) ConfigResult {
	if len(runs) == 1 {
		return runs[0]
	}
	med := func(f func(ConfigResult) float64) float64 {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return round3((v[len(v)/2-1] + v[len(v)/2]) / 2)
	}
	out := ConfigResult{
		Sent:          int(med(func(r ConfigResult) float64 { return float64(r.Sent) })),
		OK:            int(med(func(r ConfigResult) float64 { return float64(r.OK) })),
		Shed:          int(med(func(r ConfigResult) float64 { return float64(r.Shed) })),
		Failed:        int(med(func(r ConfigResult) float64 { return float64(r.Failed) })),
		SLOAttainment: med(func(r ConfigResult) float64 { return r.SLOAttainment }),
		TTFTP50:       med(func(r ConfigResult) float64 { return r.TTFTP50 }),
		TTFTP90:       med(func(r ConfigResult) float64 { return r.TTFTP90 }),
		ITLMean:       med(func(r ConfigResult) float64 { return r.ITLMean }),
		KVHitRate:     med(func(r ConfigResult) float64 { return r.KVHitRate }),
		CrossRegion:   med(func(r ConfigResult) float64 { return r.CrossRegion }),
		ReplayS:       med(func(r ConfigResult) float64 { return r.ReplayS }),
		// Not medians: the counts of the repeat in the middle of the run order.
		Engines: runs[len(runs)/2].Engines,
		Errors:  runs[len(runs)/2].Errors,
	}
	for _, r := range runs {
		out.SLOAttainmentRuns = append(out.SLOAttainmentRuns, r.SLOAttainment)
	}
	return out
}

// ranking orders configurations by SLO attainment, then by TTFT p50.
func ranking(results map[string]ConfigResult) []string {
	var names []string
	for n := range results {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		ra, rb := results[a], results[b]
		if ra.SLOAttainment != rb.SLOAttainment {
			if ra.SLOAttainment > rb.SLOAttainment {
				return -1
			}
			return 1
		}
		switch {
		case ra.TTFTP50 < rb.TTFTP50:
			return -1
		case ra.TTFTP50 > rb.TTFTP50:
			return 1
		}
		return 0
	})
	return names
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }
