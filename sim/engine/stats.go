package engine

import "slices"

// Stats is a snapshot of an engine's vLLM-style metrics. Counters only grow.
type Stats struct {
	Running, Waiting int
	// KVUsage is in [0, 1].
	KVUsage float64
	// PrefixQueries and PrefixHits count prompt tokens looked up in and served from the
	// prefix cache (vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total).
	PrefixQueries, PrefixHits uint64
	// Finished counts completed requests and GenerationTokens their output tokens.
	// PromptTokens counts the prompt tokens of every request that has produced its first
	// token: vLLM's vllm:prompt_tokens_total grows when a request's prefill ends (its
	// IterationStats count a prompt with the request's first output), so
	// PrefixQueries - PromptTokens is the prompt tokens of the requests in prefill.
	Finished, PromptTokens, GenerationTokens uint64
	Steps                                    uint64
	// TTFT, ITL and E2E are latency histograms in seconds, measured from arrival at the
	// engine.
	TTFT, ITL, E2E Histogram
}

// Bucket upper bounds in seconds, close to the ones vLLM uses for the same metrics.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
		1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1,
		2.5, 5, 7.5, 10, 20, 40, 80}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120,
		240, 480, 960, 1920, 7680}
)

// NewStats returns empty Stats with vLLM's histogram buckets, for callers that record
// latencies of their own (the mock engine's fixed-latency mode).
func NewStats() Stats {
	return Stats{TTFT: newHistogram(ttftBuckets), ITL: newHistogram(itlBuckets), E2E: newHistogram(e2eBuckets)}
}

// Histogram counts observations per bucket, Prometheus style: Counts[i] is the number of
// observations <= Bounds[i] and not in an earlier bucket; larger ones only reach Count.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64
}

func newHistogram(bounds []float64) Histogram {
	return Histogram{Bounds: bounds, Counts: make([]uint64, len(bounds))}
}

// Observe records v.
func (h *Histogram) Observe(v float64) {
	h.Count++
	h.Sum += v
	if i, _ := slices.BinarySearch(h.Bounds, v); i < len(h.Bounds) {
		h.Counts[i]++
	}
}

// Cumulative returns, for each bound, the number of observations <= that bound.
func (h Histogram) Cumulative() []uint64 {
	out := make([]uint64, len(h.Counts))
	var acc uint64
	for i, c := range h.Counts {
		acc += c
		out[i] = acc
	}
	return out
}

func (h Histogram) clone() Histogram {
	h.Counts = slices.Clone(h.Counts)
	return h
}
