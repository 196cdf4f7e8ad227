package enginemetrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// engineMetrics is what a fake engine exposes, rendered in either metric
// generation by exposition.
type engineMetrics struct {
	running, waiting, kv      float64
	queries, hits             float64
	ttftCount, ttftSum        float64
	itlCount, itlSum          float64
	e2eCount, e2eSum          float64
	ttftBuckets               []float64 // cumulative counts for bounds 0.1, 0.5, 1
	omitE2E, dataParallelTwin bool
}

// names maps each signal to its metric name in one vLLM generation.
type names struct {
	kv, queries, hits, itl string
	counterTypeSuffix      string // "_total" when TYPE lines carry it
}

var (
	current = names{kv: "vllm:kv_cache_usage_perc", queries: "vllm:prefix_cache_queries", hits: "vllm:prefix_cache_hits",
		itl: "vllm:inter_token_latency_seconds", counterTypeSuffix: "_total"}
	older = names{kv: "vllm:gpu_cache_usage_perc", queries: "vllm:gpu_prefix_cache_queries", hits: "vllm:gpu_prefix_cache_hits",
		itl: "vllm:time_per_output_token_seconds"}
)

// exposition renders m in the Prometheus text format with the given names.
// With dataParallelTwin, every series appears twice (engine="0" and "1"),
// as a data-parallel vLLM exposes it; the twin carries the same values.
func exposition(n names, m engineMetrics) string {
	var b strings.Builder
	engines := []string{"0"}
	if m.dataParallelTwin {
		engines = append(engines, "1")
	}
	gauge := func(name string, v float64) {
		fmt.Fprintf(&b, "# HELP %s test gauge\n# TYPE %s gauge\n", name, name)
		for _, e := range engines {
			fmt.Fprintf(&b, "%s{engine=%q,model_name=\"llama\"} %g\n", name, e, v)
		}
	}
	counter := func(name string, v float64) {
		fmt.Fprintf(&b, "# TYPE %s%s counter\n", name, n.counterTypeSuffix)
		for _, e := range engines {
			fmt.Fprintf(&b, "%s_total{engine=%q,model_name=\"llama\"} %g\n", name, e, v)
		}
	}
	hist := func(name string, count, sum float64, buckets []float64) {
		fmt.Fprintf(&b, "# TYPE %s histogram\n", name)
		bounds := []string{"0.1", "0.5", "1.0"}
		for _, e := range engines {
			for i, ub := range bounds {
				c := count
				if buckets != nil {
					c = buckets[i]
				}
				fmt.Fprintf(&b, "%s_bucket{engine=%q,le=%q,model_name=\"llama\"} %g\n", name, e, ub, c)
			}
			fmt.Fprintf(&b, "%s_bucket{engine=%q,le=\"+Inf\",model_name=\"llama\"} %g\n", name, e, count)
			fmt.Fprintf(&b, "%s_sum{engine=%q,model_name=\"llama\"} %g\n", name, e, sum)
			fmt.Fprintf(&b, "%s_count{engine=%q,model_name=\"llama\"} %g\n", name, e, count)
		}
	}
	gauge("vllm:num_requests_running", m.running)
	gauge("vllm:num_requests_waiting", m.waiting)
	gauge(n.kv, m.kv)
	counter(n.queries, m.queries)
	counter(n.hits, m.hits)
	hist("vllm:time_to_first_token_seconds", m.ttftCount, m.ttftSum, m.ttftBuckets)
	hist(n.itl, m.itlCount, m.itlSum, nil)
	if !m.omitE2E {
		hist("vllm:e2e_request_latency_seconds", m.e2eCount, m.e2eSum, nil)
	}
	// Unrelated families must be ignored.
	b.WriteString("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n")
	return b.String()
}

var fixture = engineMetrics{
	running: 3, waiting: 2, kv: 0.25, queries: 1000, hits: 400,
	ttftCount: 50, ttftSum: 10, ttftBuckets: []float64{10, 40, 48},
	itlCount: 900, itlSum: 27, e2eCount: 45, e2eSum: 90,
}

