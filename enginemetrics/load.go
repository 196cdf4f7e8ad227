package enginemetrics

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// Load is an engine's queue and KV cache as its load gauges state them.
type Load struct {
	// Running and Waiting are vllm:num_requests_running and vllm:num_requests_waiting,
	// summed over their series.
	Running, Waiting float64
	// KVUsage is vllm:kv_cache_usage_perc (or the older vllm:gpu_cache_usage_perc), the
	// mean over its series, in [0, 1]; NaN when the engine exposes neither.
	KVUsage float64
	// KVTokens is the KV cache's capacity in tokens: num_gpu_blocks x block_size from the
	// labels of vllm:cache_config_info (vLLM's CacheConfig), summed over its series (vLLM
	// states one per data-parallel engine, labelled engine="0", "1", ..., as it labels
	// every other series); 0 when the engine does not state both.
	KVTokens float64
	// PrefixQueries and PrefixHits are vllm:prefix_cache_queries_total and
	// vllm:prefix_cache_hits_total (prompt tokens looked up in the prefix cache, and found),
	// GenerationTokens is vllm:generation_tokens_total; PromptTokens is
	// vllm:prompt_tokens_total, which vLLM counts when a request's prefill ends (with its
	// first output token); all summed over their series, and NaN when the engine exposes
	// none of the counter's series.
	PrefixQueries, PrefixHits, GenerationTokens, PromptTokens float64
	// Finished is vllm:request_success_total (requests that finished, for any reason),
	// summed over its series; NaN when the engine exposes none.
	Finished float64
}

// InPrefill is the prompt tokens of the requests the engine has scheduled whose prefill
// has not ended: vLLM adds a prompt to vllm:prefix_cache_queries_total when it schedules
// the request (vllm/v1/core/kv_cache_manager.py, get_computed_blocks) and to
// vllm:prompt_tokens_total when the request's first token comes out
// (vllm/v1/metrics/stats.py, IterationStats.update_from_output, while is_prefilling),
// so the difference is the prompts in prefill (cached parts included; requests still
// waiting are in neither). ok is false when the engine does not expose both counters.
// The difference can drift up where an engine looks a prompt up more than once (a request
// preempted and scheduled again); callers take it relative to an idle engine's.
func (l Load) InPrefill() (float64, bool) {
	d := l.PrefixQueries - l.PromptTokens
	if math.IsNaN(d) || math.IsInf(d, 0) {
		return 0, false
	}
	return d, true
}

// KVWritten is how many tokens the engine has written into its KV cache since it started:
// the prompt tokens its prefix cache did not hold (queries - hits) plus the tokens it
// generated. Each takes blocks from the cache's free pool, which evicts the least recently
// used cached prefix, so the growth of KVWritten since a prompt last ran there bounds how
// much of the cache has turned over since (picker.Homes). ok is false when the engine does
// not expose the three counters.
func (l Load) KVWritten() (float64, bool) {
	w := l.PrefixQueries - l.PrefixHits + l.GenerationTokens
	if math.IsNaN(w) || w < 0 || math.IsInf(w, 0) {
		return 0, false
	}
	return w, true
}

// KVHeld is the tokens the engine's KV cache holds for its running requests (KVUsage x
// KVTokens), and whether the engine states both meaningfully: a cache that holds nothing
// while requests run is not tracked by the gauge (llm-d-inference-sim with its KV cache
// off states a capacity and 0 usage), so it says nothing.
func (l Load) KVHeld() (float64, bool) {
	if !(l.KVTokens > 0) || !(l.KVUsage >= 0 && l.KVUsage <= 1) || (l.KVUsage == 0 && l.Running > 0) {
		return 0, false
	}
	return l.KVUsage * l.KVTokens, true
}

// Requests is the requests the engine holds: running plus waiting.
func (l Load) Requests() float64 { return l.Running + l.Waiting }

var (
	runningName     = []byte("vllm:num_requests_running")
	waitingName     = []byte("vllm:num_requests_waiting")
	kvUsageName     = []byte("vllm:kv_cache_usage_perc")
	kvUsageOldName  = []byte("vllm:gpu_cache_usage_perc")
	cacheConfigName = []byte("vllm:cache_config_info")
	queriesName     = []byte("vllm:prefix_cache_queries_total")
	hitsName        = []byte("vllm:prefix_cache_hits_total")
	generationName  = []byte("vllm:generation_tokens_total")
	promptName      = []byte("vllm:prompt_tokens_total")
	successName     = []byte("vllm:request_success_total")
)

