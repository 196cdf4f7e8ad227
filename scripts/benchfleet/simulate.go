package main

import (
	"context"
	"fmt"
	"time"

	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// simPolicies maps each configuration to the simulator policy that models it.
var simPolicies = map[string]string{
	Meridian:     "meridian-defaults", // the shipped defaults, as the sidecars and control server run here
	LeastRequest: "least-request",
	RingHash:     "prefix-hash", // consistent hashing on the same prefix depth
}

// SimResult is the simulator's prediction for one configuration, on the same subset,
// fleet shape, load and region assignment. Its latencies are divided by the speed, so
// they compare with the run's wall-clock figures.
type SimResult struct {
	Policy    string `json:"policy"`
	Completed int    `json:"completed"`
	Shed      int    `json:"shed"`
	Failed    int    `json:"failed"`
	// SLOAttainment is judged by the run's SLO before time scaling (the simulator runs
	// on unscaled time).
	SLOAttainment float64 `json:"slo_attainment"`
	TTFTP50       float64 `json:"ttft_p50_ms"`
	TTFTP90       float64 `json:"ttft_p90_ms"`
	KVHitRate     float64 `json:"kv_hit_rate"`
}

// simulate runs the simulator on the unscaled subset (it scales it to o.load itself, by
// the same cold capacity), with the injected RTTs unscaled and no proxy retries (the
// baseline Envoys have none).
func simulate(ctx context.Context, o options, sub []trace.Request, regions []string) (map[string]SimResult, error) {
	rtt := make([][]time.Duration, len(regions))
	for i := range regions {
		for j := range regions {
			ms := o.rttMillis
			if i == j {
				ms = 1
			}
			rtt[i] = append(rtt[i], time.Duration(ms*float64(time.Millisecond)))
		}
	}
	cfg := &sim.Config{Trace: sub, Regions: regions, EnginesPerRegion: o.perRegion, RTT: rtt,
		Engine: engine.A100Llama8B(trace.BlockTokens), Load: o.load, Scenario: sim.Steady, Seed: o.seed,
		Retries: 0, SLO: o.slo.SLO,
		// Each baseline Envoy's cluster holds every engine (the remote ones at a lower
		// priority), so the simulator's baselines route over the whole fleet, not per region.
		Deployment: sim.DeployGlobal}
	for _, c := range o.configs {
		cfg.Policies = append(cfg.Policies, simPolicies[c])
	}
	results, _, err := sim.Run(ctx, cfg, nil, 0)
	if err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	out := map[string]SimResult{}
	for i, c := range o.configs {
		r := results[i]
		out[c] = SimResult{Policy: r.Policy, Completed: r.Completed, Shed: r.Shed, Failed: r.Failed, SLOAttainment: round3(r.SLOAttainment),
			TTFTP50: round3(r.TTFTP50 / o.speed), TTFTP90: round3(r.TTFTP90 / o.speed), KVHitRate: round3(r.KVHitRate)}
	}
	return out, nil
}
