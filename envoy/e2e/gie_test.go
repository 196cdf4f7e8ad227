package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/mtls"
)

// gieEnvoy rewrites a node's bootstrap into the shape a Gateway API Inference Extension
// gateway gives Envoy for a pool's endpoint picker (GIE v1.6.0: test/testdata/envoy.yaml and
// docs/proposals/004-endpoint-picker-protocol): the request body BUFFERED, the response
// headers sent to the picker, and the envoy.lb and envoy.lb.subset_hint namespaces forwarded
// to it in metadata_context. The gateway's part of the protocol is played by two more
// filters: set_metadata puts the subset hint for every request under envoy.lb.subset_hint,
// and, on the response, a header mutation writes %UPSTREAM_HOST% that header_to_metadata
// moves to envoy.lb/x-gateway-destination-endpoint-served, the served report.
func gieEnvoy(subset []string) func(string, []byte) ([]byte, error) {
	return func(_ string, y []byte) ([]byte, error) {
		s := string(y)
		quoted := make([]string, len(subset))
		for i, a := range subset {
			quoted[i] = `"` + a + `"`
		}
		edits := []struct{ old, new string }{
			{"                      send_body_without_waiting_for_header_response: true\n", ""},
			{"request_body_mode: STREAMED", "request_body_mode: BUFFERED"},
			{"                        response_header_mode: SKIP\n                        request_body_mode", "                        response_header_mode: SEND\n                        request_body_mode"},
			{"                        receiving_namespaces:\n                          untyped: [envoy.lb, meridian.decision]\n",
				"                        receiving_namespaces:\n                          untyped: [envoy.lb, meridian.decision]\n" +
					"                        forwarding_namespaces:\n                          untyped: [envoy.lb, envoy.lb.subset_hint]\n"},
			{"                  - name: envoy.filters.http.ext_proc\n", `                  - name: gie.subset_hint
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
                      metadata:
                        - metadata_namespace: envoy.lb.subset_hint
                          value:
                            x-gateway-destination-endpoint-subset: [` + strings.Join(quoted, ", ") + `]
                  - name: envoy.filters.http.ext_proc
`},
			{"                  - name: envoy.filters.http.router\n", `                  - name: gie.served_to_metadata
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
                      response_rules:
                        - header: x-gateway-destination-endpoint-served
                          on_header_present: {metadata_namespace: envoy.lb, key: x-gateway-destination-endpoint-served, type: STRING}
                          remove: true
                  - name: gie.served_header
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
                      mutations:
                        response_mutations:
                          - append:
                              header: {key: x-gateway-destination-endpoint-served, value: "%UPSTREAM_HOST%"}
                              append_action: OVERWRITE_IF_EXISTS_OR_ADD
                  - name: envoy.filters.http.router
`},
		}
		for _, e := range edits {
			if strings.Count(s, e.old) != 1 {
				return nil, fmt.Errorf("GIE rewrite: %q occurs %d times in the bootstrap, want once", e.old, strings.Count(s, e.old))
			}
			s = strings.Replace(s, e.old, e.new, 1)
		}
		return []byte(s), nil
	}
}

