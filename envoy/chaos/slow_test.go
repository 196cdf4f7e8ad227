package chaos

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/examples/loadgen/load"
	"github.com/meridian-router/meridian/sim/trace"
)

// TestChaosEngineTurnsSlow makes one of three engines 10× slower (TTFT and inter-token
// latency) through the mock's admin endpoint: within 10 s the sidecar's outlier penalty
// cuts its share to the penalty floor, and TTFT recovers toward the baseline.
func TestChaosEngineTurnsSlow(t *testing.T) {
	s := startStack(t, evenThree())
	n := s.Nodes[node]
	slow := s.Engines["e1"]
	const (
		rate   = 30
		slowAt = 4 * time.Second
		total  = 18 * time.Second
		factor = 10
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lr := startLoad(t, n.URL, loadSpec{Rate: rate, Duration: total, Output: 8, Stream: true, Seed: 4})
	lr.sleepTo(slowAt)
	slowed := time.Now()
	f := stack.NoFaults()
	f.LatencyMultiplier = factor
	if err := s.SetFaults(ctx, slow.Name, f); err != nil {
		t.Fatal(err)
	}
	sum, results := lr.wait(t)
	entries := accessLog(t, s, sum.Requests)
	end := time.Now()

	figure(t, "requests", sum.Requests)
	if fails := failed(results); len(fails) > 0 || sum.Shed > 0 {
		t.Errorf("%d failed and %d shed with one engine slow:\n%v", len(fails), sum.Shed, fails)
	}
	cut, ok := atPenaltyFloor(entries, slowed, slow.Address, rate/2)
	figure(t, "slow_engine_share_before", round2(primaryShare(between(entries, time.Time{}, slowed), slow.Address)))
	figure(t, "slow_engine_share_last_4s", round2(primaryShare(between(entries, end.Add(-4*time.Second), end), slow.Address)))
	if !ok {
		t.Fatalf("the slow engine's share never fell to the penalty floor's")
	}
	figure(t, "share_cut_after_ms", cut.Add(time.Second).Sub(slowed).Milliseconds())
	if d := cut.Add(time.Second).Sub(slowed); d > 10*time.Second {
		t.Errorf("the slow engine's share fell to the penalty level after %s; want <= 10s", d)
	}

	base := ttfts(results, time.Time{}, slowed)
	hit := ttfts(results, slowed, cut.Add(time.Second))
	healed := ttfts(results, end.Add(-5*time.Second), end)
	for _, p := range []struct {
		name string
		v    []float64
	}{{"baseline", base}, {"while_shifting", hit}, {"last_5s", healed}} {
		figure(t, "ttft_p50_ms_"+p.name, round2(trace.Percentile(p.v, 50)))
		figure(t, "ttft_p90_ms_"+p.name, round2(trace.Percentile(p.v, 90)))
		figure(t, "ttft_p99_ms_"+p.name, round2(trace.Percentile(p.v, 99)))
	}
	if trace.Percentile(healed, 90) > 2*trace.Percentile(base, 90) {
		t.Errorf("TTFT p90 in the last 5 s is %.0f ms, baseline %.0f ms: want within 2×",
			trace.Percentile(healed, 90), trace.Percentile(base, 90))
	}
}

// ttfts returns the sorted TTFTs, in ms, of ok results sent in [from, to).
func ttfts(results []load.Result, from, to time.Time) []float64 {
	var v []float64
	for _, r := range results {
		if r.Class == load.ClassOK && r.TTFT > 0 && !r.Sent.Before(from) && r.Sent.Before(to) {
			v = append(v, float64(r.TTFT)/float64(time.Millisecond))
		}
	}
	slices.Sort(v)
	return v
}
