package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"
)

// startMock serves the mock on a free 127.0.0.1 port with the given flags.
func startMock(t *testing.T, args ...string) string {
	t.Helper()
	cfg, err := parseFlags(append([]string{"--name", "mock-a", "--model", "m1,m2"}, args...))
	if err != nil {
		t.Fatalf("parseFlags: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() { done <- serve(ctx, ln, cfg, log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

type completion struct {
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func decode[T any](t *testing.T, r io.Reader) T {
	t.Helper()
	var v T
	if err := json.NewDecoder(r).Decode(&v); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return v
}

func promptBody(model, prompt string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "stream": stream,
		"stream_options": map[string]any{"include_usage": true}})
	return string(b)
}

func TestStreamingCompletionEndsWithDone(t *testing.T) {
	base := startMock(t)
	for _, tc := range []struct {
		path, body string
	}{
		{"/v1/completions", promptBody("m1", "hello there", 5, true)},
		{"/v1/chat/completions", `{"model":"m2","stream":true,"max_tokens":5,"stream_options":{"include_usage":true},` +
			`"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp := post(t, base+tc.path, tc.body)
			if resp.StatusCode != 200 || resp.Header.Get("x-served-by") != "mock-a" {
				t.Fatalf("status %d, x-served-by %q", resp.StatusCode, resp.Header.Get("x-served-by"))
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Fatalf("Content-Type %q", ct)
			}
			var events []string
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					events = append(events, line)
				}
			}
			// 5 token chunks, one usage chunk, then [DONE].
			if len(events) != 7 || events[6] != "[DONE]" {
				t.Fatalf("got %d events ending %q, want 7 ending [DONE]: %q", len(events), events[len(events)-1], events)
			}
			u := decode[completion](t, strings.NewReader(events[5]))
			if u.Usage.CompletionTokens != 5 || u.Usage.PromptTokens < 1 {
				t.Fatalf("usage chunk %+v", u.Usage)
			}
		})
	}
}

func TestCachedTokensForRepeatedAndExtendedPrompts(t *testing.T) {
	base := startMock(t, "--prefill-tokens-per-sec", "200000")
	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 100) // 4500 bytes
	first := decode[completion](t, post(t, base+"/v1/completions", promptBody("m1", long, 2, false)).Body)
	if first.Usage.PromptTokens != 1125 || first.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("cold: %+v, want 1125 prompt tokens and none cached", first.Usage)
	}
	again := decode[completion](t, post(t, base+"/v1/completions", promptBody("m1", long, 2, false)).Body)
	if got := again.Usage.PromptTokensDetails.CachedTokens; got != 1124 {
		t.Fatalf("repeat: cached %d, want 1124 (all but the last token)", got)
	}
	// A prompt that extends the first shares its 70 full blocks of 64 bytes (16 tokens).
	ext := decode[completion](t, post(t, base+"/v1/completions", promptBody("m1", long+"And then?", 2, false)).Body)
	if got := ext.Usage.PromptTokensDetails.CachedTokens; got != 70*16 {
		t.Fatalf("extension: cached %d, want %d", got, 70*16)
	}
}

func ttft(t *testing.T, url, body string) time.Duration {
	t.Helper()
	start := time.Now()
	resp := post(t, url, body)
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("read first event: %v", err)
	}
	d := time.Since(start)
	_, _ = io.Copy(io.Discard, br)
	return d
}

func TestCachedPromptHasShorterTTFT(t *testing.T) {
	// 40,000 bytes are 10,000 tokens: two 8192-token prefill steps at 20,000 tokens/s
	// (at least 500 ms) when cold, one step of about 13 ms when cached. The margin keeps
	// the test meaningful on a busy machine.
	base := startMock(t, "--prefill-tokens-per-sec", "20000")
	body := promptBody("m1", strings.Repeat("abcdefgh", 5000), 1, true)
	cold := ttft(t, base+"/v1/completions", body)
	warm := ttft(t, base+"/v1/completions", body)
	if cold < 500*time.Millisecond || warm > cold/2 {
		t.Fatalf("cold TTFT %v, warm %v: want cold >= 500ms and warm < cold/2", cold, warm)
	}
}

func TestFixedLatencyMode(t *testing.T) {
	base := startMock(t, "--ttft", "60ms", "--itl", "10ms")
	start := time.Now()
	c := decode[completion](t, post(t, base+"/v1/completions", promptBody("m1", "x", 5, false)).Body)
	if took := time.Since(start); took < 100*time.Millisecond || c.Usage.CompletionTokens != 5 {
		t.Fatalf("5 tokens in %v (want >= 60ms + 4 x 10ms), usage %+v", took, c.Usage)
	}
	if got := ttft(t, base+"/v1/completions", promptBody("m1", "x", 3, true)); got < 60*time.Millisecond {
		t.Fatalf("streamed TTFT %v, want >= 60ms", got)
	}
}

func TestMetricsUseVLLMNames(t *testing.T) {
	base := startMock(t)
	post(t, base+"/v1/completions", promptBody("m1", strings.Repeat("y", 400), 3, false))
	post(t, base+"/v1/completions", promptBody("m1", strings.Repeat("y", 400), 3, false))
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`vllm:num_requests_running{engine="mock-a",model_name="m1"} 0`,
		`vllm:num_requests_waiting{engine="mock-a",model_name="m2"} 0`,
		`vllm:kv_cache_usage_perc{engine="mock-a",model_name="m1"}`,
		`vllm:cache_config_info{block_size="`,
		`num_gpu_blocks="`,
		`vllm:prefix_cache_queries_total{engine="mock-a",model_name="m1"} 200`,
		`vllm:prefix_cache_hits_total{engine="mock-a",model_name="m1"} 99`,
		`vllm:time_to_first_token_seconds_count{engine="mock-a",model_name="m1"} 2`,
		`vllm:inter_token_latency_seconds_count{engine="mock-a",model_name="m1"} 4`,
		`vllm:e2e_request_latency_seconds_bucket{engine="mock-a",model_name="m1",le="+Inf"} 2`,
	} {
		if !strings.Contains(string(text), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func setFaults(t *testing.T, base, body string) int {
	t.Helper()
	return post(t, base+"/admin/faults", body).StatusCode
}

func TestFaultInjectionAtRunTime(t *testing.T) {
	base := startMock(t, "--ttft", "20ms", "--itl", "1ms")
	// Generous for a busy machine; the hang case waits it out.
	client := &http.Client{Timeout: time.Second}
	gen := func() (*http.Response, error) {
		return client.Post(base+"/v1/completions", "application/json", strings.NewReader(promptBody("m1", "x", 2, false)))
	}
	tests := []struct {
		name   string
		faults string
		check  func(t *testing.T, resp *http.Response, err error)
	}{
		{"error_rate 1", `{"error_rate":1}`, func(t *testing.T, resp *http.Response, err error) {
			if err != nil || resp.StatusCode != 500 || resp.Header.Get("x-served-by") != "mock-a" {
				t.Fatalf("want a 500 from mock-a, got %v %v", resp, err)
			}
		}},
		{"close_connections", `{"close_connections":true}`, func(t *testing.T, resp *http.Response, err error) {
			if err == nil {
				t.Fatalf("want a transport error, got status %d", resp.StatusCode)
			}
		}},
		{"hang", `{"hang":true}`, func(t *testing.T, resp *http.Response, err error) {
			if err == nil {
				t.Fatalf("want a client timeout, got status %d", resp.StatusCode)
			}
		}},
		{"no faults", `{}`, func(t *testing.T, resp *http.Response, err error) {
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("want 200, got %v %v", resp, err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if status := setFaults(t, base, tc.faults); status != 200 {
				t.Fatalf("POST /admin/faults %s: status %d", tc.faults, status)
			}
			resp, err := gen()
			if resp != nil {
				defer resp.Body.Close()
			}
			tc.check(t, resp, err)
		})
	}
	for _, bad := range []string{`{"error_rate":2}`, `{"latency_multiplier":0}`, `{"eror_rate":0.5}`} {
		if status := setFaults(t, base, bad); status != 400 {
			t.Errorf("POST /admin/faults %s: status %d, want 400", bad, status)
		}
	}
}

func TestLatencyMultiplier(t *testing.T) {
	base := startMock(t, "--ttft", "30ms", "--itl", "1ms")
	if status := setFaults(t, base, `{"latency_multiplier":4}`); status != 200 {
		t.Fatalf("set faults: %d", status)
	}
	resp, err := http.Get(base + "/admin/faults")
	if err != nil {
		t.Fatal(err)
	}
	f := decode[Faults](t, resp.Body)
	resp.Body.Close()
	if f.LatencyMultiplier != 4 || f.Hang || f.ErrorRate != 0 {
		t.Fatalf("GET /admin/faults = %+v", f)
	}
	if got := ttft(t, base+"/v1/completions", promptBody("m1", "x", 1, true)); got < 120*time.Millisecond {
		t.Fatalf("TTFT %v with multiplier 4, want >= 120ms", got)
	}
}

func TestModelsHealthAndErrors(t *testing.T) {
	base := startMock(t)
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	models := decode[struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}](t, resp.Body)
	resp.Body.Close()
	if len(models.Data) != 2 || models.Data[0].ID != "m1" || models.Data[1].ID != "m2" {
		t.Fatalf("models %+v", models)
	}
	health, err := http.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	health.Body.Close()
	if health.StatusCode != 200 || health.Header.Get("x-served-by") != "mock-a" {
		t.Fatalf("health: %d %q", health.StatusCode, health.Header.Get("x-served-by"))
	}
	for _, tc := range []struct {
		body string
		want int
	}{
		{promptBody("other", "x", 1, false), 404},
		{`{"model":"m1"}`, 400},
		{`{"model":"m1","prompt":"x","max_tokens":0}`, 400},
		{promptBody("m1", strings.Repeat("z", 4*200_000), 1, false), 400}, // beyond the KV cache
	} {
		if got := post(t, base+"/v1/completions", tc.body).StatusCode; got != tc.want {
			t.Errorf("body %.60s: status %d, want %d", tc.body, got, tc.want)
		}
	}
}

func TestHelpAndBadFlags(t *testing.T) {
	if _, err := parseFlags([]string{"--model", ""}); err == nil {
		t.Error("empty --model accepted")
	}
	if _, err := parseFlags([]string{"--error-rate", "1.5"}); err == nil || !strings.Contains(err.Error(), "error_rate") {
		t.Errorf("--error-rate 1.5: %v", err)
	}
	if _, err := parseFlags([]string{"--block-tokens", "0"}); err == nil || !strings.Contains(err.Error(), "BlockTokens") {
		t.Errorf("--block-tokens 0: %v", err)
	}
}

// scrapeLoad reads the engine at base's /metrics as the sidecar's load scrape does.
func scrapeLoad(t *testing.T, base string) enginemetrics.Load {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	l, err := enginemetrics.ParseLoad(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The mock states its KV cache as vLLM does (cache_config_info), and the sidecar's load
// read finds its capacity there; with fixed latencies it has no cache and states none.
func TestMetricsStateTheKVCache(t *testing.T) {
	if l := scrapeLoad(t, startMock(t, "--kv-tokens", "160000", "--block-tokens", "16")); l.KVTokens != 160000 || l.KVUsage != 0 {
		t.Errorf("model mock: %+v, want 160000 KV tokens at usage 0", l)
	}
	if l := scrapeLoad(t, startMock(t, "--ttft", "10ms")); l.KVTokens != 0 {
		t.Errorf("fixed-latency mock states %v KV tokens, want none", l.KVTokens)
	}
}

// vllm:prompt_tokens_total counts a prompt once its first token is out, as vLLM's does,
// not when the request finishes: the sidecar reads the prompts in prefill as
// prefix_cache_queries_total less it. Both modes: the engine model and fixed latencies.
func TestPromptTokensCountAtTheFirstToken(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		output int
	}{{nil, 1000}, {[]string{"--ttft", "20ms", "--itl", "400ms"}, 4}} {
		args := tc.args
		base := startMock(t, args...)
		resp := post(t, base+"/v1/completions", promptBody("m1", strings.Repeat("y", 400), tc.output, true))
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil { // the first token's event
			t.Fatalf("%v: read the first event: %v", args, err)
		}
		m, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		l, err := enginemetrics.ParseLoad(m.Body)
		m.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := l.InPrefill(); !ok || l.Running == 0 || p != 0 || l.PromptTokens <= 0 {
			t.Errorf("%v: decoding after its first token: running %v, prompt tokens %v, in prefill %v (%v); want the prompt counted, none in prefill",
				args, l.Running, l.PromptTokens, p, ok)
		}
	}
}

// vllm:request_success_total counts a request once it finishes, as vLLM's does: the
// sidecar reads its rate for how soon running requests free their KV blocks. Both modes,
// on an engine serving one model (vLLM's shape: one series per engine and model).
func TestFinishedRequestsAreCounted(t *testing.T) {
	for _, args := range [][]string{nil, {"--ttft", "5ms", "--itl", "1ms"}} {
		base := startMock(t, append([]string{"--model", "m1"}, args...)...)
		finished := func() float64 { return scrapeLoad(t, base).Finished }
		if got := finished(); got != 0 {
			t.Errorf("%v: a fresh engine states %v finished requests, want 0", args, got)
		}
		for range 2 {
			resp := post(t, base+"/v1/completions", promptBody("m1", "hello there", 3, false))
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				t.Fatal(err)
			}
		}
		if got := finished(); got != 2 {
			t.Errorf("%v: after two answered requests the engine states %v finished, want 2", args, got)
		}
	}
}
