package bootstrap_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/bootstrap"
	"github.com/meridian-router/meridian/envoy/stack"
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
