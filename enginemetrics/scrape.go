// Package enginemetrics reads a vLLM-compatible engine's Prometheus metrics: the
// running and waiting requests, KV-cache use, prefix-cache counters and latency
// histograms, under both metric generations. The control server scrapes them for its
// signals; the sidecar scrapes the load gauges for its view of each engine's queue.
package enginemetrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one scrape of one engine's /metrics, summed over its series
// (an engine may expose several, one per model_name or data-parallel
// "engine" label). Counters and histograms are cumulative as exposed; the
// Aggregator turns consecutive samples into rates.
type Sample struct {
	// Models are the model_name label values seen, sorted.
	Models []string
	// Running and Waiting are the requests in the engine's batch and queue.
	Running, Waiting float64
	// KVCacheUsage is the mean KV-cache usage over the series, in [0, 1].
	KVCacheUsage float64
	// PrefixQueries and PrefixHits are the prefix-cache counters, in tokens.
	PrefixQueries, PrefixHits float64
	// TTFT, ITL and E2E are the time-to-first-token, inter-token and
	// end-to-end request latency histograms, in seconds.
	TTFT, ITL, E2E Histogram
	// Missing lists the signals the engine does not expose (by their
	// current name), so that absent is never mistaken for zero.
	Missing []string
}

// Histogram is a cumulative Prometheus histogram.
type Histogram struct {
	Count, Sum float64
	// Bounds are the finite upper bounds, ascending; Cumulative[i] counts
	// observations ≤ Bounds[i].
	Bounds, Cumulative []float64
}

// Mean is Sum/Count, or 0 without observations.
func (h Histogram) Mean() float64 {
	if h.Count <= 0 {
		return 0
	}
	return h.Sum / h.Count
}

// Sub returns h − prev: the observations between two scrapes. ok is false
// when the counter was reset (the engine restarted) or the buckets changed.
func (h Histogram) Sub(prev Histogram) (d Histogram, ok bool) {
	if h.Count < prev.Count || !slices.Equal(h.Bounds, prev.Bounds) {
		return Histogram{}, false
	}
	d = Histogram{Count: h.Count - prev.Count, Sum: h.Sum - prev.Sum, Bounds: h.Bounds}
	d.Cumulative = make([]float64, len(h.Cumulative))
	for i := range h.Cumulative {
		d.Cumulative[i] = h.Cumulative[i] - prev.Cumulative[i]
	}
	return d, true
}

// Quantile estimates the q-quantile by linear interpolation inside the
// bucket that holds it, as Prometheus' histogram_quantile does. It returns
// the largest finite bound when the quantile falls in the +Inf bucket, and
// 0 without observations.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count <= 0 || len(h.Bounds) == 0 {
		return 0
	}
	rank := q * h.Count
	lower, below := 0.0, 0.0
	for i, ub := range h.Bounds {
		if c := h.Cumulative[i]; c >= rank {
			if c == below {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/(c-below)
		}
		lower, below = ub, h.Cumulative[i]
	}
	return h.Bounds[len(h.Bounds)-1]
}

// signal names one quantity, the metric names that carry it, newest first
// (design.md §7), and where it goes in a Sample. Counters are matched with
// and without "_total", because exposition formats disagree on the suffix.
type signal struct {
	names []string
	apply func(s *Sample, f *dto.MetricFamily)
}

