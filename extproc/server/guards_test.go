package server_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/meridian-router/meridian/control/xds"
	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/policy"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
	"github.com/meridian-router/meridian/xdsapi"
)

func TestRetryBudgetShrinksWithUtilization(t *testing.T) {
	h := newHarness(t)
	budget := &meridianv1.RetryBudget{MaxRetriesIdle: 3, GenerousBelow: 0.5, ZeroAt: 0.9, RetryOn: "5xx,reset"}
	// Near saturation the budget is zero: only a request that never reached an engine
	// (connection refused) may move to the next engine.
	for _, tc := range []struct {
		util    float64
		retries string
		on      string
	}{{0.1, "3", "5xx,reset"}, {0.7, "1", "5xx,reset"}, {0.95, "1", "connect-failure,refused-stream"}} {
		h.srv.ApplyPolicy(&meridianv1.Policy{Version: "v", RetryBudget: budget, Utilization: tc.util})
		r := h.exchange(t, "/v1/chat/completions", chatBody("llama", "retry me"))
		if got := header(r, "x-envoy-max-retries"); got != tc.retries {
			t.Errorf("utilization %.2f: x-envoy-max-retries %q, want %q", tc.util, got, tc.retries)
		}
		if on := header(r, "x-envoy-retry-on"); on != tc.on {
			t.Errorf("utilization %.2f: x-envoy-retry-on %q, want %q", tc.util, on, tc.on)
		}
	}
}

func TestShedsLowestPriorityFirst(t *testing.T) {
	h := newHarness(t)
	h.srv.ApplyPolicy(&meridianv1.Policy{Version: "v", Shed: []*meridianv1.ModelShed{{Model: "llama", Fraction: 0.25}}})
	shed := map[int]int{}
	sent := map[int]int{}
	for i := 0; i < 400; i++ {
		p := i % 4
		r := h.exchangeWith(t, "/v1/chat/completions", chatBody("llama", fmt.Sprintf("p%d", i)),
			map[string]string{"x-meridian-priority": strconv.Itoa(p)})
		sent[p]++
		if ir := r.GetImmediateResponse(); ir != nil {
			if ir.GetStatus().GetCode() != 503 {
				t.Fatalf("shed with status %d", ir.GetStatus().GetCode())
			}
			retryAfter := ""
			for _, hv := range ir.GetHeaders().GetSetHeaders() {
				if hv.GetHeader().GetKey() == "retry-after" {
					retryAfter = string(hv.GetHeader().GetRawValue())
				}
			}
			if retryAfter == "" {
				t.Fatal("503 without Retry-After")
			}
			shed[p]++
		}
	}
	total := shed[0] + shed[1] + shed[2] + shed[3]
	frac := float64(total) / 400
	if frac < 0.18 || frac > 0.30 {
		t.Fatalf("shed %.2f of requests, policy asked 0.25: %v", frac, shed)
	}
	if shed[3] != 0 || shed[2] != 0 || shed[0] < shed[1] {
		t.Fatalf("shed by priority %v: the lowest class must go first and the top classes not at all", shed)
	}
}

