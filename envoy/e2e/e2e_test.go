package e2e

import (
	"context"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/xdsapi"
)

const model = "meridian-demo"

func startStack(t *testing.T, spec stack.Spec) *stack.Stack {
	t.Helper()
	stack.RequireEnvoy(t)
	bins, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	return stack.StartT(t, bins, spec)
}

// binaries builds the project's executables once for the package's tests.
var binaries = sync.OnceValues(func() (stack.Binaries, error) {
	dir, err := os.MkdirTemp("", "meridian-e2e-bin-")
	if err != nil {
		return stack.Binaries{}, err
	}
	return stack.Build(dir)
})

func threeEngines() stack.Spec {
	return stack.Spec{
		Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}},
		Engines: []stack.EngineSpec{
			{Name: "e0", Region: "a", Models: []string{model}, Args: []string{"--ttft", "30ms", "--itl", "5ms"}},
			{Name: "e1", Region: "a", Models: []string{model}, Args: []string{"--ttft", "30ms", "--itl", "5ms"}},
			{Name: "e2", Region: "a", Models: []string{model}, Args: []string{"--ttft", "30ms", "--itl", "5ms"}},
		},
		Weights: map[string]map[string]uint32{"region-a": {"e0": 10, "e1": 20, "e2": 30}},
	}
}

