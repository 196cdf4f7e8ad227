package chaos

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/meridian-router/meridian/bootstrap"
	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/examples/loadgen/load"
	"github.com/meridian-router/meridian/sim/trace"
)

// Overload shape: every engine is planned at capacityRPS and capped at maxInFlight
// requests; a request takes about engineTTFT + (overloadTokens-1)·engineITL.
const (
	capacityRPS    = 8
	maxInFlight    = 8
	overloadTokens = 40
)

// TestChaosOverload offers twice the fleet's capacity, half of it at the lowest priority
// and half at the highest: shed answers come at once, low priority is shed first, admitted
// requests keep their TTFT, Envoy does not retry the excess, and shedding stops within
// seconds once the offered load falls back under capacity.
func TestChaosOverload(t *testing.T) {
	spec := withCapacity(oneNode(3, nil), capacityRPS)
	for i := range spec.Engines {
		spec.Engines[i].Args = []string{"--ttft", engineTTFT.String(), "--itl", engineITL.String()}
	}
	spec.Bootstrap = func(p *bootstrap.Params) { p.TrustPriorityHeader = true }
	s := startStack(t, spec)
	n := s.Nodes[node]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	setMaxInFlight(ctx, t, s, maxInFlight)

	planned := 3 * capacityRPS * 0.9 // the LP keeps engines at rho_max = 0.9
	priority := func(p string) http.Header { return http.Header{"X-Meridian-Priority": {p}} }
	unloaded := runPhase(t, n.URL, planned/2, 5*time.Second, priority("3"), 50)

	before, err := s.SidecarMetrics(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	logBefore := len(accessLog(t, s, 0))
	overStart := time.Now()
	low := startLoad(t, n.URL, loadSpec{Rate: planned, Duration: 10 * time.Second, Output: overloadTokens, Stream: true, Header: priority("0"), Seed: 51})
	high := startLoad(t, n.URL, loadSpec{Rate: planned, Duration: 10 * time.Second, Output: overloadTokens, Stream: true, Header: priority("3"), Seed: 52})
	lowSum, lowRes := low.wait(t)
	highSum, highRes := high.wait(t)
	overEnd := time.Now()
	after, err := s.SidecarMetrics(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	calm := startLoad(t, n.URL, loadSpec{Rate: planned / 2, Duration: 6 * time.Second, Output: overloadTokens, Stream: true, Header: priority("0"), Seed: 53})
	_, calmRes := calm.wait(t)
	entries := accessLog(t, s, logBefore+lowSum.Requests+highSum.Requests)

	figure(t, "offered_rps", round2(2*planned))
	figure(t, "planned_capacity_rps", round2(planned))
	if fails := failed(append(slices.Clone(lowRes), highRes...)); len(fails) > 0 {
		t.Errorf("%d requests failed (not shed) in overload:\n%v", len(fails), fails)
	}

	dec := after.Histogram("meridian_sidecar_decision_duration_seconds").Sub(before.Histogram("meridian_sidecar_decision_duration_seconds"))
	p99 := dec.QuantileBound(0.99)
	figure(t, "sidecar_decision_p99_bound_ms", p99*1000)
	shedLat := e2es(append(slices.Clone(lowRes), highRes...), load.ClassShed)
	figure(t, "shed_response_p50_ms_client", round2(trace.Percentile(shedLat, 50)))
	figure(t, "shed_response_p99_ms_client", round2(trace.Percentile(shedLat, 99)))
	if !(p99 <= 0.005) {
		t.Errorf("sidecar decision p99 <= %g s in overload; want under 5 ms", p99)
	}

	steady := overStart.Add(4 * time.Second)
	lowShed, highShed := shedShare(lowRes, steady), shedShare(highRes, steady)
	figure(t, "shed_share_low_priority", round2(lowShed))
	figure(t, "shed_share_high_priority", round2(highShed))
	figure(t, "sheds_by_reason", after.ByLabel("meridian_sidecar_sheds_total", "reason"))
	if !(lowShed >= 0.5 && highShed <= 0.1) {
		t.Errorf("in steady overload %.2f of low-priority and %.2f of high-priority requests were shed; want low >= 0.5, high <= 0.1",
			lowShed, highShed)
	}

	admitted := ttfts(append(slices.Clone(lowRes), highRes...), steady, overEnd)
	figure(t, "ttft_p99_ms_unloaded", round2(trace.Percentile(unloaded, 99)))
	figure(t, "ttft_p99_ms_admitted_in_overload", round2(trace.Percentile(admitted, 99)))
	// Without shedding, admitted requests queue behind engines at their in-flight cap: TTFT
	// in seconds. With it they keep their TTFT, up to the noise of a p99 over a few hundred
	// requests on a shared 2-core machine (one CI run measured 90 ms against 42 ms).
	if trace.Percentile(admitted, 99) > 3*trace.Percentile(unloaded, 99) {
		t.Errorf("admitted TTFT p99 %.0f ms in overload, %.0f ms unloaded: want within 3×",
			trace.Percentile(admitted, 99), trace.Percentile(unloaded, 99))
	}

	attempts, upstream := 0, 0
	for _, e := range between(entries, overStart, overEnd) {
		if e.Attempts > 0 {
			attempts += e.Attempts
			upstream++
		}
	}
	perRequest := float64(attempts) / float64(max(upstream, 1))
	figure(t, "upstream_attempts_per_request", round2(perRequest))
	if perRequest > 1.1 {
		t.Errorf("%.2f upstream attempts per admitted request in overload: a retry storm (want <= 1.1)", perRequest)
	}

	time.Sleep(time.Second) // the last outcomes reach the sidecar
	end, err := s.SidecarMetrics(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	leaked := end.Value("meridian_sidecar_engine_in_flight")
	figure(t, "in_flight_left_after_load", leaked)
	if leaked != 0 {
		t.Errorf("the sidecar counts %v requests in flight after every request ended: tickets leaked", leaked)
	}

	lastShed := time.Duration(-1)
	for _, r := range calmRes {
		if r.Class == load.ClassShed {
			lastShed = max(lastShed, r.Sent.Sub(overEnd))
		}
	}
	figure(t, "last_shed_after_overload_ms", lastShed.Milliseconds())
	// The control server smooths demand over about 3 s, so its fraction outlives the
	// overload by 4–5 s; the sidecar stops applying it once its recent arrivals (1 s half-life)
	// fall below the rate the fraction leaves admitted.
	if lastShed > 3*time.Second {
		t.Errorf("a request was still shed %s after the overload ended at half the capacity; want within 3s", lastShed)
	}
}

// runPhase runs a load to its end and returns its TTFTs; every request must succeed.
func runPhase(t *testing.T, url string, rate float64, d time.Duration, h http.Header, seed uint64) []float64 {
	t.Helper()
	lr := startLoad(t, url, loadSpec{Rate: rate, Duration: d, Output: overloadTokens, Stream: true, Header: h, Seed: seed})
	sum, results := lr.wait(t)
	if sum.OK != sum.Requests {
		t.Fatalf("unloaded phase: %d of %d ok: %v", sum.OK, sum.Requests, failed(results))
	}
	return ttfts(results, time.Time{}, time.Now())
}

// setMaxInFlight caps every engine in the fleet file and waits for the control server to
// publish the change.
func setMaxInFlight(ctx context.Context, t *testing.T, s *stack.Stack, n int) {
	t.Helper()
	m, err := s.ControlMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	published := m.Value("meridian_control_publishes_total")
	if err := s.EditFleet(func(f *fleet.Fleet) {
		for i := range f.Engines {
			f.Engines[i].MaxInFlight = n
		}
	}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m, err = s.ControlMetrics(ctx); err == nil && m.Value("meridian_control_publishes_total") > published {
			// The push to the sidecar (which enforces the caps) can take most of a second
			// on a loaded machine: wait for it, then give Envoy a moment.
			v, err := s.ControlVersion(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := s.WaitSidecarVersion(wctx, node, v); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			return
		}
	}
	t.Fatal("the control server did not publish the capped fleet within 10s")
}

// e2es returns the sorted end-to-end latencies, in ms, of the results of class.
func e2es(results []load.Result, class string) []float64 {
	var v []float64
	for _, r := range results {
		if r.Class == class {
			v = append(v, float64(r.E2E)/float64(time.Millisecond))
		}
	}
	slices.Sort(v)
	return v
}

// shedShare is the fraction of results sent from `from` on that were shed.
func shedShare(results []load.Result, from time.Time) float64 {
	shed, total := 0, 0
	for _, r := range results {
		if r.Sent.Before(from) {
			continue
		}
		total++
		if r.Class == load.ClassShed {
			shed++
		}
	}
	if total == 0 {
		return 0
	}
	return float64(shed) / float64(total)
}
