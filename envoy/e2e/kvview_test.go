package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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
	go func() {
		_, _ = completeAt(hctx, s.Engines["k0"].Address, map[string]any{"model": model,
			"prompt": strings.Repeat("tokens! ", 6000), "max_tokens": 4000, "stream": true})
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

// TestE2EAHomeExpiresWhenItsEngineCacheTurnsOver: the real sidecar reads each mock
// engine's prefix-cache and generation counters (vLLM's), stamps a conversation's
// placement with them, and once that engine has written more than its cache holds (here
// 8,192 tokens, by other routers' prompts sent straight to it) the conversation's next
// request finds its home expired; before that, it does not.
func TestE2EAHomeExpiresWhenItsEngineCacheTurnsOver(t *testing.T) {
	small := []string{"--kv-tokens", "8192"}
	s := startStack(t, stack.Spec{
		Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}},
		Engines: []stack.EngineSpec{
			{Name: "k0", Region: "a", Models: []string{model}, Args: small},
			{Name: "k1", Region: "a", Models: []string{model}, Args: small},
		},
	})
	node := s.Nodes["region-a"]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	metrics := func() stack.Metrics {
		t.Helper()
		m, err := s.SidecarMetrics(ctx, "region-a")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	// The placement is stamped only once the sidecar has read both engines' caches.
	for deadline := time.Now().Add(30 * time.Second); metrics().Value("meridian_sidecar_engine_load_scrapes_total", "result", "ok") < 4; {
		if time.Now().After(deadline) {
			t.Fatal("the sidecar scraped no engine within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A conversation whose prompt (about 1,600 tokens) fills the whole routing key.
	conversation := strings.Repeat("the context of one conversation ", 200)
	send := func(what string) string {
		t.Helper()
		r, err := chat(ctx, node.URL, model, conversation, false, nil)
		if err != nil || r.status != 200 {
			t.Fatalf("%s: status %d, %v: %s", what, r.status, err, r.body)
		}
		return r.servedBy
	}
	home := send("first turn")
	time.Sleep(200 * time.Millisecond) // its tokens reach the engine's counters and a scrape
	send("second turn")
	if n := metrics().Value("meridian_sidecar_homes_expired_total"); n != 0 {
		t.Fatalf("%v homes expired while %s still caches the conversation, want 0", n, home)
	}
	// Other routers write 12,000 tokens of their own prompts into the home's cache.
	for i := range 6 {
		status, err := completeAt(ctx, s.Engines[home].Address, map[string]any{"model": model,
			"prompt": fmt.Sprintf("%d %s", i, strings.Repeat("someone else's prompt ", 360)), "max_tokens": 1})
		if err != nil || status != 200 {
			t.Fatalf("a prompt sent straight to %s: status %d, %v", home, status, err)
		}
	}
	time.Sleep(300 * time.Millisecond) // a few scrapes
	send("third turn")
	if n := metrics().Value("meridian_sidecar_homes_expired_total"); n != 1 {
		t.Errorf("%v homes expired after %s's cache turned over, want 1", n, home)
	}
}

// completeAt sends body to the engine at addr's /v1/completions, past Envoy and the
// sidecar (as another router would), reads the whole answer and returns its status.
func completeAt(ctx context.Context, addr string, body map[string]any) (int, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}
