package e2e

import (
	"context"
	"sort"
	"testing"
	"time"
)

// Every request's outcome reaches the sidecar after the response: its in-flight count
// returns to zero. The time it takes is logged (go test ./envoy/e2e -run OutcomeLag -v):
// with the bootstrap's buffer_size_bytes: 0 the access log sends each entry as its request
// ends instead of batching them for up to buffer_flush_interval (50 ms), the lag that made
// conversations split under the least-work choice's floor. The figure includes the
// metrics scrape that reads the count.
func TestE2EOutcomeLag(t *testing.T) {
	s := startStack(t, threeEngines())
	node := s.Nodes["region-a"]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var lags []time.Duration
	for i := 0; i < 30; i++ {
		r, err := chat(ctx, node.URL, model, prompt(i), false, nil)
		if err != nil || r.status != 200 {
			t.Fatal(err, r.status)
		}
		end := time.Now()
		for deadline := end.Add(5 * time.Second); ; {
			if time.Now().After(deadline) {
				t.Fatalf("request %d: the sidecar still counts it in flight 5 s after its response", i)
			}
			m, err := s.SidecarMetrics(ctx, "region-a")
			if err != nil {
				t.Fatal(err)
			}
			tot := 0.0
			for _, v := range m.ByLabel("meridian_sidecar_engine_in_flight", "engine") {
				tot += v
			}
			if tot == 0 {
				lags = append(lags, time.Since(end))
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(37 * time.Millisecond) // apart, and off any timer's period
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	t.Logf("from response to the sidecar's count falling, %d requests: p50 %v p90 %v max %v", len(lags), lags[len(lags)/2], lags[len(lags)*9/10], lags[len(lags)-1])
}
