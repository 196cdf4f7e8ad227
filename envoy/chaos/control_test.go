package chaos

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/xdsapi"
)

// TestChaosControlServerDies kills the control server under load for 10 s and changes the
// fleet's weights while it is away: no request fails, Envoy and the sidecar route on their
// cached snapshot meanwhile, and when it returns both resync to the new weights without
// being restarted.
func TestChaosControlServerDies(t *testing.T) {
	before := map[string]uint32{"e0": 10, "e1": 20, "e2": 30}
	after := map[string]uint32{"e0": 100, "e1": 1, "e2": 1} // e0's share: 100/102
	s := startStack(t, withCapacity(oneNode(3, before), 25))
	n := s.Nodes[node]
	pids := map[string]int{"envoy": n.Envoy.Pid(), "sidecar": n.Sidecar.Pid()}
	const (
		rate   = 30
		killAt = 2 * time.Second
		outage = 10 * time.Second
		total  = 17 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lr := startLoad(t, n.URL, loadSpec{Rate: rate, Duration: total, Output: 8, Stream: true, Seed: 1})
	lr.sleepTo(killAt)
	killed := time.Now()
	s.Control.Kill()

	lr.sleepTo(killAt + outage/2)
	if got := envoyWeightsByName(ctx, t, s); !maps.Equal(got, before) {
		t.Errorf("with the control server down Envoy holds %v, want the cached %v", got, before)
	}
	if err := s.WriteFleet(map[string]map[string]uint32{node: after}); err != nil {
		t.Fatal(err)
	}
	lr.sleepTo(killAt + outage)
	restarted := time.Now()
	if err := s.Control.Start(); err != nil {
		t.Fatal(err)
	}
	envoyResync := waitEnvoyWeights(ctx, t, s, after, 40*time.Second).Sub(restarted)
	sum, results := lr.wait(t)
	entries := accessLog(t, s, sum.Requests)

	figure(t, "requests", sum.Requests)
	fails := failed(results)
	figure(t, "failed", len(fails))
	figure(t, "shed", sum.Shed)
	if len(fails) > 0 || sum.Shed > 0 {
		t.Errorf("%d failed and %d shed of %d with the control server down for %s:\n%v", len(fails), sum.Shed, sum.Requests, outage, fails)
	}
	down := between(entries, killed, restarted)
	figure(t, "steered_share_while_down", round2(steeredShare(down)))
	if len(down) < rate*int(outage/time.Second)/2 || steeredShare(down) < 0.99 {
		t.Errorf("while the control server was down: %d requests, %.2f steered by the sidecar's cached view; want all", len(down), steeredShare(down))
	}
	figure(t, "envoy_resync_ms", envoyResync.Milliseconds())
	if envoyResync > 5*time.Second {
		t.Errorf("Envoy took %s to take the new weights after the control server returned; want <= 5s", envoyResync)
	}
	sidecarResync, ok := firstWindow(entries, restarted, 500*time.Millisecond, func(w []stack.AccessEntry) bool {
		return len(w) >= 5 && primaryShare(w, s.Engines["e0"].Address) >= 0.9
	})
	if !ok {
		t.Fatalf("the sidecar never steered by the new weights (e0 first for >= 90%% of requests) after the control server returned")
	}
	figure(t, "sidecar_resync_ms", sidecarResync.Sub(restarted).Milliseconds())
	if sidecarResync.Sub(restarted) > 5*time.Second {
		t.Errorf("the sidecar steered by the new weights %s after the control server returned; want <= 5s", sidecarResync.Sub(restarted))
	}
	for name, p := range map[string]*stack.Proc{"envoy": n.Envoy, "sidecar": n.Sidecar} {
		if p.Pid() != pids[name] {
			t.Errorf("%s was restarted (pid %d, was %d)", name, p.Pid(), pids[name])
		}
	}
}

// envoyWeightsByName is the node's Envoy view of the model cluster, by engine name.
func envoyWeightsByName(ctx context.Context, t *testing.T, s *stack.Stack) map[string]uint32 {
	t.Helper()
	ws, err := s.EnvoyWeights(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint32{}
	for addr, w := range ws[xdsapi.ClusterName(model)] {
		out[s.EngineByAddress(addr)] = w
	}
	return out
}

// waitEnvoyWeights polls Envoy until it holds want and returns when it first did.
func waitEnvoyWeights(ctx context.Context, t *testing.T, s *stack.Stack, want map[string]uint32, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	var got map[string]uint32
	for time.Now().Before(deadline) {
		if got = envoyWeightsByName(ctx, t, s); maps.Equal(got, want) {
			return time.Now()
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("after %s Envoy holds %v, want %v", within, got, want)
	return time.Time{}
}

// firstWindow slides windows of width w from `from` over the entries and returns the start
// of the first window for which ok holds.
func firstWindow(entries []stack.AccessEntry, from time.Time, w time.Duration, ok func([]stack.AccessEntry) bool) (time.Time, bool) {
	last := from
	for _, e := range entries {
		if e.Start.After(last) {
			last = e.Start
		}
	}
	for at := from; !at.After(last); at = at.Add(w / 5) {
		if ok(between(entries, at, at.Add(w))) {
			return at, true
		}
	}
	return time.Time{}, false
}
