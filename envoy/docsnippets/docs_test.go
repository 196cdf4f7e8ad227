package docsnippets

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/meridian-router/meridian/bootstrap"
	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/xdsapi"
)

// TestEverySnippetLoads loads each configuration block of the docs as what its fence says
// it is. A block without a kind fails: nothing would check it.
func TestEverySnippetLoads(t *testing.T) {
	snips := readSnippets(t)
	loaded := 0
	for _, s := range snips {
		if !isConfig(s) {
			continue
		}
		t.Run(fmt.Sprintf("%s:%d", s.file, s.line), func(t *testing.T) {
			if err := load(s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		})
		loaded++
	}
	if loaded < 4 {
		t.Fatalf("loaded %d snippets; docs/integration.md alone has four", loaded)
	}
}

func load(s snippet) error {
	switch {
	case s.kind == "":
		return fmt.Errorf("a %s block without a kind: write ```%s <kind> (see doc.go)", s.lang, s.lang)
	case strings.HasPrefix(s.kind, "envoy."):
		_, err := decodeEnvoy(s)
		return err
	case s.kind == "meridian.fleet":
		_, err := fleet.Parse(s.String(), s.body)
		return err
	case s.kind == "meridian.sidecar":
		path := filepath.Join(os.TempDir(), fmt.Sprintf("meridian-snippet-%d.yaml", os.Getpid()))
		if err := os.WriteFile(path, s.body, 0o644); err != nil {
			return err
		}
		defer os.Remove(path)
		_, err := server.LoadConfig(path, slog.New(slog.NewTextHandler(io.Discard, nil)))
		return err
	case s.kind == "inference.networking.k8s.io/v1.InferencePool":
		return checkInferencePool(s.body)
	}
	return fmt.Errorf("unknown snippet kind %q", s.kind)
}

// TestBootstrapSnippetsRunInEnvoy runs every Bootstrap snippet through the real Envoy's
// validate mode, which also checks what the protos cannot (filter names, cluster refs).
func TestBootstrapSnippetsRunInEnvoy(t *testing.T) {
	envoy := stack.RequireEnvoy(t)
	n := 0
	for _, s := range readSnippets(t) {
		if s.kind != "envoy.config.bootstrap.v3.Bootstrap" {
			continue
		}
		n++
		path := filepath.Join(t.TempDir(), "bootstrap.yaml")
		if err := os.WriteFile(path, s.body, 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, envoy, "--mode", "validate", "-c", path, "--log-level", "error").CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("%s: envoy --mode validate: %v\n%s", s, err, out)
		}
	}
	if n == 0 {
		t.Fatal("no Bootstrap snippet in the docs: docs/integration.md should have one")
	}
}

// TestSnippetsMatchWhatMeridianServes holds the docs to the code: the cluster and route
// snippets must equal what the control server builds for the model meridian-demo, and the
// bootstrap snippet's ext_proc filter must equal the one meridian-bootstrap renders.
func TestSnippetsMatchWhatMeridianServes(t *testing.T) {
	cluster, err := xdsapi.Cluster("meridian-demo", xdsapi.DefaultClusterOptions())
	if err != nil {
		t.Fatal(err)
	}
	// For a Bootstrap, only its ext_proc filter is compared: the rest is the reader's own.
	want := map[string]proto.Message{
		"envoy.config.cluster.v3.Cluster":          cluster,
		"envoy.config.route.v3.RouteConfiguration": xdsapi.RouteConfig("meridian-demo", xdsapi.DefaultRouteOptions()),
		"envoy.config.bootstrap.v3.Bootstrap":      renderedFilter(t, "envoy.filters.http.ext_proc"),
	}
	seen := map[string]bool{}
	for _, s := range readSnippets(t) {
		w, ok := want[s.kind]
		if !ok {
			continue
		}
		seen[s.kind] = true
		got, err := decodeEnvoy(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if b, ok := got.(*bootstrapv3.Bootstrap); ok {
			got = filterOf(t, b, "envoy.filters.http.ext_proc")
			// The sidecar's outcome log is not optional: a streamed body's in-flight count
			// ends with it.
			if wl, gl := renderedAccessLog(t, "envoy.access_loggers.http_grpc"), accessLogOf(t, b, "envoy.access_loggers.http_grpc"); !proto.Equal(wl, gl) {
				o := protojson.MarshalOptions{Multiline: true}
				t.Errorf("%s: the gRPC access log differs from what meridian builds.\nmeridian:\n%s\ndocs:\n%s", s, o.Format(wl), o.Format(gl))
			}
		}
		if !proto.Equal(w, got) {
			o := protojson.MarshalOptions{Multiline: true}
			t.Errorf("%s differs from what meridian builds.\nmeridian:\n%s\ndocs:\n%s", s, o.Format(w), o.Format(got))
		}
	}
	for kind := range want {
		if !seen[kind] {
			t.Errorf("no %s snippet in the docs", kind)
		}
	}
}

// renderedFilter renders the real bootstrap template and returns one of its HTTP filters.
func renderedFilter(t *testing.T, name string) proto.Message {
	t.Helper()
	return filterOf(t, renderedBootstrap(t), name)
}

// renderedAccessLog renders the real bootstrap template and returns one of its access logs.
func renderedAccessLog(t *testing.T, name string) proto.Message {
	t.Helper()
	return accessLogOf(t, renderedBootstrap(t), name)
}

func renderedBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	p := bootstrap.DefaultParams()
	p.NodeID = "region-a"
	var buf bytes.Buffer
	if err := bootstrap.Render(&buf, p); err != nil {
		t.Fatal(err)
	}
	js, err := toJSON(snippet{body: buf.Bytes()})
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("rendered bootstrap: %v", err)
	}
	return &b
}