// TestFailingEnginePenalizedThenRecovers feeds Envoy-style outcomes: one engine answers
// 503, the others 200. Its share of picks must fall within seconds, then come back after it
// heals.
func TestFailingEnginePenalizedThenRecovers(t *testing.T) {
	h := newHarnessWith(t, func(c *server.Config) {
		c.PenaltyInterval = 20 * time.Millisecond
		c.Outliers.RecoverHalfLife = 300 * time.Millisecond
		c.Outliers.StatsHalfLife = 500 * time.Millisecond
	})
	const bad = "127.0.0.1:8001"
	share := func(serve func(addr string) int, n int) float64 {
		hits := 0
		for i := 0; i < n; i++ {
			r := h.exchange(t, "/v1/chat/completions", chatBody("llama", fmt.Sprintf("req %d %d", i, time.Now().UnixNano())))
			first, _, _ := strings.Cut(header(r, xdsapi.HeaderDestination), ",")
			if first == bad {
				hits++
			}
			h.srv.OnOutcome(outcome.Record{Ticket: header(r, outcome.HeaderTicket), Upstream: first, Status: serve(first),
				TTFB: 20 * time.Millisecond, Attempts: 1})
		}
		return float64(hits) / float64(n)
	}
	failing := func(addr string) int {
		if addr == bad {
			return 503
		}
		return 200
	}
	healthy := func(string) int { return 200 }
	before := share(healthy, 150)
	if before < 0.15 {
		t.Fatalf("healthy share of %s is %.2f, want about 1/3", bad, before)
	}
	deadline := time.Now().Add(10 * time.Second)
	during := 1.0
	for time.Now().Before(deadline) && during > before/2 {
		during = share(failing, 100)
	}
	if during > before/2 {
		t.Fatalf("failing engine still gets %.2f of picks after 10s (healthy %.2f)", during, before)
	}
	deadline = time.Now().Add(10 * time.Second)
	after := 0.0
	for time.Now().Before(deadline) && after < before*0.7 {
		time.Sleep(100 * time.Millisecond)
		after = share(healthy, 100)
	}
	if after < before*0.7 {
		t.Fatalf("healed engine's share %.2f did not recover toward %.2f within 10s", after, before)
	}
	if v := gauge(t, h.srv, "meridian_sidecar_engine_in_flight"); v != 0 {
		t.Fatalf("in-flight after every outcome arrived = %v, want 0", v)
	}
	mfs, err := h.srv.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	builds := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "meridian_sidecar_routing_table_builds_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "cause" {
						builds[l.GetValue()] = value(m)
					}
				}
			}
		}
	}
	if builds["view"] < 1 || builds["penalties"] < 1 {
		t.Fatalf("routing tables built by cause = %v, want at least one for the view and one for the penalties", builds)
	}
}

// gauge sums a gauge's series in the sidecar's registry.
func gauge(t *testing.T, srv *server.Server, name string) float64 {
	t.Helper()
	mfs, err := srv.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += value(m)
		}
	}
	return sum
}

func value(m *dto.Metric) float64 {
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetCounter().GetValue()
}

// Engines at EDS priority 1 get no share but follow the weighted ones in the endpoint list,
// so Envoy's retries have somewhere to go.
func TestFailoverEnginesFollowInTheList(t *testing.T) {
	h := newHarness(t)
	plan, err := xds.BuildPlan(h.fleet, func(node, model string) map[string]uint32 {
		return map[string]uint32{"a-0": 10, "a-1": 0, "a-2": 0}
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.pub.Publish(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		d := header(h.exchange(t, "/v1/chat/completions", chatBody("llama", "fail over")), xdsapi.HeaderDestination)
		if strings.HasPrefix(d, "127.0.0.1:8001,") && strings.Count(d, ",") == 2 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the destination never became the weighted engine followed by both failovers")
}

// The sidecar's own retry settings apply until the control server's first policy; from
// then on the policy's budget is the one applied.
func TestPolicyRetryBudgetReplacesTheSidecarsOwn(t *testing.T) {
	h := newHarnessWith(t, func(c *server.Config) {
		c.Retry.Curve = policy.RetryCurve{MaxRetriesIdle: 3, GenerousBelow: 0.5, ZeroAt: 0.9, RetryOn: "reset"}
	})
	r := h.exchange(t, "/v1/chat/completions", chatBody("llama", "before the policy"))
	if got, on := header(r, "x-envoy-max-retries"), header(r, "x-envoy-retry-on"); got != "3" || on != "reset" {
		t.Fatalf("before any policy: %s retries on %q, want the sidecar's own 3 on \"reset\"", got, on)
	}
	h.srv.ApplyPolicy(&meridianv1.Policy{Version: "v", RetryBudget: &meridianv1.RetryBudget{MaxRetriesIdle: 1, GenerousBelow: 0.5, ZeroAt: 0.9, RetryOn: "5xx"}})
	r = h.exchange(t, "/v1/chat/completions", chatBody("llama", "after the policy"))
	if got, on := header(r, "x-envoy-max-retries"), header(r, "x-envoy-retry-on"); got != "1" || on != "5xx" {
		t.Fatalf("after the policy: %s retries on %q, want the control server's 1 on \"5xx\"", got, on)
	}
	if c := h.srv.Core().RetryCurve(); c.MaxRetriesIdle != 1 || c.RetryOn != "5xx" {
		t.Fatalf("curve in force %+v, want the policy's", c)
	}
}
