package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/meridian-router/meridian/examples/loadgen/load"
	"github.com/meridian-router/meridian/sim/trace"
)

// options holds every flag; plan turns them into a schedule and a config.
type options struct {
	url, endpoint, model     string
	stream, usage, ignoreEOS bool
	headers                  headerFlag
	prefixHeader             string
	prefixHeaderBytes        int
	concurrency              int
	timeout                  time.Duration

	rate, load, capacity, speed float64
	arrival                     string
	duration                    time.Duration
	count, limit                int
	seed                        uint64
	promptTokens, maxTokens     int
	prefixGroups, prefixBlocks  int

	tracePath, traceFormat string
	blockBytes, maxOutput  int

	sloTTFT, sloE2E time.Duration
	out             string
	progress        time.Duration
}

// headerFlag collects repeated --header k=v (or "k: v") flags.
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string {
	var parts []string
	for k, vs := range f.h {
		for _, v := range vs {
			parts = append(parts, k+"="+v)
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

func (f *headerFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		k, v, ok = strings.Cut(s, ":")
	}
	k, v = strings.TrimSpace(k), strings.TrimSpace(v)
	if !ok || k == "" {
		return fmt.Errorf("header %q: want name=value", s)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(k, v)
	return nil
}

const usageHead = `loadgen drives an OpenAI-compatible server (vLLM, the mock engine, or Envoy in
front of them) and measures TTFT and inter-token latency from the SSE stream.

Modes:
  open loop:  loadgen --rate 20 --duration 60s [--arrival uniform] [--count N]
  replay:     loadgen --trace mooncake.jsonl [--speed 2 | --rate R | --load F --capacity C] [--limit N]

A progress line goes to stderr about once a second. When the run ends (or on
Ctrl-C) a one-line JSON summary is the last line on stdout:
  requests, ok, shed (HTTP 503), errors_total, errors (by status code or class:
  timeout, transport, incomplete, stream_error, canceled, bad_body),
  ttft_p50_ms, ttft_p90_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms, e2e_p50_ms,
  e2e_p99_ms, good, goodput_rps, output_tokens, duration_s, engines (responses
  by the x-served-by header), client_late, interrupted.
Exit status: 0 after a run (even with failed requests), 1 when the run could
not start, 2 for bad flags.

Flags:
`

func newFlagSet(o *options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.url, "url", "http://127.0.0.1:10000", "base URL of the server; the endpoint path is appended")
	fs.StringVar(&o.endpoint, "endpoint", "chat", "API to call: chat (/v1/chat/completions) or completions (/v1/completions)")
	fs.StringVar(&o.model, "model", "mock", "model name sent in every request")
	fs.BoolVar(&o.stream, "stream", true, "ask for SSE streaming; TTFT and ITL are measured only when streaming")
	fs.BoolVar(&o.usage, "include-usage", true, "send stream_options.include_usage so token counts come from the server")
	fs.BoolVar(&o.ignoreEOS, "ignore-eos", false, "send ignore_eos (vLLM extension) so the server generates exactly max_tokens")
	fs.Var(&o.headers, "header", "extra request header name=value; repeat for several (e.g. --header x-priority=low)")
	fs.StringVar(&o.prefixHeader, "prefix-header", "", "send this header with a hash of each prompt's first --prefix-header-bytes bytes, for proxies that hash a header (e.g. x-prefix-hash)")
	fs.IntVar(&o.prefixHeaderBytes, "prefix-header-bytes", 4096, "prompt bytes --prefix-header hashes (the default is the first rung of the sidecar's key ladder: 16 blocks of 256 bytes)")
	fs.IntVar(&o.concurrency, "concurrency", 256, "most requests in flight; a request due when the cap is reached waits (see client_late)")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "bound on each request, from sending to the end of the response")

	fs.Float64Var(&o.rate, "rate", 0, "open loop: mean requests per second; replay: rescale the trace to this mean rate")
	fs.Float64Var(&o.load, "load", 0, "target rate as a multiple of --capacity (rate = load × capacity); excludes --rate and --speed")
	fs.Float64Var(&o.capacity, "capacity", 0, "requests per second the fleet can serve, for --load")
	fs.Float64Var(&o.speed, "speed", 0, "replay: play the trace this many times faster (2 = twice the rate)")
	fs.StringVar(&o.arrival, "arrival", "poisson", "open loop: poisson (exponential gaps) or uniform (fixed gaps)")
	fs.DurationVar(&o.duration, "duration", 0, "stop sending requests due at or after this offset (0: no bound; open loop needs it or --count)")
	fs.IntVar(&o.count, "count", 0, "stop after sending this many requests (0: no bound)")
	fs.IntVar(&o.limit, "limit", 0, "replay: use only the first N requests of the trace (0: all)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of Poisson gaps, prefix groups and prompt text")
	fs.IntVar(&o.promptTokens, "prompt-tokens", 1024, "open loop: prompt length in trace tokens (one block per 512)")
	fs.IntVar(&o.maxTokens, "max-tokens", 64, "open loop: max_tokens of every request")
	fs.IntVar(&o.prefixGroups, "prefix-groups", 0, "open loop: requests share the prefix of one of N groups (0: every prompt unique)")
	fs.IntVar(&o.prefixBlocks, "prefix-blocks", 1, "open loop: length of a group prefix in 512-token blocks")

	fs.StringVar(&o.tracePath, "trace", "", "replay this trace file (Mooncake JSONL or Azure CSV) instead of an open loop")
	fs.StringVar(&o.traceFormat, "trace-format", "auto", "trace format: auto, mooncake, azure or sessions (AIPerf multi-turn sessions)")
	fs.IntVar(&o.blockBytes, "block-bytes", 256, fmt.Sprintf("prompt bytes per 512-token block (>= %d); about 2048 reproduces real prompt sizes", trace.MinBlockBytes))
	fs.IntVar(&o.maxOutput, "max-output", 0, "cap max_tokens of every request (0: no cap), e.g. to shorten long trace outputs")

	fs.DurationVar(&o.sloTTFT, "slo-ttft", 0, "goodput counts only ok requests with TTFT at most this (0: no bound)")
	fs.DurationVar(&o.sloE2E, "slo-e2e", 0, "goodput counts only ok requests finishing within this (0: no bound)")
	fs.StringVar(&o.out, "out", "", "write one JSON line per request to this file (start, status, engine, ttft, e2e, tokens)")
	fs.DurationVar(&o.progress, "progress", time.Second, "interval of the stderr progress line (0: none)")
	return fs
}

// plan validates the options and builds the schedule and the run config.
// info describes the plan in one line for stderr.
func plan(o *options) (sched iter.Seq[trace.Request], cfg load.Config, info string, err error) {
	endpoint, err := load.ParseEndpoint(o.endpoint)
	if err != nil {
		return nil, cfg, "", err
	}
	syn, err := trace.NewSynthesizer(o.blockBytes, o.seed)
	if err != nil {
		return nil, cfg, "", fmt.Errorf("--block-bytes: %w", err)
	}
	cfg = load.Config{
		BaseURL: o.url, Endpoint: endpoint, Model: o.model,
		Stream: o.stream, IncludeUsage: o.usage, IgnoreEOS: o.ignoreEOS,
		Header: o.headers.h, PrefixHeader: o.prefixHeader, PrefixHeaderBytes: o.prefixHeaderBytes, Concurrency: o.concurrency, Timeout: o.timeout,
		Duration: o.duration, MaxRequests: o.count, MaxOutput: o.maxOutput,
		Synth: syn, SLO: load.SLO{TTFT: o.sloTTFT, E2E: o.sloE2E},
	}
	if err := cfg.Validate(); err != nil {
		return nil, cfg, "", err
	}
	rate, err := targetRate(o)
	if err != nil {
		return nil, cfg, "", err
	}
	if o.tracePath != "" {
		sched, info, err = replayPlan(o, rate)
		return sched, cfg, info, err
	}
	sched, info, err = openLoopPlan(o, rate)
	return sched, cfg, info, err
}

// targetRate resolves --rate and --load × --capacity (0: neither given).
func targetRate(o *options) (float64, error) {
	given := 0
	for _, v := range []float64{o.rate, o.load, o.speed} {
		if v != 0 {
			given++
		}
	}
	switch {
	case o.rate < 0 || o.load < 0 || o.speed < 0 || o.capacity < 0:
		return 0, errors.New("--rate, --load, --speed and --capacity must not be negative")
	case given > 1:
		return 0, errors.New("give at most one of --rate, --load and --speed")
	case o.load > 0 && o.capacity == 0:
		return 0, errors.New("--load needs --capacity (requests per second the fleet serves)")
	case o.load > 0:
		return o.load * o.capacity, nil
	}
	return o.rate, nil
}

func replayPlan(o *options, rate float64) (iter.Seq[trace.Request], string, error) {
	format, err := trace.ParseFormat(o.traceFormat)
	if err != nil {
		return nil, "", fmt.Errorf("--trace-format: %w", err)
	}
	reqs, err := trace.ReadFile(o.tracePath, format)
	if err != nil {
		return nil, "", err
	}
	reqs = trace.First(reqs, o.limit)
	switch {
	case rate > 0:
		reqs, err = trace.WithRate(reqs, rate)
	case o.speed > 0:
		reqs, err = trace.WithSpeed(reqs, o.speed)
	}
	if err != nil {
		return nil, "", fmt.Errorf("scale %s: %w", o.tracePath, err)
	}
	st := trace.Summarize(reqs)
	info := fmt.Sprintf("replaying %d requests of %s over %s (mean %.2f req/s, prompt-cache bound %.1f%%)",
		st.Requests, o.tracePath, st.Duration.Round(time.Millisecond), st.MeanRate, 100*st.HitRateUpperBound)
	return slices.Values(reqs), info, nil
}

func openLoopPlan(o *options, rate float64) (iter.Seq[trace.Request], string, error) {
	if o.speed > 0 || o.limit > 0 {
		return nil, "", errors.New("--speed and --limit apply to --trace replay only")
	}
	if o.arrival != "poisson" && o.arrival != "uniform" {
		return nil, "", fmt.Errorf("--arrival %q: want poisson or uniform", o.arrival)
	}
	ol := load.OpenLoop{
		Rate: rate, Uniform: o.arrival == "uniform", Duration: o.duration, Count: o.count, Seed: o.seed,
		PromptTokens: o.promptTokens, OutputTokens: o.maxTokens,
		PrefixGroups: o.prefixGroups, PrefixBlocks: o.prefixBlocks,
	}
	if err := ol.Validate(); err != nil {
		return nil, "", fmt.Errorf("%w (flags --rate or --load, --duration, --count, --prompt-tokens, --max-tokens, --prefix-*)", err)
	}
	info := fmt.Sprintf("open loop: %s arrivals at %.2f req/s", o.arrival, rate)
	return ol.Requests(), info, nil
}