// ParseLoad reads only the load gauges (and the KV-cache counters KVWritten sums) from a
// text exposition, line by line, without building metric families: the sidecar reads them
// every few tens of milliseconds from every engine, and a full Parse of a vLLM exposition
// (histograms for every latency) costs tens of times more. Series are summed, as Parse
// sums them. It fails when the exposition carries neither gauge, so an engine that is not
// vLLM-compatible is not read as idle.
func ParseLoad(r io.Reader) (Load, error) {
	var l Load
	var seenRunning, seenWaiting, seenQueries, seenHits, seenGeneration, seenPrompt, seenFinished bool
	var usage float64
	usageSeries := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != 'v' {
			continue // comments, other families
		}
		var dst *float64
		switch {
		case seriesOf(line, runningName):
			dst, seenRunning = &l.Running, true
		case seriesOf(line, waitingName):
			dst, seenWaiting = &l.Waiting, true
		case seriesOf(line, kvUsageName), seriesOf(line, kvUsageOldName):
			dst = &usage
			usageSeries++
		case seriesOf(line, queriesName):
			dst, seenQueries = &l.PrefixQueries, true
		case seriesOf(line, hitsName):
			dst, seenHits = &l.PrefixHits, true
		case seriesOf(line, generationName):
			dst, seenGeneration = &l.GenerationTokens, true
		case seriesOf(line, promptName):
			dst, seenPrompt = &l.PromptTokens, true
		case seriesOf(line, successName):
			dst, seenFinished = &l.Finished, true
		case seriesOf(line, cacheConfigName):
			l.KVTokens += cacheTokens(line) // one series per data-parallel engine
			continue
		default:
			continue
		}
		v, err := sampleValue(line)
		if err != nil {
			return Load{}, fmt.Errorf("parse load gauges: %q: %w", line, err)
		}
		*dst += v
	}
	if err := sc.Err(); err != nil {
		return Load{}, fmt.Errorf("parse load gauges: %w", err)
	}
	if !seenRunning && !seenWaiting {
		return Load{}, fmt.Errorf("parse load gauges: neither %s nor %s is exposed", runningName, waitingName)
	}
	for _, c := range []struct {
		seen bool
		v    *float64
	}{{seenQueries, &l.PrefixQueries}, {seenHits, &l.PrefixHits}, {seenGeneration, &l.GenerationTokens}, {seenPrompt, &l.PromptTokens}, {seenFinished, &l.Finished}} {
		if !c.seen {
			*c.v = math.NaN()
		}
	}
	l.KVUsage = math.NaN()
	if usageSeries > 0 {
		l.KVUsage = usage / float64(usageSeries)
	}
	return l, nil
}

// cacheTokens is num_gpu_blocks x block_size from a vllm:cache_config_info sample's
// labels, 0 when either is missing or not a positive integer (vLLM writes "None" before
// the cache is sized).
func cacheTokens(line []byte) float64 {
	blocks, size := labelInt(line, "num_gpu_blocks"), labelInt(line, "block_size")
	if blocks <= 0 || size <= 0 {
		return 0
	}
	return float64(blocks) * float64(size)
}

// labelInt is the value of label name in a sample line's label set, as a positive
// integer, or 0.
func labelInt(line []byte, name string) int64 {
	end := bytes.LastIndexByte(line, '}')
	if end < 0 {
		return 0
	}
	labels := line[:end]
	for i := 0; ; {
		j := bytes.Index(labels[i:], []byte(name+`="`))
		if j < 0 {
			return 0
		}
		j += i
		if c := labels[j-1]; c != '{' && c != ',' && c != ' ' { // a longer name ending in name
			i = j + len(name)
			continue
		}
		v := labels[j+len(name)+2:]
		k := bytes.IndexByte(v, '"')
		if k < 0 {
			return 0
		}
		n, err := strconv.ParseInt(string(v[:k]), 10, 64)
		if err != nil || n <= 0 {
			return 0
		}
		return n
	}
}

// seriesOf reports whether line is a sample of the metric name (followed by its labels or
// its value, not by a longer name).
func seriesOf(line, name []byte) bool {
	if !bytes.HasPrefix(line, name) || len(line) == len(name) {
		return false
	}
	c := line[len(name)]
	return c == '{' || c == ' ' || c == '\t'
}

// sampleValue is the value of a sample line: the first field after the labels (a
// timestamp may follow it).
func sampleValue(line []byte) (float64, error) {
	rest := line
	if i := bytes.LastIndexByte(rest, '}'); i >= 0 {
		rest = rest[i+1:]
	} else if i := bytes.IndexAny(rest, " \t"); i >= 0 {
		rest = rest[i:]
	}
	f := strings.Fields(string(rest))
	if len(f) == 0 {
		return 0, fmt.Errorf("no value")
	}
	return strconv.ParseFloat(f[0], 64)
}

// ScrapeLoad fetches url (an engine's /metrics) and reads its load gauges (ParseLoad). It
// honours ctx and reads at most 16 MiB. Errors wrap ErrScrape.
func (sc *Scraper) ScrapeLoad(ctx context.Context, url string) (Load, error) {
	body, err := sc.get(ctx, url)
	if err != nil {
		return Load{}, err
	}
	defer body.Close()
	l, err := ParseLoad(io.LimitReader(body, maxBodySize))
	if err != nil {
		return Load{}, fmt.Errorf("%w: %s: %w", ErrScrape, url, err)
	}
	return l, nil
}

// get issues the scrape request and returns the body of a 200 text exposition.
func (sc *Scraper) get(ctx context.Context, url string) (io.ReadCloser, error) {
	client := sc.Client
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrScrape, url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrScrape, url, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("%w: %s: HTTP %d", ErrScrape, url, resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/vnd.google.protobuf") {
		resp.Body.Close()
		return nil, fmt.Errorf("%w: %s: protobuf exposition is not supported (Content-Type %q)", ErrScrape, url, ct)
	}
	return resp.Body, nil
}
