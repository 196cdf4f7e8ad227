package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/xds"
	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/extproc/xdsclient"
	"github.com/meridian-router/meridian/xdsapi"
)

const fleetYAML = `
models: [{name: llama}, {name: qwen}]
clusters: [{name: region-a, region: a}]
engines:
  - {name: a-0, address: "127.0.0.1:8001", region: a, models: [llama], capacity_rps: 10}
  - {name: a-1, address: "127.0.0.1:8002", region: a, models: [llama, qwen], capacity_rps: 10}
  - {name: a-2, address: "127.0.0.1:8003", region: a, models: [llama], capacity_rps: 10}
rtt_ms: {region-a: {a: 1}}
`

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// harness runs a real xDS server (control/xds), a sidecar subscribed to it with the
// xdsclient, and the sidecar's ext_proc service, all over loopback gRPC.
type harness struct {
	pub   *xds.Publisher
	fleet *fleet.Fleet
	srv   *server.Server
	proc  extprocv3.ExternalProcessorClient
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessWith(t, nil)
}

// newHarnessWith lets a test edit the sidecar's config before it starts.
func newHarnessWith(t *testing.T, edit func(*server.Config)) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(logWriter{t}, nil))
	f, err := fleet.Parse("fleet.yaml", []byte(fleetYAML))
	if err != nil {
		t.Fatal(err)
	}
	pub := xds.NewPublisher(log, xdsapi.DefaultClusterOptions(), xdsapi.DefaultRouteOptions())
	plan, err := xds.BuildPlan(f, xds.StaticWeights(f))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, plan); err != nil {
		t.Fatal(err)
	}
	xdsAddr := serve(t, func(g *grpc.Server) {
		discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, pub.Cache(), nil))
	})
	cfg := server.DefaultConfig(log)
	// 2^12 buckets instead of 2^18: shares are still exact to 0.02%, and every rebuild (each
	// penalty step) takes a millisecond instead of hundreds under the race detector.
	cfg.Picker.Buckets = 1 << 12
	if edit != nil {
		edit(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn := dial(t, xdsAddr)
	updated := make(chan struct{}, 1)
	// The goroutines log through t, so the test waits for them before it ends: a log line
	// after the test has returned is a data race in package testing.
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { srv.Run(ctx) })
	wg.Go(func() {
		_ = xdsclient.Run(ctx, xdsclient.Config{NodeID: "region-a", Conn: conn, Log: log, OnUpdate: func(v *xdsclient.View) {
			srv.Update(v)
			select {
			case updated <- struct{}{}:
			default:
			}
		}})
	})
	select {
	case <-updated:
	case <-time.After(30 * time.Second): // a bound, not a timing assertion
		t.Fatal("the sidecar got no xDS view within 30s")
	}
	procAddr := serve(t, func(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, srv) })
	return &harness{pub: pub, fleet: f, srv: srv, proc: extprocv3.NewExternalProcessorClient(dial(t, procAddr))}
}

func serve(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	register(g)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// exchange plays Envoy for one request: headers, then the body; returns the body response.
func (h *harness) exchange(t *testing.T, path, body string) *extprocv3.ProcessingResponse {
	t.Helper()
	return h.exchangeWith(t, path, body, nil)
}

func (h *harness) exchangeWith(t *testing.T, path, body string, extra map[string]string) *extprocv3.ProcessingResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := h.proc.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":path", RawValue: []byte(path)}, {Key: ":method", RawValue: []byte("POST")},
	}}
	for k, v := range extra {
		hdrs.Headers = append(hdrs.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || r.GetRequestHeaders() == nil {
		t.Fatalf("headers response: %v %v", r, err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	return r
}

func header(r *extprocv3.ProcessingResponse, name string) string {
	for _, h := range r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == name {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

func chatBody(model, content string) string {
	b, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

func TestSteersFromTheXDSView(t *testing.T) {
	h := newHarness(t)
	addrs := map[string]bool{"127.0.0.1:8001": true, "127.0.0.1:8002": true, "127.0.0.1:8003": true}
	firsts := map[string]int{}
	for i := 0; i < 60; i++ {
		r := h.exchange(t, "/v1/chat/completions", chatBody("llama", fmt.Sprintf("prompt %d", i)))
		dest := header(r, xdsapi.HeaderDestination)
		list := strings.Split(dest, ",")
		if len(list) != 3 {
			t.Fatalf("destination %q: want primary + 2 fallbacks", dest)
		}
		seen := map[string]bool{}
		for _, a := range list {
			if !addrs[a] || seen[a] {
				t.Fatalf("destination %q: unknown or repeated engine %s", dest, a)
			}
			seen[a] = true
		}
		firsts[list[0]]++
		if got := header(r, xdsapi.HeaderCluster); got != xdsapi.ClusterName("llama") {
			t.Fatalf("cluster header %q", got)
		}
		md := r.GetDynamicMetadata().GetFields()[xdsapi.MetadataNamespaceLB].GetStructValue().GetFields()[xdsapi.HeaderDestination]
		if md.GetStringValue() != dest {
			t.Fatalf("envoy.lb metadata %q != header %q", md.GetStringValue(), dest)
		}
		if !r.GetRequestBody().GetResponse().GetClearRouteCache() {
			t.Fatal("route cache not cleared: Envoy would keep the route chosen before the cluster header")
		}
	}
	if len(firsts) != 3 {
		t.Fatalf("60 prompts used primaries %v, want all three engines", firsts)
	}
	// qwen is served by a-1 only.
	r := h.exchange(t, "/v1/chat/completions", chatBody("qwen", "hi"))
	if got := header(r, xdsapi.HeaderDestination); got != "127.0.0.1:8002" {
		t.Fatalf("qwen destination %q, want only a-1", got)
	}
}

func TestSameSnapshotSamePick(t *testing.T) {
	h1, h2 := newHarness(t), newHarness(t)
	for i := 0; i < 30; i++ {
		body := chatBody("llama", fmt.Sprintf("shared conversation %d", i))
		d1 := header(h1.exchange(t, "/v1/chat/completions", body), xdsapi.HeaderDestination)
		d2 := header(h2.exchange(t, "/v1/chat/completions", body), xdsapi.HeaderDestination)
		if d1 != d2 {
			t.Fatalf("two sidecars with the same snapshot disagree: %q vs %q", d1, d2)
		}
	}
}

func TestClientErrorsAreOpenAIShaped(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		body   string
		status int
		typ    string
	}{
		{chatBody("mistral", "hi"), 404, "not_found_error"},
		{`{"model":`, 400, "invalid_request_error"},
		{`{"model":"llama","messages":[]}`, 400, "invalid_request_error"},
	}
	for _, tc := range cases {
		r := h.exchange(t, "/v1/chat/completions", tc.body)
		ir := r.GetImmediateResponse()
		if ir == nil || int(ir.GetStatus().GetCode()) != tc.status {
			t.Fatalf("%s: got %v, want immediate %d", tc.body, r, tc.status)
		}
		var doc struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(ir.GetBody(), &doc); err != nil || doc.Error.Type != tc.typ || doc.Error.Message == "" || doc.Error.Code != tc.status {
			t.Fatalf("%s: body %s (%v)", tc.body, ir.GetBody(), err)
		}
	}
	// Paths that are not generation APIs pass through untouched.
	r := h.exchange(t, "/v1/models", "")
	if r.GetRequestBody() == nil || header(r, xdsapi.HeaderDestination) != "" {
		t.Fatalf("/v1/models was steered: %v", r)
	}
}
