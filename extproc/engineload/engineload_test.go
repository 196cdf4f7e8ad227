package engineload

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"
	"github.com/meridian-router/meridian/extproc/decide"
)

// fakeCore records what the scrape observed, per address.
type fakeCore struct {
	targets []decide.LoadTarget
	mu      sync.Mutex
	seen    map[string][]float64
}

func (f *fakeCore) LoadTargets(dst []decide.LoadTarget) []decide.LoadTarget {
	return append(dst, f.targets...)
}

func (f *fakeCore) ObserveEngineLoad(addr string, l enginemetrics.Load) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[addr] = append(f.seen[addr], l.Requests())
}

// ForgetEngineLoad records a failed scrape as NaN.
func (f *fakeCore) ForgetEngineLoad(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[addr] = append(f.seen[addr], math.NaN())
}

func (f *fakeCore) observed(addr string) []float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]float64(nil), f.seen[addr]...)
}

func TestRunFeedsEveryTargetAndForgetsFailures(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "restarting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n"+
			"vllm:num_requests_waiting{model_name=\"m\"} 4\n")
	}))
	defer engine.Close()
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hung.Close()
	core := &fakeCore{seen: map[string][]float64{}, targets: []decide.LoadTarget{
		{Address: "10.0.0.1:8000", MetricsURL: engine.URL + "/metrics"},
		{Address: "10.0.0.2:8000", MetricsURL: hung.URL + "/metrics"},
	}}
	var oks, fails atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		Run(ctx, Config{Interval: 10 * time.Millisecond, Timeout: 50 * time.Millisecond, OnScrape: func(ok bool) {
			if ok {
				oks.Add(1)
			} else {
				fails.Add(1)
			}
		}}, core)
		close(done)
	}()
	waitFor(t, ctx, func() bool {
		return len(core.observed("10.0.0.1:8000")) >= 2 && len(core.observed("10.0.0.2:8000")) >= 1
	})
	if got := core.observed("10.0.0.1:8000"); got[0] != 7 {
		t.Errorf("the engine holds 3 running + 4 waiting; observed %v", got)
	}
	for _, v := range core.observed("10.0.0.2:8000") {
		if !math.IsNaN(v) {
			t.Errorf("a scrape that times out must forget the engine's load (NaN), observed %v", v)
		}
	}
	up.Store(false)
	n := len(core.observed("10.0.0.1:8000"))
	waitFor(t, ctx, func() bool { got := core.observed("10.0.0.1:8000"); return len(got) > n && math.IsNaN(got[len(got)-1]) })
	if oks.Load() == 0 || fails.Load() == 0 {
		t.Errorf("OnScrape counted %d successes and %d failures; want both", oks.Load(), fails.Load())
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestRunOffReturnsAtOnce(t *testing.T) {
	done := make(chan struct{})
	go func() { Run(context.Background(), Config{}, &fakeCore{}); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run with no interval must return at once (the scrape is off)")
	}
}

func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("condition not met before the deadline")
		case <-time.After(5 * time.Millisecond):
		}
	}
}
