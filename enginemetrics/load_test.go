package enginemetrics

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseLoadAgreesWithParse(t *testing.T) {
	for _, gen := range []names{current, older} {
		for _, twin := range []bool{false, true} {
			m := fixture
			m.dataParallelTwin = twin
			text := exposition(gen, m)
			full, err := Parse(strings.NewReader(text))
			if err != nil {
				t.Fatal(err)
			}
			l, err := ParseLoad(strings.NewReader(text))
			if err != nil {
				t.Fatal(err)
			}
			if l.Running != full.Running || l.Waiting != full.Waiting || l.Requests() != full.Running+full.Waiting ||
				math.Abs(l.KVUsage-full.KVCacheUsage) > 1e-12 {
				t.Errorf("%s twin=%v: ParseLoad %+v, Parse running %v waiting %v", gen.kv, twin, l, full.Running, full.Waiting)
			}
		}
	}
}

func TestParseLoadLines(t *testing.T) {
	text := "# HELP vllm:num_requests_running x\n" +
		"vllm:num_requests_running_extra 100\n" + // a longer name is another metric
		"vllm:num_requests_running{model_name=\"a b}\"} 2 1700000000000\n" + // a timestamp follows the value
		"vllm:num_requests_waiting 3\n"
	l, err := ParseLoad(strings.NewReader(text))
	if err != nil || l.Running != 2 || l.Waiting != 3 {
		t.Fatalf("ParseLoad = %+v, %v; want running 2 waiting 3", l, err)
	}
	if _, err := ParseLoad(strings.NewReader("process_cpu_seconds_total 1\n")); err == nil {
		t.Error("an exposition without the load gauges must fail, not read as an idle engine")
	}
	if _, err := ParseLoad(strings.NewReader("vllm:num_requests_waiting{a=\"b\"} many\n")); err == nil {
		t.Error("a gauge whose value is not a number must fail")
	}
}

// The KV cache's use and capacity: the usage gauge (either name) and vLLM's
// cache_config_info labels, num_gpu_blocks x block_size.
func TestParseLoadReadsTheKVCache(t *testing.T) {
	text := "vllm:num_requests_running 1\n" +
		`vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",my_num_gpu_blocks="7",num_gpu_blocks="661"} 1` + "\n" +
		`vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25` + "\n"
	l, err := ParseLoad(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if held, ok := l.KVHeld(); !ok || l.KVTokens != 661*16 || held != 0.25*661*16 {
		t.Errorf("ParseLoad = %+v (held %v, %v); want 661 x 16 tokens, a quarter held", l, held, ok)
	}
	l, err = ParseLoad(strings.NewReader("vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.5\n" +
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1` + "\n"))
	if err != nil || l.KVUsage != 0.5 || l.KVTokens != 0 {
		t.Errorf("older name, unsized cache: %+v, %v; want usage 0.5 and no capacity", l, err)
	}
	if _, ok := l.KVHeld(); ok {
		t.Error("an engine that does not state its capacity has no KV view")
	}
	// A capacity with nothing held while a request runs: the gauge does not track the cache.
	l, err = ParseLoad(strings.NewReader("vllm:num_requests_running 3\nvllm:kv_cache_usage_perc 0\n" +
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="1024"} 1` + "\n"))
	if _, ok := l.KVHeld(); err != nil || ok {
		t.Errorf("3 running, 0 held: KVHeld ok %v (%v), want no KV view", ok, err)
	}
	// Two data-parallel engines behind one server: each states its cache and its use, so
	// the capacity sums and the held tokens are the mean use of the sum.
	l, err = ParseLoad(strings.NewReader("vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_running{engine=\"1\"} 1\n" +
		`vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1` + "\n" +
		`vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1` + "\n" +
		`vllm:kv_cache_usage_perc{engine="0"} 0.25` + "\n" + `vllm:kv_cache_usage_perc{engine="1"} 0.75` + "\n"))
	if held, ok := l.KVHeld(); err != nil || !ok || l.KVTokens != 32_000 || held != 16_000 {
		t.Errorf("data parallel: %+v, %v (held %v, %v); want 32,000 tokens of capacity, 16,000 held", l, err, held, ok)
	}
	if l, _ = ParseLoad(strings.NewReader("vllm:num_requests_running 1\n")); !math.IsNaN(l.KVUsage) {
		t.Errorf("no usage gauge: KVUsage %v, want NaN", l.KVUsage)
	}
}

// The cache's writes: prompt tokens not found in the prefix cache plus generated tokens,
// over every series; an engine without the counters states none.
func TestParseLoadReadsTheCacheWrites(t *testing.T) {
	text := "vllm:num_requests_running 1\n" +
		`vllm:prefix_cache_queries_total{engine="0"} 1000` + "\n" +
		`vllm:prefix_cache_queries_total{engine="1"} 500` + "\n" +
		`vllm:prefix_cache_hits_total{engine="0"} 400` + "\n" +
		"vllm:prefix_cache_hits_total_extra 99\n" + // another metric
		`vllm:generation_tokens_total{engine="0"} 70` + "\n"
	l, err := ParseLoad(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if w, ok := l.KVWritten(); !ok || w != 1500-400+70 {
		t.Errorf("KVWritten = %v, %v; want 1170 (1500 queried - 400 hits + 70 generated)", w, ok)
	}
	l, err = ParseLoad(strings.NewReader("vllm:num_requests_running 1\nvllm:generation_tokens_total 5\n"))
	if _, ok := l.KVWritten(); err != nil || ok {
		t.Errorf("no prefix-cache counters: KVWritten ok %v (%v), want false", ok, err)
	}
}

func TestScrapeLoad(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, exposition(current, fixture))
	}))
	defer srv.Close()
	sc := &Scraper{Client: srv.Client()}
	l, err := sc.ScrapeLoad(context.Background(), srv.URL+"/metrics")
	if err != nil || l.Requests() != fixture.running+fixture.waiting {
		t.Fatalf("ScrapeLoad = %+v, %v", l, err)
	}
	if _, err := sc.ScrapeLoad(context.Background(), srv.URL+"/nope"); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Errorf("a 404 must fail naming the status, got %v", err)
	}
}