// TestE2EBehindAGIEGateway runs the sidecar as the endpoint picker of an Envoy configured
// the way a GIE gateway configures it: it picks only from the gateway's subset hint, the
// gateway's served report reaches it on every response, the SDK's requests succeed, and the
// gRPC health service reports it ready.
func TestE2EBehindAGIEGateway(t *testing.T) {
	stack.RequireEnvoy(t)
	bins, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	fixed := []string{"--ttft", "10ms", "--itl", "2ms"}
	spec := stack.Spec{Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}}}
	for _, n := range []string{"e0", "e1", "e2"} {
		spec.Engines = append(spec.Engines, stack.EngineSpec{Name: n, Region: "a", Models: []string{model}, Args: fixed})
	}
	spec.BootstrapYAML = func(st *stack.Stack, node string, y []byte) ([]byte, error) {
		return gieEnvoy(subsetOf(st, "e0", "e2"))(node, y)
	}
	s := stack.StartT(t, bins, spec)
	node := s.Nodes["region-a"]
	c := sdkClient(node.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	allowed := subsetOf(s, "e0", "e2")
	const n = 30
	before := len(readAccessLog(t, node.AccessLog))
	for i := 0; i < n; i++ {
		if err := chat2(ctx, c, model); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Completions.New(ctx, completionParams(fmt.Sprintf("gie %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	used := map[string]int{}
	for _, e := range waitAccessLog(t, node.AccessLog, before+2*n)[before:] {
		for _, a := range strings.Split(e.Destination, ",") {
			if !slices.Contains(allowed, a) {
				t.Fatalf("the sidecar listed %s, outside the gateway's subset %v: %+v", a, allowed, e)
			}
		}
		if e.Status != 200 || !slices.Contains(allowed, e.UpstreamHost) {
			t.Fatalf("served outside the subset or failed: %+v", e)
		}
		used[e.UpstreamHost]++
	}
	if len(used) != 2 {
		t.Fatalf("requests went to %v: want both engines of the subset", used)
	}

	// The served report: every steered request's response headers carried it.
	var served map[string]float64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m, err := s.SidecarMetrics(ctx, "region-a")
		if err != nil {
			t.Fatal(err)
		}
		served = m.ByLabel("meridian_sidecar_served_total", "result")
		if served["primary"]+served["fallback"] >= 2*n || time.Now().After(deadline) {
			break
		}
	}
	if served["primary"]+served["fallback"] < 2*n || served["unlisted"] != 0 {
		t.Fatalf("served reports %v for %d steered requests", served, 2*n)
	}

	// The gRPC health service on the sidecar's ext_proc port.
	// The stack runs mutual TLS: the sidecar answers only its node's Envoy identity.
	creds := insecure.NewCredentials()
	if s.PKI != nil {
		src, err := mtls.NewSource(s.PKI.Files(mtls.Envoy(node.Name)), mtls.Envoy(node.Name), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		creds = src.ClientCredentials(mtls.Sidecar(node.Name))
	}
	conn, err := grpc.NewClient(argValue(node.Sidecar.Args, "--listen"), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v, want SERVING", svc, r, err)
		}
	}
}

// TestE2EGIESheddableShedIs429: behind the GIE-shaped Envoy, with requests of the default
// priority sheddable (shed.sheddable_below above it), a request shed because the only engine
// is at its in-flight cap gets the protocol's 429 through Envoy, in OpenAI's error shape
// with Retry-After, and the access log says why (the decision's shed_limit and status).
func TestE2EGIESheddableShedIs429(t *testing.T) {
	stack.RequireEnvoy(t)
	bins, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "sidecar.yaml")
	if err := os.WriteFile(cfg, []byte("shed:\n  sheddable_below: 2 # the default priority is 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := stack.Spec{Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}}, SidecarArgs: []string{"--config", cfg},
		Engines: []stack.EngineSpec{{Name: "h0", Region: "a", Models: []string{model}, MaxInFlight: 1, Args: []string{"--ttft", "10ms", "--itl", "2ms"}}}}
	spec.BootstrapYAML = func(st *stack.Stack, node string, y []byte) ([]byte, error) {
		return gieEnvoy(subsetOf(st, "h0"))(node, y)
	}
	s := stack.StartT(t, bins, spec)
	node := s.Nodes["region-a"]
	c := sdkClient(node.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if err := chat2(ctx, c, model); err != nil {
		t.Fatalf("before the engine is held: %v", err)
	}
	// h0 holds one request (its cap): the next is shed at once.
	defer holdEngine(ctx, t, s, "h0", c, model)()
	before := len(readAccessLog(t, node.AccessLog))
	shed := probeUntilShed(ctx, t, c, model, 429)
	if !strings.Contains(shed.Message, "overloaded") || shed.Type != "overloaded_error" || shed.Response.Header.Get("Retry-After") == "" {
		t.Fatalf("shed answer: type %q message %q Retry-After %q", shed.Type, shed.Message, shed.Response.Header.Get("Retry-After"))
	}
	var logged *stack.AccessEntry
	for deadline := time.Now().Add(5 * time.Second); logged == nil && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, e := range readAccessLog(t, node.AccessLog)[before:] {
			if e.Status == 429 {
				logged = &e
			}
		}
	}
	if logged == nil {
		t.Fatal("no 429 in the access log")
	}
	if d := logged.Decision; d == nil || d.Result != "shed_limit" || d.Status != 429 || d.Priority != 1 || logged.Details != "meridian_shed_limit" || logged.UpstreamHost != "" && logged.UpstreamHost != "-" {
		t.Fatalf("access log of the shed request: %+v decision %+v, want shed_limit, status 429, priority 1, no upstream", logged, logged.Decision)
	}
}

// subsetOf is the addresses of the named engines.
func subsetOf(s *stack.Stack, names ...string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = s.Engines[n].Address
	}
	return out
}

func completionParams(prompt string) openai.CompletionNewParams {
	return openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(model), MaxTokens: openai.Int(2),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}}
}

// argValue is the value after flag in args.
func argValue(args []string, flag string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return args[i+1]
		}
	}
	return ""
}
