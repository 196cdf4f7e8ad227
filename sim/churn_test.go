package sim

import (
	"math"
	"testing"
	"time"
)

// Steady-state churn leaves out the warm-up: weights that flip while the plan learns the
// workload count in WeightChurn, not in SteadyWeightChurn; moves after it count in both.
func TestSteadyChurnLeavesOutWarmUp(t *testing.T) {
	var samples []WeightSample
	for s := range 180 {
		w := []float64{0.5, 0.5}
		switch {
		case s < 60 && s%2 == 0:
			w = []float64{1, 0}
		case s < 60:
			w = []float64{0, 1}
		case s >= 100:
			w = []float64{0.6, 0.4}
		}
		samples = append(samples, WeightSample{At: time.Duration(s) * time.Second, W: [][]float64{w}})
	}
	span := 3 * time.Minute
	steady, rest := steadySamples(samples, span)
	if rest != 2*time.Minute || steady[0].At != time.Minute {
		t.Fatalf("steady part starts at %v and covers %v, want 1m0s and 2m0s", steady[0].At, rest)
	}
	if got := churn(steady, rest); math.Abs(got-0.05) > 1e-9 {
		t.Errorf("steady churn %v, want 0.05 (one move of 0.1 over two minutes)", got)
	}
	if got := maxShareStep(steady); math.Abs(got-0.1) > 1e-9 {
		t.Errorf("steady max share step %v, want 0.1", got)
	}
	if got := churn(samples, span); got < 10 {
		t.Errorf("whole-run churn %v, want the warm-up's flips counted (> 10 per minute)", got)
	}
	// A run shorter than two minutes keeps its second half.
	if steady, rest := steadySamples(samples[:80], 80*time.Second); rest != 40*time.Second || steady[0].At != 40*time.Second {
		t.Errorf("short run: steady part starts at %v and covers %v, want 40s and 40s", steady[0].At, rest)
	}
}
