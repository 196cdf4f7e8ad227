package bootstrap_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/bootstrap"
	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/mtls"
)

func TestRenderRejectsBadParams(t *testing.T) {
	cases := map[string]func(*bootstrap.Params){
		"node id":         func(p *bootstrap.Params) { p.NodeID = "bad node" },
		"listen":          func(p *bootstrap.Params) { p.Listen = "localhost:80" },
		"message timeout": func(p *bootstrap.Params) { p.MessageTimeout = 0 },
		"buffer limit":    func(p *bootstrap.Params) { p.BufferLimitBytes = 10 },
		"access log path": func(p *bootstrap.Params) { p.AccessLogPath = "" },
	}
	for name, edit := range cases {
		p := bootstrap.DefaultParams()
		p.NodeID = "region-a"
		edit(&p)
		var buf bytes.Buffer
		err := bootstrap.Render(&buf, p)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: Render error = %v, want one naming %q", name, err, name)
		}
		if buf.Len() != 0 {
			t.Errorf("%s: Render wrote output for bad params", name)
		}
	}
}

// TestEnvoyValidates renders bootstraps and has a real Envoy validate them.
func TestEnvoyValidates(t *testing.T) {
	envoy := stack.RequireEnvoy(t)
	for _, trust := range []bool{false, true} {
		p := bootstrap.DefaultParams()
		p.NodeID = "region-a"
		p.MessageTimeout = 150 * time.Millisecond
		p.TrustPriorityHeader = trust
		p.WithoutSidecar = trust // exercise both shapes of the filter chain
		var buf bytes.Buffer
		if err := bootstrap.Render(&buf, p); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(buf.String(), "remove: x-meridian-priority"); got == trust {
			t.Errorf("trust=%v: priority header stripped=%v", trust, got)
		}
		if got := strings.Contains(buf.String(), "envoy.filters.http.ext_proc"); got == p.WithoutSidecar {
			t.Errorf("without sidecar=%v: ext_proc present=%v", p.WithoutSidecar, got)
		}
		path := filepath.Join(t.TempDir(), "envoy.yaml")
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(envoy, "--mode", "validate", "-c", path).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "OK") {
			t.Fatalf("envoy --mode validate: %v\n%s", err, out)
		}
	}
}

// TestDNSNames: the control server and the sidecar may be given by DNS name (a Kubernetes
// Service); Envoy gets STRICT_DNS clusters for them, and a bad name is rejected up front.
func TestDNSNames(t *testing.T) {
	p := bootstrap.DefaultParams()
	p.NodeID = "region-a"
	p.XDS, p.Sidecar = "meridian-control.meridian.svc.cluster.local:18000", "localhost:19001"
	p.Insecure = true // a name off this host: plaintext only when told (TestTrustPlaintextOnlyOnLoopback)
	var buf bytes.Buffer
	if err := bootstrap.Render(&buf, p); err != nil {
		t.Fatalf("Render with DNS names: %v", err)
	}
	out := buf.String()
	for _, want := range []string{
		"- name: meridian-xds\n      type: STRICT_DNS",
		"- name: meridian-sidecar\n      type: STRICT_DNS",
		"socket_address: {address: meridian-control.meridian.svc.cluster.local, port_value: 18000}",
		"socket_address: {address: localhost, port_value: 19001}",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("bootstrap lacks %q", want)
		}
	}
	ip := bootstrap.DefaultParams()
	ip.NodeID = "region-a"
	buf.Reset()
	if err := bootstrap.Render(&buf, ip); err != nil || strings.Contains(buf.String(), "STRICT_DNS") {
		t.Errorf("IP addresses must stay STATIC clusters (err %v)", err)
	}
	for _, bad := range []string{"control.internal", "control.internal:0", "control.internal:70000", "bad_name:18000", "-x.y:1", "10.0.0.1:", ":18000"} {
		q := p
		q.XDS = bad
		if err := bootstrap.Render(&bytes.Buffer{}, q); err == nil || !strings.Contains(err.Error(), "xds") {
			t.Errorf("xds %q: err = %v, want a rejection naming xds", bad, err)
		}
	}
	envoy := stack.RequireEnvoy(t)
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := exec.Command(envoy, "--mode", "validate", "-c", path).CombinedOutput(); err != nil || !strings.Contains(string(got), "OK") {
		t.Fatalf("envoy --mode validate: %v\n%s", err, got)
	}
}

