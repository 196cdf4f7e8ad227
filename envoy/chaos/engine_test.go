package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/extproc/guard"
)

// TestChaosEngineDies kills one of three engines under load and restarts it: fewer than 1%
// of requests fail, Envoy's retries stay inside the sidecar's budget, the sidecar stops
// choosing the dead engine within seconds, and uses it again once it is back.
func TestChaosEngineDies(t *testing.T) {
	s := startStack(t, evenThree())
	n := s.Nodes[node]
	victim := s.Engines["e1"]
	const (
		rate   = 40
		killAt = 3 * time.Second
		backAt = 11 * time.Second
		total  = 16 * time.Second
	)
	pen := samplePenalties(s, 200*time.Millisecond)
	lr := startLoad(t, n.URL, loadSpec{Rate: rate, Duration: total, Output: 8, Stream: true, Seed: 3})
	lr.sleepTo(killAt)
	killed := time.Now()
	victim.Proc.Kill()
	lr.sleepTo(backAt)
	if err := victim.Proc.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := stack.WaitHTTP(ctx, "http://"+victim.Address+"/health", 200); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	sum, results := lr.wait(t)
	entries := accessLog(t, s, sum.Requests)
	end := time.Now()
	lowest := pen.lowest()

	figure(t, "requests", sum.Requests)
	fails := failed(results)
	failRate := float64(len(fails)+sum.Shed) / float64(sum.Requests)
	figure(t, "failed", len(fails))
	figure(t, "shed", sum.Shed)
	figure(t, "failed_share", round2(failRate*100)/100)
	if failRate >= 0.01 {
		t.Errorf("%d failed and %d shed of %d requests (%.1f%%) with one engine of three killed; want < 1%%:\n%v",
			len(fails), sum.Shed, sum.Requests, 100*failRate, fails)
	}

	budget := guard.DefaultRetryConfig().Curve.MaxRetriesIdle
	maxAttempts, attempts, retried := 0, 0, 0
	for _, e := range between(entries, killed, end) {
		maxAttempts = max(maxAttempts, e.Attempts)
		attempts += e.Attempts
		if e.Attempts > 1 {
			retried++
		}
	}
	figure(t, "max_attempts_per_request", maxAttempts)
	figure(t, "requests_retried", retried)
	if maxAttempts > 1+int(budget) {
		t.Errorf("a request made %d upstream attempts; the retry budget allows at most 1+%d", maxAttempts, budget)
	}

	// The sidecar has stopped choosing the engine when its share of primaries in a 1 s
	// window falls to what the outlier penalty's floor leaves it.
	stopped, ok := atPenaltyFloor(entries, killed, victim.Address, rate/2)
	if !ok {
		t.Fatalf("the sidecar kept choosing the dead engine until it came back")
	}
	figure(t, "stopped_choosing_dead_engine_ms", stopped.Add(time.Second).Sub(killed).Milliseconds())
	if d := stopped.Add(time.Second).Sub(killed); d > 6*time.Second {
		t.Errorf("the sidecar took %s to stop choosing the dead engine; want <= 6s", d)
	}

	// Retries land on the survivors; they must not be mistaken for slow or failing. (On a
	// busy machine a stall of one stream can still push a healthy engine's mean decode
	// time past the outlier fence: see docs/reliability.md.)
	figure(t, "lowest_penalty_of_healthy_engines", map[string]float64{"e0": lowest["e0"], "e2": lowest["e2"]})
	for _, e := range []string{"e0", "e2"} {
		if lowest[e] < 0.5 {
			t.Errorf("healthy engine %s was penalized down to %.2f while e1 was dead", e, lowest[e])
		}
	}

	reused, reusedFailed := 0, 0
	for _, e := range between(entries, back, end) {
		if e.UpstreamHost != victim.Address {
			continue
		}
		if e.Status == 200 {
			reused++
		} else {
			reusedFailed++
		}
	}
	figure(t, "served_by_restarted_engine", reused)
	m, err := s.SidecarMetrics(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	figure(t, "restarted_engine_penalty_at_end", round2(m.Value("meridian_sidecar_engine_penalty", "engine", victim.Name)))
	if reused == 0 || reusedFailed > 0 {
		t.Errorf("after it came back the engine served %d requests and failed %d; want it used again, without failures", reused, reusedFailed)
	}
}