// TestE2EWalkingSkeleton proves the backbone: requests go Envoy -> sidecar -> the engine the
// sidecar chose and stream back; Envoy holds the weights the control server published;
// weight changes arrive; the data plane survives losing the sidecar or the control server;
// clients cannot steer.
func TestE2EWalkingSkeleton(t *testing.T) {
	s := startStack(t, threeEngines())
	node := s.Nodes["region-a"]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t.Run("requests stream and complete through Envoy", func(t *testing.T) {
		for i := 0; i < 20; i++ {
			r, err := chat(ctx, node.URL, model, prompt(i), i%2 == 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.status != 200 || r.servedBy == "" {
				t.Fatalf("request %d: status %d served-by %q: %s", i, r.status, r.servedBy, r.body)
			}
			if i%2 == 0 {
				checkStream(t, r)
			} else {
				checkCompletion(t, r)
			}
		}
	})

	t.Run("the engine that served is the sidecar's first choice", func(t *testing.T) {
		entries := waitAccessLog(t, node.AccessLog, 20)
		steered := 0
		engines := map[string]bool{}
		for _, e := range entries {
			if e.Status != 200 || !strings.HasPrefix(e.Path, "/v1/chat/completions") {
				continue
			}
			first, _, _ := strings.Cut(e.Destination, ",")
			if first == "" || first == "-" {
				t.Fatalf("request was not steered by the sidecar: %+v", e)
			}
			if e.UpstreamHost != first || s.EngineByAddress(first) != e.ServedBy {
				t.Fatalf("served by %s (%s), sidecar chose %s first: %+v", e.ServedBy, e.UpstreamHost, first, e)
			}
			steered++
			engines[e.ServedBy] = true
		}
		if steered < 20 {
			t.Fatalf("only %d steered requests in the access log, want 20", steered)
		}
		if len(engines) < 2 {
			t.Fatalf("20 different prompts all went to %v: the split ignores weights", engines)
		}
	})

	t.Run("the same prompt keeps its engine", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			first, err := chat(ctx, node.URL, model, prompt(100+i), false, nil)
			if err != nil {
				t.Fatal(err)
			}
			for j := 0; j < 3; j++ {
				again, err := chat(ctx, node.URL, model, prompt(100+i), j%2 == 0, nil)
				if err != nil {
					t.Fatal(err)
				}
				if again.servedBy != first.servedBy {
					t.Fatalf("prompt %d went to %s, then to %s", i, first.servedBy, again.servedBy)
				}
			}
		}
	})

	t.Run("Envoy holds the published weights", func(t *testing.T) {
		assertWeightsConverge(ctx, t, s, "region-a", 2*time.Second, map[string]uint32{"e0": 10, "e1": 20, "e2": 30})
	})

	t.Run("a weight change reaches Envoy within 2s", func(t *testing.T) {
		want := map[string]uint32{"e0": 50, "e1": 5, "e2": 7}
		if err := s.WriteFleet(map[string]map[string]uint32{"region-a": want}); err != nil {
			t.Fatal(err)
		}
		assertWeightsConverge(ctx, t, s, "region-a", 2*time.Second, want)
	})

	t.Run("a client-set destination header does not steer", func(t *testing.T) {
		// Each request names one engine in the client's header. Envoy must strip it before
		// the sidecar, so what reaches Envoy's balancer is the sidecar's own list (primary and
		// fallbacks) and the request goes to its first entry, whatever the client asked for.
		before := len(readAccessLog(t, node.AccessLog))
		sent, differed := 0, 0
		for i := 0; i < 6; i++ {
			for _, e := range s.Engines {
				r, err := chat(ctx, node.URL, model, prompt(200+i), false, map[string]string{
					xdsapi.HeaderDestination: e.Address,
					xdsapi.HeaderCluster:     "meridian-xds",
					"x-envoy-retry-on":       "5xx",
				})
				if err != nil {
					t.Fatal(err)
				}
				if r.status != 200 {
					t.Fatalf("client-set headers: status %d: %s", r.status, r.body)
				}
				sent++
			}
		}
		entries := waitAccessLog(t, node.AccessLog, before+sent)[before:]
		for _, e := range entries {
			list := strings.Split(e.Destination, ",")
			if len(list) != 3 || e.UpstreamHost != list[0] {
				t.Fatalf("request served by %s with destination %q: not the sidecar's three-engine list", e.UpstreamHost, e.Destination)
			}
			differed++
		}
		if differed != sent {
			t.Fatalf("%d of %d requests in the access log", differed, sent)
		}
	})

	t.Run("requests succeed with the sidecar down (fail open)", func(t *testing.T) {
		node.Sidecar.Kill()
		served := map[string]int{}
		for i := 0; i < 30; i++ {
			r, err := chat(ctx, node.URL, model, prompt(300+i), i%2 == 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.status != 200 {
				t.Fatalf("request %d with the sidecar down: status %d: %s", i, r.status, r.body)
			}
			served[r.servedBy]++
		}
		if len(served) < 2 {
			t.Fatalf("fallback sent everything to %v: it is not the weighted split", served)
		}
		if err := node.Sidecar.Start(); err != nil {
			t.Fatal(err)
		}
		if err := s.WaitNodeReady(ctx, "region-a"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("requests succeed with the control server down", func(t *testing.T) {
		s.Control.Kill()
		for i := 0; i < 20; i++ {
			r, err := chat(ctx, node.URL, model, prompt(400+i), i%2 == 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.status != 200 {
				t.Fatalf("request %d with the control server down: status %d: %s", i, r.status, r.body)
			}
		}
		// The sidecar still steers from its cached view: the served engine is its first choice.
		before := len(readAccessLog(t, node.AccessLog))
		if _, err := chat(ctx, node.URL, model, prompt(500), false, nil); err != nil {
			t.Fatal(err)
		}
		entries := waitAccessLog(t, node.AccessLog, before+1)
		if len(entries) <= before {
			t.Fatal("no access log entry for the last request")
		}
		last := entries[len(entries)-1]
		if first, _, _ := strings.Cut(last.Destination, ","); first == "-" || first != last.UpstreamHost {
			t.Fatalf("with the control server down the sidecar did not steer: %+v", last)
		}
		// When it returns, Envoy resyncs to its new snapshot without a restart.
		want := map[string]uint32{"e0": 3, "e1": 4, "e2": 5}
		if err := s.WriteFleet(map[string]map[string]uint32{"region-a": want}); err != nil {
			t.Fatal(err)
		}
		if err := s.Control.Start(); err != nil {
			t.Fatal(err)
		}
		assertWeightsConverge(ctx, t, s, "region-a", 10*time.Second, want)
	})
}

// assertWeightsConverge waits until both the control server's published plan and Envoy's
// admin view show want (by engine name) for the model cluster.
func assertWeightsConverge(ctx context.Context, t *testing.T, s *stack.Stack, node string, within time.Duration, want map[string]uint32) {
	t.Helper()
	cluster := xdsapi.ClusterName(model)
	byName := func(hosts map[string]uint32) map[string]uint32 {
		out := map[string]uint32{}
		for addr, w := range hosts {
			out[s.EngineByAddress(addr)] = w
		}
		return out
	}
	deadline := time.Now().Add(within)
	var envoy, published map[string]uint32
	for time.Now().Before(deadline) {
		ew, err1 := s.EnvoyWeights(ctx, node)
		pw, err2 := s.PublishedWeights(ctx, node)
		if err1 == nil && err2 == nil {
			envoy, published = byName(ew[cluster]), byName(pw[cluster])
			if maps.Equal(envoy, want) && maps.Equal(published, want) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("after %s: Envoy holds %v, control published %v, want %v", within, envoy, published, want)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bins, err := binaries(); err == nil {
		os.RemoveAll(strings.TrimSuffix(bins.Control, "meridian-control"))
	}
	os.Exit(code)
}
