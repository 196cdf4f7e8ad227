package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
)

// TestE2ESidecarWeighsTheTokensEachEngineHolds: mock engines on the engine model state
// their KV cache as vLLM does (vllm:cache_config_info, kv_cache_usage_perc), and the real
// sidecar, scraping them, weighs another router's long prompt on an engine by the tokens
// it holds there, not as one request at a short request's work.
func TestE2ESidecarWeighsTheTokensEachEngineHolds(t *testing.T) {
	s := startStack(t, stack.Spec{
		Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}},
		Engines: []stack.EngineSpec{
			{Name: "k0", Region: "a", Models: []string{model}},
			{Name: "k1", Region: "a", Models: []string{model}},
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Another router's request, straight to k0: a 12,000-token prompt (4 bytes a token)
	// and a long answer, so it holds its cache while the sidecar scrapes.
	hctx, hcancel := context.WithCancel(ctx)
	defer hcancel()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": strings.Repeat("tokens! ", 6000), "max_tokens": 4000, "stream": true})
	go func() {
		req, err := http.NewRequestWithContext(hctx, http.MethodPost, "http://"+s.Engines["k0"].Address+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("content-type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := s.SidecarMetrics(ctx, "region-a")
		if err != nil {
			t.Fatal(err)
		}
		observed := m.ByLabel("meridian_sidecar_engine_observed_work", "engine")
		// One request counted as a request would weigh the decode work (1,024): as tokens
		// held, it weighs its 12,000-token prompt.
		if observed["k0"] >= 10_000 {
			if observed["k1"] != 0 {
				t.Errorf("observed work %v: only k0 holds another router's request", observed)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s the sidecar observes %v of other routers' work: want k0's 12,000-token prompt", observed)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