// BenchmarkParse compares the sidecar's load read with the control server's full parse on
// one engine's exposition (go test ./enginemetrics -bench Parse).
func BenchmarkParse(b *testing.B) {
	text := exposition(current, fixture)
	b.Run("load", func(b *testing.B) {
		for b.Loop() {
			if _, err := ParseLoad(strings.NewReader(text)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			if _, err := Parse(strings.NewReader(text)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The prompts in prefill: looked up when scheduled, counted as prompt tokens at the first
// token; an engine without vllm:prompt_tokens_total states none.
func TestParseLoadReadsThePromptsInPrefill(t *testing.T) {
	text := "vllm:num_requests_running 3\n" +
		`vllm:prefix_cache_queries_total{engine="0"} 9000` + "\n" +
		`vllm:prompt_tokens_total{engine="0",model_name="m"} 6500` + "\n" +
		"vllm:prompt_tokens_total_created 12\n" // another series name
	l, err := ParseLoad(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := l.InPrefill(); !ok || p != 2500 {
		t.Errorf("InPrefill = %v, %v; want 2500 (9000 looked up - 6500 past their first token)", p, ok)
	}
	l, err = ParseLoad(strings.NewReader("vllm:num_requests_running 1\nvllm:prefix_cache_queries_total 10\n"))
	if _, ok := l.InPrefill(); err != nil || ok {
		t.Errorf("no prompt counter: InPrefill ok %v (%v), want none", ok, err)
	}
}

// The finished requests are vllm:request_success_total summed over its finished_reason
// series (vLLM labels each reason); an engine without it states NaN.
func TestParseLoadReadsTheFinishedRequests(t *testing.T) {
	text := "vllm:num_requests_running 3\n" +
		`vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 40` + "\n" +
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2` + "\n" +
		"vllm:request_success_created 12\n" // another series name
	l, err := ParseLoad(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if l.Finished != 42 {
		t.Errorf("Finished = %v, want 42 (40 stopped + 2 at their length)", l.Finished)
	}
	l, err = ParseLoad(strings.NewReader("vllm:num_requests_running 1\n"))
	if err != nil || !math.IsNaN(l.Finished) {
		t.Errorf("no success counter: Finished %v (%v), want NaN", l.Finished, err)
	}
}
