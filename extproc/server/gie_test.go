package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meridian-router/meridian/extproc/server"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
	"github.com/meridian-router/meridian/xdsapi"
)

// The Gateway API Inference Extension endpoint-picker protocol's parts beyond the
// destination header, as a GIE gateway's Envoy speaks them (gie.go).

func subsetHint(addrs ...string) *corev3.Metadata {
	vals := make([]any, len(addrs))
	for i, a := range addrs {
		vals[i] = a
	}
	st, _ := structpb.NewStruct(map[string]any{"x-gateway-destination-endpoint-subset": vals})
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb.subset_hint": st}}
}

// gieExchange plays a GIE gateway's Envoy for one request: headers with metadata_context,
// the buffered body, and, when served is set, the response headers with the served report.
func (h *harness) gieExchange(t *testing.T, body string, md *corev3.Metadata, served string) *extprocv3.ProcessingResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := h.proc.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(r *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		t.Helper()
		if err := st.Send(r); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte("/v1/chat/completions")}, {Key: ":method", RawValue: []byte("POST")}}}}}})
	r := send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
	if served != "" && r.GetImmediateResponse() == nil {
		lb, _ := structpb.NewStruct(map[string]any{"x-gateway-destination-endpoint-served": served})
		if rh := send(&extprocv3.ProcessingRequest{
			MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": lb}},
			Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}},
		}); rh.GetResponseHeaders() == nil {
			t.Fatalf("response headers answered with %v", rh)
		}
	}
	_ = st.CloseSend()
	return r
}

func TestSubsetHintLimitsTheEndpoints(t *testing.T) {
	h := newHarness(t)
	firsts := map[string]int{}
	for i := 0; i < 40; i++ {
		r := h.gieExchange(t, chatBody("llama", fmt.Sprintf("subset %d", i)), subsetHint("127.0.0.1:8002", "127.0.0.1:8003"), "")
		dest := header(r, xdsapi.HeaderDestination)
		for _, a := range strings.Split(dest, ",") {
			if a != "127.0.0.1:8002" && a != "127.0.0.1:8003" {
				t.Fatalf("request %d: destination %q lists %s, outside the subset", i, dest, a)
			}
		}
		firsts[strings.Split(dest, ",")[0]]++
	}
	if len(firsts) != 2 {
		t.Fatalf("primaries %v: the subset's two engines should share the keys", firsts)
	}
	// A one-engine subset the pick would not have put first still gets that engine.
	for i := 0; i < 10; i++ {
		r := h.gieExchange(t, chatBody("llama", fmt.Sprintf("only %d", i)), subsetHint("127.0.0.1:8001"), "")
		if dest := header(r, xdsapi.HeaderDestination); dest != "127.0.0.1:8001" {
			t.Fatalf("one-engine subset: destination %q", dest)
		}
	}
	// The same key keeps its engine within a subset.
	a := header(h.gieExchange(t, chatBody("llama", "sticky"), subsetHint("127.0.0.1:8001", "127.0.0.1:8003"), ""), xdsapi.HeaderDestination)
	b := header(h.gieExchange(t, chatBody("llama", "sticky"), subsetHint("127.0.0.1:8001", "127.0.0.1:8003"), ""), xdsapi.HeaderDestination)
	if a != b {
		t.Fatalf("one key, one subset: %q then %q", a, b)
	}
	// No eligible endpoint (an empty list, or only engines that do not serve the model): 503.
	for _, md := range []*corev3.Metadata{subsetHint(), subsetHint("10.9.9.9:8000")} {
		r := h.gieExchange(t, chatBody("llama", "nowhere"), md, "")
		if code := r.GetImmediateResponse().GetStatus().GetCode(); code != 503 {
			t.Fatalf("subset with no eligible endpoint: %v, want an immediate 503", r)
		}
	}
	// Without the key, every engine may be picked.
	r := h.gieExchange(t, chatBody("llama", "free"), nil, "")
	if got := len(strings.Split(header(r, xdsapi.HeaderDestination), ",")); got != 3 {
		t.Fatalf("no subset hint: %d engines listed, want 3", got)
	}
}

func TestServedReportIsCounted(t *testing.T) {
	h := newHarness(t)
	r := h.gieExchange(t, chatBody("llama", "served"), nil, "")
	list := strings.Split(header(r, xdsapi.HeaderDestination), ",")
	h.gieExchange(t, chatBody("llama", "served"), nil, list[0])
	h.gieExchange(t, chatBody("llama", "served"), nil, list[1])
	h.gieExchange(t, chatBody("llama", "served"), nil, "10.1.1.1:9")
	fams, err := h.srv.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() == "meridian_sidecar_served_total" {
			for _, m := range f.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if got["primary"] != 1 || got["fallback"] != 1 || got["unlisted"] != 1 {
		t.Fatalf("served counts %v, want one each of primary, fallback, unlisted", got)
	}
}

func TestSheddableRequestsAre429(t *testing.T) {
	h := newHarnessWith(t, func(c *server.Config) { c.SheddableBelow = 1 })
	h.srv.ApplyPolicy(&meridianv1.Policy{Version: "v", Shed: []*meridianv1.ModelShed{{Model: "llama", Fraction: 0.5}}})
	codes := map[int]map[int32]int{0: {}, 1: {}}
	for i := 0; i < 200; i++ {
		p := i % 2
		r := h.exchangeWith(t, "/v1/chat/completions", chatBody("llama", fmt.Sprintf("s%d", i)), map[string]string{"x-meridian-priority": strconv.Itoa(p)})
		if ir := r.GetImmediateResponse(); ir != nil {
			codes[p][int32(ir.GetStatus().GetCode())]++
		}
	}
	if codes[0][429] == 0 || codes[0][503] != 0 || codes[1][429] != 0 {
		t.Fatalf("shed status by priority %v: priority 0 (sheddable) must get 429, others 503", codes)
	}
	if _, err := server.DefaultFile().Build(nil); err == nil {
		t.Fatal("Build accepted a nil logger")
	}
	f := server.DefaultFile()
	f.Shed.SheddableBelow = f.Shed.Priorities + 1
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), "shed.sheddable_below") {
		t.Fatalf("sheddable_below past the priorities: %v", err)
	}
}