// TestDNSNamesRouteThroughRealEnvoy: Envoy and the sidecar reach the control server, and
// Envoy the sidecar, by name; requests are routed by the sidecar.
func TestDNSNamesRouteThroughRealEnvoy(t *testing.T) {
	stack.RequireEnvoy(t)
	bins, err := stack.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := stack.StartT(t, bins, stack.Spec{
		Nodes:       []stack.NodeSpec{{Name: "region-a", Region: "a"}},
		Engines:     []stack.EngineSpec{{Name: "e0", Region: "a", Models: []string{"m"}}, {Name: "e1", Region: "a", Models: []string{"m"}}},
		ControlHost: "localhost",
		Bootstrap: func(p *bootstrap.Params) {
			p.Sidecar = strings.Replace(p.Sidecar, "127.0.0.1:", "localhost:", 1)
		},
	})
	node := s.Nodes["region-a"]
	boot, err := os.ReadFile(filepath.Join(filepath.Dir(node.AccessLog), "envoy-region-a.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(boot), "type: STRICT_DNS"); n != 2 {
		t.Fatalf("bootstrap has %d STRICT_DNS clusters, want 2 (xds and sidecar)", n)
	}
	// StartT returned: the sidecar has a snapshot and Envoy endpoints, both from the
	// control server reached by name. A request goes through the sidecar to an engine.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 5; i++ {
		body := `{"model":"m","messages":[{"role":"user","content":"hello ` + strconv.Itoa(i) + `"}],"max_tokens":4}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, node.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Served-By") == "" {
			t.Fatalf("request %d: status %d, served by %q", i, resp.StatusCode, resp.Header.Get("X-Served-By"))
		}
	}
	m, err := s.SidecarMetrics(ctx, "region-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Value("meridian_sidecar_picks_total"); got < 5 {
		t.Fatalf("the sidecar (reached by Envoy by name) picked %v times for 5 requests", got)
	}
}

// TestTrustEnvoyValidatesWithTLS renders a mutual-TLS bootstrap, writes its SDS files, and
// has a real Envoy validate it (which loads the secrets the SDS files name).
func TestTrustEnvoyValidatesWithTLS(t *testing.T) {
	envoy := stack.RequireEnvoy(t)
	dir := t.TempDir()
	ca, err := mtls.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	f, err := ca.WriteIdentity(dir, mtls.Envoy("region-a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := bootstrap.DefaultParams()
	p.NodeID = "region-a"
	p.TLS = &bootstrap.TLSFiles{Cert: f.Cert, Key: f.Key, CA: f.CA}
	if err := bootstrap.WriteSDS(p); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := bootstrap.Render(&buf, p); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"spiffe://meridian/control", "spiffe://meridian/node/region-a/sidecar", "preserve_external_request_id: false", "remove: x-request-id"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("bootstrap lacks %q", want)
		}
	}
	path := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(envoy, "--mode", "validate", "-c", path).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("envoy --mode validate: %v\n%s", err, out)
	}
}

// TestTrustPlaintextOnlyOnLoopback: a bootstrap without TLS refuses a control server or a
// sidecar off this machine unless told --insecure.
func TestTrustPlaintextOnlyOnLoopback(t *testing.T) {
	p := bootstrap.DefaultParams()
	p.NodeID = "region-a"
	var buf bytes.Buffer
	for _, xds := range []string{"10.0.0.5:18000", "meridian-control.meridian.svc:18000"} {
		p.XDS = xds
		if err := bootstrap.Render(&buf, p); err == nil || !strings.Contains(err.Error(), "xds "+xds+" is not a loopback address") {
			t.Errorf("plaintext to %s: %v, want refused", xds, err)
		}
	}
	p.Insecure = true
	if err := bootstrap.Render(&buf, p); err != nil {
		t.Errorf("with Insecure: %v", err)
	}
}
