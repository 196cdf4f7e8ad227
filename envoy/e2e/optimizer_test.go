package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/xdsapi"
)

// TestE2EOptimizerSpillsAcrossRegions drives region-a past what its own engines can take.
// The sidecar reports the demand, the control server's LP moves the excess to region-b's
// farther engines, and Envoy in region-a ends up holding those weights and using them;
// when the load stops, region-a goes back to its own engines.
func TestE2EOptimizerSpillsAcrossRegions(t *testing.T) {
	fast := []string{"--ttft", "20ms", "--itl", "5ms"}
	s := startStack(t, stack.Spec{
		Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}, {Name: "region-b", Region: "b"}},
		Engines: []stack.EngineSpec{
			{Name: "a-0", Region: "a", Models: []string{model}, CapacityRPS: 5, Args: fast},
			{Name: "a-1", Region: "a", Models: []string{model}, CapacityRPS: 5, Args: fast},
			{Name: "b-0", Region: "b", Models: []string{model}, CapacityRPS: 5, Args: fast},
			{Name: "b-1", Region: "b", Models: []string{model}, CapacityRPS: 5, Args: fast},
		},
		ControlArgs: []string{"--solve-period", "250ms"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster := xdsapi.ClusterName(model)
	remote := func() float64 {
		ws, err := s.EnvoyWeights(ctx, "region-a")
		if err != nil {
			t.Fatal(err)
		}
		var far, all float64
		for addr, w := range ws[cluster] {
			all += float64(w)
			if n := s.EngineByAddress(addr); n == "b-0" || n == "b-1" {
				far += float64(w)
			}
		}
		return far / all
	}
	if r := remote(); r != 0 {
		t.Fatalf("idle: region-a sends %.2f of its traffic to region-b, want 0", r)
	}

	// 14 req/s into region-a: its engines take 2×5×0.9 = 9, so about 5/14 must cross.
	var mu sync.Mutex
	served := map[string]int{}
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / 14)
		defer tick.Stop()
		for i := 0; i < 14*30; i++ { // bounded: at most 30 s
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				r, err := chat(ctx, s.Nodes["region-a"].URL, model, fmt.Sprintf("spill %d", i), true, nil)
				if err == nil && r.status == 200 {
					mu.Lock()
					served[r.servedBy]++
					mu.Unlock()
				}
			}(i)
		}
	}()
	var far float64
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if far = remote(); far >= 0.2 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if far < 0.2 || far > 0.6 {
		stopLoad()
		wg.Wait()
		t.Fatalf("under 14 req/s region-a's Envoy sends %.2f to region-b, want about 5/14", far)
	}
	mu.Lock()
	served = map[string]int{}
	mu.Unlock()
	time.Sleep(3 * time.Second)
	mu.Lock()
	crossed := served["b-0"] + served["b-1"]
	total := 0
	for _, n := range served {
		total += n
	}
	mu.Unlock()
	stopLoad()
	wg.Wait()
	if total == 0 || float64(crossed)/float64(total) < 0.1 {
		t.Fatalf("with the far weights in place, %d of %d requests were served in region-b", crossed, total)
	}
	t.Logf("under load: Envoy weight share to region-b %.2f; %d of %d requests served there", far, crossed, total)

	// Demand gone: once the reports show it, region-a returns home.
	deadline = time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if far = remote(); far == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("15 s after the load stopped region-a still sends %.2f to region-b", far)
}