func TestHealthServiceFollowsReadiness(t *testing.T) {
	cfg := server.DefaultConfig(slog.New(slog.NewTextHandler(logWriter{t}, nil)))
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hs := health.NewServer()
	go srv.ServeHealth(ctx, hs, 10*time.Millisecond)
	addr := serve(t, func(g *grpc.Server) { healthpb.RegisterHealthServer(g, hs) })
	hc := healthpb.NewHealthClient(dial(t, addr))
	want := map[string]healthpb.HealthCheckResponse_ServingStatus{
		server.HealthLiveness: healthpb.HealthCheckResponse_SERVING, server.HealthReadiness: healthpb.HealthCheckResponse_NOT_SERVING,
		server.HealthExtProc: healthpb.HealthCheckResponse_NOT_SERVING, "": healthpb.HealthCheckResponse_NOT_SERVING,
	}
	deadline := time.Now().Add(5 * time.Second)
	for svc, w := range want {
		for {
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err == nil && r.GetStatus() == w {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("health %q: %v %v, want %v before any routing snapshot", svc, r, err, w)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// With a snapshot (the harness's sidecar has one) readiness turns SERVING.
	h := newHarness(t)
	hs2 := health.NewServer()
	go h.srv.ServeHealth(ctx, hs2, 10*time.Millisecond)
	addr2 := serve(t, func(g *grpc.Server) { healthpb.RegisterHealthServer(g, hs2) })
	hc2 := healthpb.NewHealthClient(dial(t, addr2))
	for _, svc := range []string{server.HealthReadiness, server.HealthExtProc} {
		for {
			r, err := hc2.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("health %q with a snapshot: %v %v", svc, r, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func TestDecisionsExplainWhereAndWhy(t *testing.T) {
	h := newHarness(t)
	r := h.exchangeWith(t, "/v1/chat/completions", chatBody("llama", "explain me"), map[string]string{"x-request-id": "req-1"})
	dest := header(r, xdsapi.HeaderDestination)
	h.srv.ApplyPolicy(&meridianv1.Policy{Version: "v", Shed: []*meridianv1.ModelShed{{Model: "llama", Fraction: 1}}})
	for i := 0; i < 20; i++ {
		h.exchangeWith(t, "/v1/chat/completions", chatBody("llama", fmt.Sprintf("shed %d", i)), map[string]string{"x-meridian-priority": "0"})
	}
	get := func(query string) []server.Explained {
		t.Helper()
		rec := httptest.NewRecorder()
		h.srv.DecisionsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/decisions"+query, nil))
		var doc struct{ Decisions []server.Explained }
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || rec.Code != 200 {
			t.Fatalf("GET /debug/decisions%s: %d %s", query, rec.Code, rec.Body)
		}
		return doc.Decisions
	}
	steered := get("?result=steered")
	if len(steered) != 1 || steered[0].RequestID != "req-1" || steered[0].Destination != dest ||
		steered[0].Engine == "" || steered[0].PrefixKey == "" || steered[0].RetryOn == "" {
		t.Fatalf("steered decisions %+v, want the one request to %s", steered, dest)
	}
	primary := strings.Split(dest, ",")[0]
	if byEngine := get("?engine=" + primary); len(byEngine) != 1 {
		t.Fatalf("decisions listing %s: %+v", primary, byEngine)
	}
	// By name, as the dashboard links an engine to its decisions.
	if byName := get("?engine=" + steered[0].Engine); len(byName) != 1 || byName[0].RequestID != "req-1" {
		t.Fatalf("decisions for engine %s: %+v", steered[0].Engine, byName)
	}
	if other := get("?engine=no-such-engine"); len(other) != 0 {
		t.Fatalf("decisions for an unknown engine: %+v", other)
	}
	shed := get("?result=shed_quota&limit=5")
	if len(shed) != 5 || shed[0].Status != 503 || shed[0].Priority != 0 {
		t.Fatalf("shed decisions %+v", shed)
	}
	if all := get(""); len(all) != 21 || all[0].Result != "shed_quota" || all[20].Result != "steered" {
		t.Fatalf("%d decisions, first %q last %q: want 21, newest (a shed) first", len(all), all[0].Result, all[len(all)-1].Result)
	}
}

func TestDecisionSpansCarryTheExplanation(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	h := newHarnessWith(t, func(c *server.Config) { c.Tracer = tp.Tracer("test") })
	parent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	r := h.exchangeWith(t, "/v1/chat/completions", chatBody("llama", "trace me"), map[string]string{"traceparent": parent, "x-request-id": "rq-9"})
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	sp := spans[0]
	attrs := map[string]string{}
	for _, kv := range sp.Attributes() {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	if sp.Name() != "meridian.decision" || sp.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		attrs["meridian.result"] != "steered" || attrs["meridian.engines"] != header(r, xdsapi.HeaderDestination) ||
		attrs["meridian.prefix_key"] != header(r, xdsapi.HeaderPrefixHash) || attrs["meridian.request_id"] != "rq-9" || attrs["meridian.engine"] == "" {
		t.Fatalf("span %q parent %s attributes %v", sp.Name(), sp.Parent().TraceID(), attrs)
	}
}
