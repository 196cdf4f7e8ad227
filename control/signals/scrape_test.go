package signals

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"
)

func TestScrapeAll(t *testing.T) {
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"llama\"} 3\n")
	}))
	defer good.Close()
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer bad.Close()
	a, _ := newTestAggregator(t)
	targets := []Target{{"up", good.URL}, {"down", bad.URL}, {"up2", good.URL}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	failed := a.ScrapeAll(ctx, &enginemetrics.Scraper{}, targets, 2)
	if len(failed) != 1 || failed["down"] == nil {
		t.Errorf("failed scrapes %v, want only down's", failed)
	}
	snap := a.Snapshot([]EngineSpec{{Name: "up"}, {Name: "down"}, {Name: "up2"}})
	for _, name := range []string{"up", "up2"} {
		if es := snap.Engines[name]; es.State != OK || es.Running != 3 {
			t.Errorf("%s: state %v running %v", name, es.State, es.Running)
		}
	}
	// An engine whose first scrape fails (not running at start) gets no grace period.
	if es := snap.Engines["down"]; es.State != Suspect || !strings.Contains(es.LastError, "503") {
		t.Errorf("down: state %v, last error %q, want suspect: its first scrape failed", es.State, es.LastError)
	}
}
