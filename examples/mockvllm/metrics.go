package main

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meridian-router/meridian/sim/engine"
)

// collector exports engine.Stats under vLLM's current metric names. A mock serving several
// models reports the engine-wide figures under each model's label.
type collector struct {
	engine string
	models []string
	stats  func() engine.Stats

	running, waiting, kvUsage               *prometheus.Desc
	prefixQueries, prefixHits               *prometheus.Desc
	success, promptTokens, generationTokens *prometheus.Desc
	ttft, itl, e2e                          *prometheus.Desc
	// cacheConfig is vLLM's vllm:cache_config_info (an info gauge, always 1, whose labels
	// state the KV cache's block_size and num_gpu_blocks); nil when the mock has no KV
	// cache (fixed latencies), where vLLM would state one its usage never reflects.
	cacheConfig *prometheus.Desc
}

// newMetricsHandler serves the engine's metrics; kv is its KV cache (KVBlocks of
// BlockTokens tokens), the zero Config when it has none.
func newMetricsHandler(name string, models []string, kv engine.Config, stats func() engine.Stats) http.Handler {
	labels := []string{"engine", "model_name"}
	d := func(n, help string) *prometheus.Desc { return prometheus.NewDesc(n, help, labels, nil) }
	c := &collector{engine: name, models: models, stats: stats,
		running:          d("vllm:num_requests_running", "Number of requests in the running batch."),
		waiting:          d("vllm:num_requests_waiting", "Number of requests waiting to be admitted."),
		kvUsage:          d("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 means 100 percent)."),
		prefixQueries:    d("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache."),
		prefixHits:       d("vllm:prefix_cache_hits_total", "Prompt tokens served from the prefix cache."),
		success:          d("vllm:request_success_total", "Requests that finished."),
		promptTokens:     d("vllm:prompt_tokens_total", "Prompt tokens of requests past their first token."),
		generationTokens: d("vllm:generation_tokens_total", "Generated tokens of finished requests."),
		ttft:             d("vllm:time_to_first_token_seconds", "Time to first token in seconds."),
		itl:              d("vllm:inter_token_latency_seconds", "Time between output tokens in seconds."),
		e2e:              d("vllm:e2e_request_latency_seconds", "Request latency from arrival to last token, in seconds."),
	}
	if kv.KVBlocks > 0 && kv.BlockTokens > 0 {
		c.cacheConfig = prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", nil,
			prometheus.Labels{"engine": name, "block_size": fmt.Sprint(kv.BlockTokens), "num_gpu_blocks": fmt.Sprint(kv.KVBlocks)})
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	if c.cacheConfig != nil {
		ch <- prometheus.MustNewConstMetric(c.cacheConfig, prometheus.GaugeValue, 1)
	}
	for _, m := range c.models {
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, c.engine, m)
		}
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), c.engine, m)
		}
		hist := func(d *prometheus.Desc, h engine.Histogram) {
			buckets := make(map[float64]uint64, len(h.Bounds))
			for i, n := range h.Cumulative() {
				buckets[h.Bounds[i]] = n
			}
			ch <- prometheus.MustNewConstHistogram(d, h.Count, h.Sum, buckets, c.engine, m)
		}
		gauge(c.running, float64(s.Running))
		gauge(c.waiting, float64(s.Waiting))
		gauge(c.kvUsage, s.KVUsage)
		counter(c.prefixQueries, s.PrefixQueries)
		counter(c.prefixHits, s.PrefixHits)
		counter(c.success, s.Finished)
		counter(c.promptTokens, s.PromptTokens)
		counter(c.generationTokens, s.GenerationTokens)
		hist(c.ttft, s.TTFT)
		hist(c.itl, s.ITL)
		hist(c.e2e, s.E2E)
	}
}
