package xds

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/xdsapi"
)

const fleetYAML = `
models: [{name: llama}, {name: qwen}]
clusters: [{name: region-a, region: a}, {name: region-b, region: b}]
engines:
  - {name: a-0, address: "127.0.0.1:8001", region: a, models: [llama], capacity_rps: 10}
  - {name: a-1, address: "127.0.0.1:8002", region: a, models: [llama, qwen], capacity_rps: 30}
  - {name: b-0, address: "127.0.0.1:8003", region: b, models: [llama], capacity_rps: 20, draining: true}
rtt_ms: {region-a: {a: 1, b: 40}, region-b: {a: 40, b: 1}}
weights:
  region-a: {a-0: 7, a-1: 3, b-0: 0}
`

func mustFleet(t *testing.T) *fleet.Fleet {
	t.Helper()
	f, err := fleet.Parse("fleet.yaml", []byte(fleetYAML))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func TestBuildPlanStaticAndCapacityWeights(t *testing.T) {
	f := mustFleet(t)
	p, err := BuildPlan(f, StaticWeights(f))
	if err != nil {
		t.Fatal(err)
	}
	a := p.Assignments["region-a"]["llama"]
	if len(a) != 2 || a[0].Engine != "a-0" || a[0].Weight != 7 || a[1].Weight != 3 {
		t.Fatalf("region-a llama = %+v, want a-0:7 a-1:3 and b-0 left out", a)
	}
	b := p.Assignments["region-b"]["llama"]
	// No static weights for region-b: capacity-proportional, largest = 1000.
	want := map[string]uint32{"a-0": 333, "a-1": 1000, "b-0": 667}
	for _, e := range b {
		if want[e.Engine] != e.Weight {
			t.Errorf("region-b %s weight %d, want %d", e.Engine, e.Weight, want[e.Engine])
		}
		if e.Engine == "b-0" && !e.Draining {
			t.Error("b-0 is draining in the fleet but not in the plan")
		}
	}
	if q := p.Assignments["region-a"]["qwen"]; len(q) != 1 || q[0].Engine != "a-1" {
		t.Fatalf("qwen on region-a = %+v: only a-1 serves it", q)
	}
}

func TestPublishVersionsAndRefusesBadPlans(t *testing.T) {
	ctx := context.Background()
	f := mustFleet(t)
	pub := NewPublisher(testLogger(t), xdsapi.DefaultClusterOptions(), xdsapi.DefaultRouteOptions())
	plan, err := BuildPlan(f, StaticWeights(f))
	if err != nil {
		t.Fatal(err)
	}
	changed, err := pub.Publish(ctx, plan)
	if err != nil || len(changed) != 2 {
		t.Fatalf("first publish: changed=%v err=%v", changed, err)
	}
	v1 := pub.Version()
	snapA, err := pub.Cache().GetSnapshot("region-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.RouteType} {
		if got := snapA.GetVersion(typ); got != v1 {
			t.Errorf("%s version %q, want the snapshot version %q for every type", typ, got, v1)
		}
	}
	cla := snapA.GetResources(resourcev3.EndpointType)[xdsapi.ClusterName("llama")].(*endpointv3.ClusterLoadAssignment)
	if n := len(cla.GetEndpoints()[0].GetLbEndpoints()); n != 2 {
		t.Fatalf("region-a llama has %d endpoints, want 2", n)
	}

	// The same plan again changes nothing.
	if changed, err := pub.Publish(ctx, plan); err != nil || len(changed) != 0 || pub.Version() != v1 {
		t.Fatalf("republish: changed=%v err=%v version %s -> %s", changed, err, v1, pub.Version())
	}
	// A change to one node bumps the version and touches only that node.
	plan2, _ := BuildPlan(f, func(node, model string) map[string]uint32 {
		if node == "region-a" {
			return map[string]uint32{"a-0": 1, "a-1": 9}
		}
		return StaticWeights(f)(node, model)
	})
	changed, err = pub.Publish(ctx, plan2)
	if err != nil || len(changed) != 1 || changed[0] != "region-a" || pub.Version() == v1 {
		t.Fatalf("second publish: changed=%v err=%v version=%s", changed, err, pub.Version())
	}
	if snapB, _ := pub.Cache().GetSnapshot("region-b"); snapB.GetVersion(resourcev3.EndpointType) != v1 {
		t.Fatal("an unchanged node got a new version")
	}
	v2 := pub.Version()

	// A weight of 0 in an assignment is refused, and nothing is published.
	bad, _ := BuildPlan(f, StaticWeights(f))
	bad.Assignments["region-b"]["llama"][0].Weight = 0
	if _, err := pub.Publish(ctx, bad); err == nil || !strings.Contains(err.Error(), "weight 0") {
		t.Fatalf("zero weight: err = %v", err)
	}
	// A default model without a cluster is refused.
	bad2, _ := BuildPlan(f, StaticWeights(f))
	bad2.DefaultModel = "mistral"
	if _, err := pub.Publish(ctx, bad2); err == nil {
		t.Fatal("default model without a cluster was published")
	}
	if pub.Version() != v2 || pub.Plan() != plan2 {
		t.Fatal("a refused plan replaced the last good one")
	}
}

func TestVersionsDifferAcrossInstances(t *testing.T) {
	f := mustFleet(t)
	plan, _ := BuildPlan(f, StaticWeights(f))
	p1 := NewPublisher(testLogger(t), xdsapi.DefaultClusterOptions(), xdsapi.DefaultRouteOptions())
	p2 := NewPublisher(testLogger(t), xdsapi.DefaultClusterOptions(), xdsapi.DefaultRouteOptions())
	_, _ = p1.Publish(context.Background(), plan)
	_, _ = p2.Publish(context.Background(), plan)
	if p1.Version() == p2.Version() {
		t.Fatalf("two server instances both published version %s: a reconnecting Envoy would miss the restart's snapshot", p1.Version())
	}
}

func TestZeroWeightEnginesBecomeFailovers(t *testing.T) {
	f := mustFleet(t)
	plan, err := BuildPlan(f, func(node, model string) map[string]uint32 {
		return map[string]uint32{"a-0": 5, "a-1": 0} // a-1: no share, failover only
	})
	if err != nil {
		t.Fatal(err)
	}
	eps := plan.Assignments["region-a"]["llama"]
	if len(eps) != 2 || eps[0].Priority != 0 || eps[1].Engine != "a-1" || eps[1].Priority != 1 || eps[1].Weight != 1 {
		t.Fatalf("assignment %+v: want a-0 at priority 0 and a-1 as a weight-1 failover at priority 1", eps)
	}
	pub := NewPublisher(testLogger(t), xdsapi.DefaultClusterOptions(), xdsapi.DefaultRouteOptions())
	if _, err := pub.Publish(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	snap, _ := pub.Cache().GetSnapshot("region-a")
	cla := snap.GetResources(resourcev3.EndpointType)[xdsapi.ClusterName("llama")].(*endpointv3.ClusterLoadAssignment)
	if len(cla.GetEndpoints()) != 2 || cla.GetEndpoints()[1].GetPriority() != 1 {
		t.Fatalf("EDS localities %v: want priorities 0 and 1", cla.GetEndpoints())
	}
	back, err := xdsapi.EndpointsOf(cla)
	if err != nil || len(back) != 2 || back[1].Priority != 1 {
		t.Fatalf("decoded %+v, %v", back, err)
	}
	// The fleet file's own 0 still means "leave out".
	static, _ := BuildPlan(f, StaticWeights(f))
	for _, e := range static.Assignments["region-a"]["llama"] {
		if e.Engine == "b-0" {
			t.Fatal("a static weight of 0 kept the engine")
		}
	}
}

// Each endpoint carries its engine's metrics URL (the fleet's metrics_url, by default
// http://address/metrics) to the sidecar, which scrapes the engine's queue from it; a
// URL that is not absolute http(s) is refused before it reaches a cache.
func TestEndpointsCarryMetricsURLs(t *testing.T) {
	f := mustFleet(t)
	plan, err := BuildPlan(f, StaticWeights(f))
	if err != nil {
		t.Fatal(err)
	}
	eps := plan.Assignments["region-a"]["llama"]
	for _, ep := range eps {
		e, _ := f.Engine(ep.Engine)
		if ep.MetricsURL == "" || ep.MetricsURL != e.MetricsURL {
			t.Errorf("engine %s: metrics URL %q, want the fleet's %q", ep.Engine, ep.MetricsURL, e.MetricsURL)
		}
	}
	cla, err := xdsapi.LoadAssignment("model-llama", eps)
	if err != nil {
		t.Fatal(err)
	}
	back, err := xdsapi.EndpointsOf(cla)
	if err != nil {
		t.Fatal(err)
	}
	for i := range back {
		if back[i].MetricsURL != eps[i].MetricsURL {
			t.Errorf("decoded metrics URL %q, encoded %q", back[i].MetricsURL, eps[i].MetricsURL)
		}
	}
	for _, bad := range []string{"ftp://10.0.0.1/metrics", "/metrics", "http://user:pw@10.0.0.1/metrics"} {
		eps[0].MetricsURL = bad
		if _, err := xdsapi.LoadAssignment("model-llama", eps); err == nil || !strings.Contains(err.Error(), "metrics URL") {
			t.Errorf("metrics URL %q: error %v, want a refusal naming the metrics URL", bad, err)
		}
	}
}
