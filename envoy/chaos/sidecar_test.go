package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meridian-router/meridian/examples/loadgen/load"
)

// TestChaosSidecarDies kills the sidecar under load and brings it back: no request fails
// (Envoy's ext_proc fails open to the cluster's weighted Maglev fallback), and once the
// sidecar is back it steers again, each prompt to the engine it had before.
func TestChaosSidecarDies(t *testing.T) {
	s := startStack(t, evenThree())
	n := s.Nodes[node]
	const (
		rate   = 40
		killAt = 3 * time.Second
		backAt = 6 * time.Second
		total  = 10 * time.Second
	)
	lr := startLoad(t, n.URL, loadSpec{Rate: rate, Duration: total, Output: 8, Groups: 12, Stream: true, Seed: 2})
	lr.sleepTo(killAt)
	killed := time.Now()
	n.Sidecar.Kill()
	lr.sleepTo(backAt)
	restarted := time.Now()
	if err := n.Sidecar.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitNodeReady(ctx, node); err != nil {
		t.Fatal(err)
	}
	ready := time.Now()
	sum, results := lr.wait(t)
	entries := accessLog(t, s, sum.Requests)
	end := time.Now()

	figure(t, "requests", sum.Requests)
	fails := failed(results)
	figure(t, "failed", len(fails))
	figure(t, "shed", sum.Shed)
	figure(t, "sidecar_ready_after_restart_ms", ready.Sub(restarted).Milliseconds())
	if len(fails) > 0 || sum.Shed > 0 {
		t.Errorf("%d failed and %d shed of %d requests (load at 53%% of capacity) with the sidecar killed and restarted:\n%v",
			len(fails), sum.Shed, sum.Requests, fails)
	}

	down := between(entries, killed.Add(100*time.Millisecond), restarted)
	figure(t, "steered_share_while_down", round2(steeredShare(down)))
	if len(down) < rate || steeredShare(down) > 0.05 {
		t.Errorf("while the sidecar was down: %d requests logged, %.2f steered; want >= %d, about none steered (fail open)",
			len(down), steeredShare(down), rate)
	}
	served := map[string]int{}
	for _, e := range down {
		served[e.ServedBy]++
	}
	if len(served) < 2 {
		t.Errorf("fallback sent everything to %v: not Envoy's weighted split", served)
	}

	after := between(entries, ready, end)
	figure(t, "steered_share_after_return", round2(steeredShare(after)))
	if len(after) < rate || steeredShare(after) < 0.99 {
		t.Errorf("after the sidecar returned: %d requests, %.2f steered; want all steered", len(after), steeredShare(after))
	}

	// A prompt's engine is the one that served most of its requests: bursts on a busy
	// machine spill single requests (bounded loads), which is by design.
	beforeHome := homes(lr, results, time.Time{}, killed)
	afterHome := homes(lr, results, ready, end)
	same := 0
	for g, e := range afterHome {
		if beforeHome[g] == e {
			same++
		}
	}
	figure(t, "prompt_groups_same_engine_after_return", fmt.Sprintf("%d/%d", same, len(afterHome)))
	figure(t, "requests_on_their_groups_engine_after_return", round2(onHome(lr, results, afterHome, ready, end)))
	if len(afterHome) < 10 || same < len(afterHome)-1 {
		t.Errorf("after the sidecar returned %d of %d prompt groups went to their engine from before; want all but at most one", same, len(afterHome))
	}
}

// homes maps each prompt group to the engine that served most of its ok requests sent in
// [from, to).
func homes(lr *loadRun, results []load.Result, from, to time.Time) map[uint64]string {
	counts := map[uint64]map[string]int{}
	for _, r := range results {
		if r.Class != load.ClassOK || r.Sent.Before(from) || !r.Sent.Before(to) {
			continue
		}
		g := lr.group(r.Index)
		if counts[g] == nil {
			counts[g] = map[string]int{}
		}
		counts[g][r.Engine]++
	}
	out := map[uint64]string{}
	for g, byEngine := range counts {
		best := 0
		for e, c := range byEngine {
			if c > best || (c == best && e < out[g]) {
				out[g], best = e, c
			}
		}
	}
	return out
}

// onHome is the fraction of ok requests sent in [from, to) served by their group's home.
func onHome(lr *loadRun, results []load.Result, home map[uint64]string, from, to time.Time) float64 {
	same, total := 0, 0
	for _, r := range results {
		if r.Class != load.ClassOK || r.Sent.Before(from) || !r.Sent.Before(to) {
			continue
		}
		total++
		if r.Engine == home[lr.group(r.Index)] {
			same++
		}
	}
	if total == 0 {
		return 0
	}
	return float64(same) / float64(total)
}
