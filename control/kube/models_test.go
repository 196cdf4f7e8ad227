package kube

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestParseModels reads vLLM's /v1/models (vllm/entrypoints/openai/serving_models.py): a
// card per served name, a LoRA adapter's card naming its base in parent, root a path.
func TestParseModels(t *testing.T) {
	for _, c := range []struct{ body, want, err string }{
		{`{"object":"list","data":[{"id":"llama","object":"model","root":"meta-llama/Llama-3-8B","parent":null,"max_model_len":8192},` +
			`{"id":"sql-lora","object":"model","root":"/adapters/sql","parent":"llama"}]}`, "llama,sql-lora", ""},
		// An adapter whose base is not listed itself: the parent is served too.
		{`{"data":[{"id":"sql-lora","root":"/adapters/sql","parent":"llama"}]}`, "sql-lora,llama", ""},
		{`{"data":[{"id":"a"},{"id":"a"},{"id":""}]}`, "a", ""},
		{`{"object":"list","data":[]}`, "", "the model list is empty"},
		{`<html>`, "", "not an OpenAI model list"},
	} {
		got, err := parseModels([]byte(c.body))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.body, err, c.err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != c.want {
			t.Errorf("%s: %v %v, want %s", c.body, got, err, c.want)
		}
	}
}

// TestModelProberRetriesAndReports: an engine failing /v1/models is reported after
// modelsFailuresToReport tries, and known once it answers; one no longer wanted is
// forgotten. Run with -race: scans and the asking goroutines share the state.
func TestModelProberRetriesAndReports(t *testing.T) {
	var up atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() || r.URL.Path != "/v1/models" {
			http.Error(w, "loading", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"llama","parent":null}]}`))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	reg := prometheus.NewRegistry()
	changed := make(chan struct{}, 100)
	var logs strings.Builder
	var mu sync.Mutex
	p := newModelProber(slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(b)
	}), nil)), NewMetrics(reg), func() { changed <- struct{}{} })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.want(ctx, map[string]bool{addr: true})
	wait := func(what string, cond func(modelState) bool) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for !cond(p.state(addr)) {
			select {
			case <-changed:
			case <-deadline:
				t.Fatalf("%s: state %+v", what, p.state(addr))
			}
		}
	}
	wait("reported after failing", func(s modelState) bool { return s.err != nil })
	if s := p.state(addr); s.models != nil || !strings.Contains(s.err.Error(), "HTTP 503") || !strings.Contains(s.err.Error(), AnnotationModels) {
		t.Fatalf("state %+v: want the HTTP status and the annotation that fixes it", s)
	}
	up.Store(true)
	p.want(ctx, map[string]bool{addr: true})
	wait("known once it answers", func(s modelState) bool { return s.err == nil && strings.Join(s.models, ",") == "llama" })
	if got := testutil.ToFloat64(p.metrics.modelProbes.WithLabelValues("error")); got < modelsFailuresToReport {
		t.Errorf("failed requests counted %v, want >= %d", got, modelsFailuresToReport)
	}
	mu.Lock()
	n := strings.Count(logs.String(), "cannot learn an engine's models")
	mu.Unlock()
	if n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs.String())
	}
	p.want(ctx, map[string]bool{})
	if s := p.state(addr); s.models != nil {
		t.Errorf("an engine no longer discovered is still known: %+v", s)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
