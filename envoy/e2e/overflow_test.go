package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
)

// TestE2EOverflowTakesWhatTheRegionWouldQueue: region-a's engines hold a small KV cache
// (20,000 tokens, so the default picker.overflow_at of 0.2 is 4,000 tokens of work) and
// prefill slowly. Requests one at a time stay in region-a. A burst of twelve long prompts
// at once puts more than that on both of region-a's engines before any plan could move,
// and the sidecar sends part of the burst to region-b's idle engines, which region-a has no
// share of (the control server solves once, at the start, so its plan does not move):
// Envoy honours the endpoint list for those priority-1 endpoints, and the access log's
// decision says overflowed.
func TestE2EOverflowTakesWhatTheRegionWouldQueue(t *testing.T) {
	small := []string{"--kv-tokens", "20000", "--prefill-tokens-per-sec", "4000"}
	s := startStack(t, stack.Spec{
		Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}, {Name: "region-b", Region: "b"}},
		Engines: []stack.EngineSpec{
			{Name: "a-0", Region: "a", Models: []string{model}, CapacityRPS: 5, Args: small},
			{Name: "a-1", Region: "a", Models: []string{model}, CapacityRPS: 5, Args: small},
			{Name: "b-0", Region: "b", Models: []string{model}, CapacityRPS: 5, Args: small},
			{Name: "b-1", Region: "b", Models: []string{model}, CapacityRPS: 5, Args: small},
		},
		// One solve, at the start, with no demand: region-a's shares stay on its own engines
		// (the plan learns these long requests' latency within seconds and spreads region-a
		// over both regions, which is the plan's pooling, not this test's).
		ControlArgs: []string{"--solve-period", "10m"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := s.Nodes["region-a"]
	// About 1,600 tokens each (4 bytes a token), a different prefix key each.
	long := func(i int) string { return fmt.Sprintf("burst %d: ", i) + strings.Repeat("lorem ipsum dolor ", 350) }

	// One at a time: 2,600 tokens of work (prompt + decode allowance) fit under 4,000.
	// The first requests also let the sidecar's scrape learn every engine's cache size.
	before := len(readAccessLog(t, node.AccessLog))
	const alone = 4
	for i := range alone {
		r, err := chat(ctx, node.URL, model, long(i), false, nil)
		if err != nil || r.status != 200 {
			t.Fatalf("request %d alone: %v, status %d: %s", i, err, r.status, r.body)
		}
		if !strings.HasPrefix(r.servedBy, "a-") {
			t.Fatalf("request %d alone was served by %s, want region-a's engines", i, r.servedBy)
		}
		time.Sleep(300 * time.Millisecond)
	}

	const burst = 12
	var wg sync.WaitGroup
	errs := make(chan error, burst)
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := chat(ctx, node.URL, model, long(100+i), false, nil)
			if err == nil && r.status != 200 {
				err = fmt.Errorf("status %d: %s", r.status, r.body)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("burst request: %v", err)
	}

	entries := waitAccessLog(t, node.AccessLog, before+alone+burst)[before:]
	overflowed := map[string]int{}
	for i, e := range entries {
		d := e.Decision
		if d == nil || d.Result != "steered" {
			t.Fatalf("entry %d: decision %+v, want a steered one", i, d)
		}
		served := s.EngineByAddress(e.UpstreamHost)
		if i < alone && d.Overflowed {
			t.Errorf("request %d, sent alone, overflowed to %s", i, served)
		}
		if d.Overflowed != strings.HasPrefix(served, "b-") {
			t.Errorf("entry %d: served by %s, decision overflowed=%v: want overflow exactly when region-b serves", i, served, d.Overflowed)
		}
		if d.Overflowed {
			overflowed[served]++
		}
	}
	t.Logf("overflowed in the burst of %d: %v", burst, overflowed)
	if overflowed["b-0"]+overflowed["b-1"] == 0 {
		t.Errorf("a burst of %d long prompts into region-a's two engines overflowed none to region-b", burst)
	}
}