func TestScrapeBothGenerations(t *testing.T) {
	for _, tt := range []struct {
		name string
		n    names
	}{{"current", current}, {"older", older}} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/metrics" {
					http.NotFound(w, r)
					return
				}
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				fmt.Fprint(w, exposition(tt.n, fixture))
			}))
			defer srv.Close()
			s, err := (&Scraper{Client: srv.Client()}).Scrape(context.Background(), srv.URL+"/metrics")
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{
				"running": s.Running, "waiting": s.Waiting, "kv": s.KVCacheUsage,
				"queries": s.PrefixQueries, "hits": s.PrefixHits,
				"ttft count": s.TTFT.Count, "ttft mean": s.TTFT.Mean(),
				"itl count": s.ITL.Count, "itl mean": s.ITL.Mean(), "e2e mean": s.E2E.Mean(),
			}
			want := map[string]float64{
				"running": 3, "waiting": 2, "kv": 0.25, "queries": 1000, "hits": 400,
				"ttft count": 50, "ttft mean": 0.2, "itl count": 900, "itl mean": 0.03, "e2e mean": 2,
			}
			for k, w := range want {
				if math.Abs(got[k]-w) > 1e-12 {
					t.Errorf("%s = %v, want %v", k, got[k], w)
				}
			}
			if !reflect.DeepEqual(s.Models, []string{"llama"}) || len(s.Missing) != 0 {
				t.Errorf("models %v, missing %v", s.Models, s.Missing)
			}
			if !reflect.DeepEqual(s.TTFT.Bounds, []float64{0.1, 0.5, 1}) || !reflect.DeepEqual(s.TTFT.Cumulative, []float64{10, 40, 48}) {
				t.Errorf("ttft buckets %v %v", s.TTFT.Bounds, s.TTFT.Cumulative)
			}
		})
	}
}

func TestParseSumsDataParallelSeriesAndListsMissing(t *testing.T) {
	m := fixture
	m.dataParallelTwin, m.omitE2E = true, true
	s, err := Parse(strings.NewReader(exposition(current, m)))
	if err != nil {
		t.Fatal(err)
	}
	if s.Running != 6 || s.TTFT.Count != 100 || s.PrefixHits != 800 {
		t.Errorf("running %v ttft count %v hits %v: series must be summed", s.Running, s.TTFT.Count, s.PrefixHits)
	}
	if s.KVCacheUsage != 0.25 {
		t.Errorf("kv cache usage %v: must be the mean over series", s.KVCacheUsage)
	}
	if !reflect.DeepEqual(s.Missing, []string{"vllm:e2e_request_latency_seconds"}) {
		t.Errorf("missing = %v", s.Missing)
	}
}

func TestScrapeErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/500":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "/garbage":
			fmt.Fprint(w, "vllm:num_requests_running{model_name=\"x\" 3\n")
		case "/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}
	}))
	defer srv.Close()
	sc := &Scraper{Client: srv.Client()}
	for _, path := range []string{"/500", "/garbage", "/slow"} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		_, err := sc.Scrape(ctx, srv.URL+path)
		cancel()
		if !errors.Is(err, ErrScrape) {
			t.Errorf("%s: error %v, want ErrScrape", path, err)
		}
	}
}

func TestHistogramQuantileAndSub(t *testing.T) {
	h := Histogram{Count: 100, Sum: 30, Bounds: []float64{0.1, 0.5, 1}, Cumulative: []float64{20, 80, 95}}
	for _, tt := range []struct{ q, want float64 }{{0.1, 0.05}, {0.5, 0.3}, {0.9, 0.5 + 0.5*10/15}, {0.99, 1}} {
		if got := h.Quantile(tt.q); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("quantile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	prev := Histogram{Count: 40, Sum: 10, Bounds: h.Bounds, Cumulative: []float64{10, 30, 38}}
	d, ok := h.Sub(prev)
	if !ok || d.Count != 60 || d.Mean() != 20.0/60 || !reflect.DeepEqual(d.Cumulative, []float64{10, 50, 57}) {
		t.Errorf("sub = %+v, %v", d, ok)
	}
	if _, ok := prev.Sub(h); ok {
		t.Error("a histogram that went backwards (restart) must not give a difference")
	}
}
