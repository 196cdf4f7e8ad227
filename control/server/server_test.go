package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meridian-router/meridian/control/optimizer"
	"github.com/meridian-router/meridian/control/server"
	"github.com/meridian-router/meridian/control/signals"
	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/policy"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

const fleetYAML = `
models: [{name: m}]
clusters: [{name: region-a, region: a}]
engines:
  - {name: e0, address: "127.0.0.1:1", region: a, models: [m], capacity_rps: 10, metrics_url: "METRICS"}
  - {name: e1, address: "127.0.0.1:2", region: a, models: [m], capacity_rps: 10, metrics_url: "METRICS"}
rtt_ms: {region-a: {a: 1}}
`

func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := stack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

// startServer runs a control server in-process on loopback.
func startServer(t *testing.T) (xdsAddr, httpBase string) {
	t.Helper()
	return startServerWith(t, nil)
}

// startServerWith lets a test edit the server's config before it starts.
func startServerWith(t *testing.T, edit func(*server.Config)) (xdsAddr, httpBase string) {
	t.Helper()
	if edit == nil {
		return startServerFleet(t, fleetYAML)
	}
	return startServerFleet(t, fleetYAML, edit)
}

// startServerFleet is startServer on the given fleet file, with edits to its config.
func startServerFleet(t *testing.T, fleetYAML string, edits ...func(*server.Config)) (xdsAddr, httpBase string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "fleet.yaml")
	// The engines' metrics answer (with no vLLM series): an engine that cannot be scraped
	// gets no traffic.
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(metrics.Close)
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(fleetYAML, "METRICS", metrics.URL+"/metrics")), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{
		FleetPath: path, XDSListen: freeAddr(t), HTTPListen: freeAddr(t),
		PollInterval: 100 * time.Millisecond, SolvePeriod: 100 * time.Millisecond, ScrapeInterval: time.Second,
		Signals: signals.DefaultConfig(), Optimizer: optimizer.DefaultConfig(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	cfg.Signals.HalfLife = 200 * time.Millisecond
	for _, edit := range edits {
		edit(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	httpBase = "http://" + cfg.HTTPListen
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := stack.WaitHTTP(wctx, httpBase+"/healthz", http.StatusOK); err != nil {
		t.Fatalf("control server not healthy: %v", err)
	}
	return cfg.XDSListen, httpBase
}

func demand(t *testing.T, base string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/debug/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st server.State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st.Nodes["region-a"].Models["m"].DemandRPS
}

// A sidecar's reports drive the plan: demand over capacity comes back as a shed policy on
// the same stream, and the demand leaves with the stream.
func TestLoadReportsDrivePoliciesAndLeaveWithTheStream(t *testing.T) {
	xdsAddr, base := startServer(t)
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := meridianv1.NewLoadReportingClient(conn).StreamLoad(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 30 req/s against 2 × 10 × ρmax 0.9 = 18 req/s of capacity: 12 req/s must be shed.
	report := &meridianv1.LoadReport{NodeId: "region-a", SidecarId: "s1", WindowSeconds: 1,
		Demand: []*meridianv1.ModelDemand{{Model: "m", RequestsPerSecond: 30}}}
	policies := make(chan *meridianv1.Policy, 64)
	go func() {
		for {
			p, err := stream.Recv()
			if err != nil {
				close(policies)
				return
			}
			policies <- p
		}
	}()
	var shed float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && (shed < 0.39 || shed > 0.41); {
		if err := stream.Send(report); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-policies:
			for _, s := range p.GetShed() {
				if s.GetModel() == "m" {
					shed = s.GetFraction()
				}
			}
			if p.GetRetryBudget() == nil || (shed > 0 && p.GetUtilization() < 1) {
				t.Fatalf("policy %v: a shedding node must carry the retry budget and utilization >= 1", p)
			}
		case <-time.After(150 * time.Millisecond):
		}
	}
	if shed < 0.39 || shed > 0.41 {
		t.Fatalf("shed fraction %.3f, want 12/30 = 0.40", shed)
	}
	// /debug/state follows the solve that made the policy; give it a moment.
	for deadline := time.Now().Add(5 * time.Second); demand(t, base) < 25; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("/debug/state shows demand %.1f req/s, want about 30", demand(t, base))
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for range policies {
	}
	deadline := time.Now().Add(5 * time.Second)
	for demand(t, base) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("demand %.1f req/s still counted after the sidecar's stream ended", demand(t, base))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A bad report is refused without closing the stream or counting it.
func TestBadReportIsNotCounted(t *testing.T) {
	xdsAddr, base := startServer(t)
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := meridianv1.NewLoadReportingClient(conn).StreamLoad(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	bad := &meridianv1.LoadReport{NodeId: "region-a", SidecarId: "s", WindowSeconds: 0,
		Demand: []*meridianv1.ModelDemand{{Model: "m", RequestsPerSecond: 1000}}}
	if err := stream.Send(bad); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if d := demand(t, base); d != 0 {
		t.Fatalf("a report with window_seconds 0 was counted: demand %.1f", d)
	}
	_ = stream.CloseSend()
}

// The retry budget an operator configures on the control server (its --retry-* flags) is
// the one every policy carries; the sidecar takes it from the first policy on
// (extproc/server's TestPolicyRetryBudgetReplacesTheSidecarsOwn).
func TestConfiguredRetryBudgetIsSent(t *testing.T) {
	want := policy.RetryCurve{MaxRetriesIdle: 4, GenerousBelow: 0.25, ZeroAt: 0.75, RetryOn: "5xx,gateway-error"}
	xdsAddr, _ := startServerWith(t, func(c *server.Config) { c.Optimizer.RetryBudget = want })
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := meridianv1.NewLoadReportingClient(conn).StreamLoad(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&meridianv1.LoadReport{NodeId: "region-a", SidecarId: "s1", WindowSeconds: 1,
		Demand: []*meridianv1.ModelDemand{{Model: "m", RequestsPerSecond: 1}}}); err != nil {
		t.Fatal(err)
	}
	p, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	got, err := policy.CurveFromProto(p.GetRetryBudget())
	if err != nil || got != want {
		t.Fatalf("policy retry budget %+v (%v), want the configured %+v", got, err, want)
	}
}