// accessLogOf finds an access log of the bootstrap's HTTP connection manager.
func accessLogOf(t *testing.T, b *bootstrapv3.Bootstrap, name string) proto.Message {
	t.Helper()
	for _, al := range hcmOf(t, b).GetAccessLog() {
		if al.GetName() == name {
			return al
		}
	}
	t.Fatalf("no access log %s in the bootstrap", name)
	return nil
}

// filterOf finds an HTTP filter of the bootstrap's HTTP connection manager.
func filterOf(t *testing.T, b *bootstrapv3.Bootstrap, name string) proto.Message {
	t.Helper()
	for _, hf := range hcmOf(t, b).GetHttpFilters() {
		if hf.GetName() == name {
			return hf
		}
	}
	t.Fatalf("no HTTP filter %s in the bootstrap", name)
	return nil
}

// hcmOf returns the HTTP connection manager of the bootstrap's first listener.
func hcmOf(t *testing.T, b *bootstrapv3.Bootstrap) *hcmv3.HttpConnectionManager {
	t.Helper()
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err == nil {
					return &hcm
				}
			}
		}
	}
	t.Fatal("no HTTP connection manager in the bootstrap")
	return nil
}

// TestLoadRejectsBrokenSnippets proves the loader fails on what a doc could get wrong.
func TestLoadRejectsBrokenSnippets(t *testing.T) {
	tests := []struct{ name, md string }{
		{"no kind", "```yaml\na: 1\n```\n"},
		{"unknown kind", "```yaml meridian.nothing\na: 1\n```\n"},
		{"unknown Envoy field", "```yaml envoy.config.cluster.v3.Cluster\nname: c\nconect_timeout: 1s\n```\n"},
		{"Envoy validation rule", "```yaml envoy.config.cluster.v3.Cluster\nname: c\nconnect_timeout: -1s\n```\n"},
		{"Envoy type not registered", "```yaml envoy.config.nothing.v3.Thing\nname: c\n```\n"},
		{"invalid fleet", "```yaml meridian.fleet\nmodels: []\n```\n"},
		{"pool failure mode", "```yaml inference.networking.k8s.io/v1.InferencePool\napiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n" +
			"metadata: {name: p}\nspec: {selector: {matchLabels: {a: b}}, targetPorts: [{number: 8000}], endpointPickerRef: {name: e, failureMode: Open}}\n```\n"},
		{"pool unknown field", "```yaml inference.networking.k8s.io/v1.InferencePool\napiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n" +
			"metadata: {name: p}\nspec: {selector: {matchLabels: {a: b}}, targetPorts: [{number: 8000}], extensionRef: {name: e}}\n```\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snips := parseFences("test.md", []byte(tc.md))
			if len(snips) != 1 || !isConfig(snips[0]) {
				t.Fatalf("parsed %d snippets from %q", len(snips), tc.md)
			}
			if err := load(snips[0]); err == nil {
				t.Errorf("loaded without error: %s", tc.md)
			}
		})
	}
}