var signals = []signal{
	{[]string{"vllm:num_requests_running"}, func(s *Sample, f *dto.MetricFamily) { s.Running = sumValues(f) }},
	{[]string{"vllm:num_requests_waiting"}, func(s *Sample, f *dto.MetricFamily) { s.Waiting = sumValues(f) }},
	{[]string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, func(s *Sample, f *dto.MetricFamily) {
		s.KVCacheUsage = sumValues(f) / float64(len(f.GetMetric()))
	}},
	{[]string{"vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"}, func(s *Sample, f *dto.MetricFamily) { s.PrefixQueries = sumValues(f) }},
	{[]string{"vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"}, func(s *Sample, f *dto.MetricFamily) { s.PrefixHits = sumValues(f) }},
	{[]string{"vllm:time_to_first_token_seconds"}, func(s *Sample, f *dto.MetricFamily) { s.TTFT = sumHistograms(f) }},
	{[]string{"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"}, func(s *Sample, f *dto.MetricFamily) { s.ITL = sumHistograms(f) }},
	{[]string{"vllm:e2e_request_latency_seconds"}, func(s *Sample, f *dto.MetricFamily) { s.E2E = sumHistograms(f) }},
}

const (
	labelModel  = "model_name"
	maxBodySize = 16 << 20
)

// find returns the family carrying s, trying each name with and without
// "_total".
func (s signal) find(fams map[string]*dto.MetricFamily) *dto.MetricFamily {
	for _, n := range s.names {
		for _, cand := range []string{n, n + "_total"} {
			if f, ok := fams[cand]; ok {
				return f
			}
		}
	}
	return nil
}

// Parse reads the Prometheus text exposition format and extracts the vLLM
// signals, accepting both current and older metric names.
func Parse(r io.Reader) (Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Sample{}, fmt.Errorf("parse metrics: %w", err)
	}
	var s Sample
	models := map[string]bool{}
	for _, sig := range signals {
		f := sig.find(fams)
		if f == nil {
			s.Missing = append(s.Missing, sig.names[0])
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labelModel {
					models[lp.GetValue()] = true
				}
			}
		}
		sig.apply(&s, f)
	}
	for m := range models {
		s.Models = append(s.Models, m)
	}
	slices.Sort(s.Models)
	return s, nil
}

func sumValues(f *dto.MetricFamily) float64 {
	total := 0.0
	for _, m := range f.GetMetric() {
		switch {
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		case m.Untyped != nil:
			total += m.GetUntyped().GetValue()
		}
	}
	return total
}

// sumHistograms adds the series of a histogram family bucket by bucket;
// series whose bounds differ from the first are skipped rather than mixed.
func sumHistograms(f *dto.MetricFamily) Histogram {
	var h Histogram
	first := true
	for _, m := range f.GetMetric() {
		hm := m.GetHistogram()
		if hm == nil {
			continue
		}
		var bounds, cum []float64
		for _, b := range hm.GetBucket() {
			if math.IsInf(b.GetUpperBound(), 1) {
				continue
			}
			bounds = append(bounds, b.GetUpperBound())
			cum = append(cum, float64(b.GetCumulativeCount())+b.GetCumulativeCountFloat())
		}
		if first {
			h.Bounds, h.Cumulative, first = bounds, make([]float64, len(cum)), false
		} else if !slices.Equal(bounds, h.Bounds) {
			continue
		}
		h.Count += float64(hm.GetSampleCount()) + hm.GetSampleCountFloat()
		h.Sum += hm.GetSampleSum()
		for i, c := range cum {
			h.Cumulative[i] += c
		}
	}
	return h
}

// Scraper fetches engines' /metrics. The zero value uses
// http.DefaultClient; Scrape is safe for concurrent use.
type Scraper struct {
	Client *http.Client
}

// ErrScrape wraps every failure to fetch or read an endpoint.
var ErrScrape = errors.New("scrape failed")

// Scrape fetches url (an engine's /metrics) and parses it. It honours ctx
// for cancellation and deadlines, and reads at most 16 MiB.
func (sc *Scraper) Scrape(ctx context.Context, url string) (Sample, error) {
	body, err := sc.get(ctx, url)
	if err != nil {
		return Sample{}, err
	}
	defer body.Close()
	s, err := Parse(io.LimitReader(body, maxBodySize))
	if err != nil {
		return Sample{}, fmt.Errorf("%w: %s: %w", ErrScrape, url, err)
	}
	return s, nil
}
