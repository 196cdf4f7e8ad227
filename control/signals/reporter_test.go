package signals

import (
	"math"
	"testing"

	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// What a reporter said of an engine is its own: it leaves with the reporter, fades while
// the reporter is silent, and one reporter among two moves the mean only by its share.
func TestTrustReporterViewsLeaveAndFade(t *testing.T) {
	a, clk := newTestAggregator(t)
	hl := DefaultConfig().HalfLife
	penalty := func() float64 { return a.Snapshot([]EngineSpec{spec}).Engines["e1"].Penalty }
	mustReport(a, report("n1", "forger", 0, &meridianv1.EngineObservation{Engine: "e1", Requests: 10, Errors: 10, Penalty: 0.1}))
	mustReport(a, report("n2", "honest", 0, &meridianv1.EngineObservation{Engine: "e1", Requests: 10, Penalty: 1}))
	if p := penalty(); math.Abs(p-0.55) > 1e-9 {
		t.Fatalf("penalty %v with reports 0.1 and 1, want their mean 0.55", p)
	}
	if r := a.Snapshot([]EngineSpec{spec}).Engines["e1"].ErrorRate; math.Abs(r-0.5) > 1e-9 {
		t.Fatalf("error rate %v, want 0.5 (10 of 20 requests failed)", r)
	}
	// Silent for one half-life: the forger's 0.1 is halfway back to 1 (0.55), the mean 0.775.
	clk.advance(hl)
	if p := penalty(); math.Abs(p-0.775) > 1e-9 {
		t.Fatalf("penalty %v one half-life later, want 0.775", p)
	}
	a.ForgetSidecar("n1", "forger")
	if p := penalty(); p != 1 {
		t.Fatalf("penalty %v after the forger left, want 1", p)
	}
	if r := a.Snapshot([]EngineSpec{spec}).Engines["e1"].ErrorRate; r != 0 {
		t.Fatalf("error rate %v after the forger left, want 0", r)
	}
	// Engines that leave the fleet leave the aggregator.
	a.Snapshot(nil)
	a.mu.Lock()
	n := len(a.engines)
	a.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d engines kept after none is listed", n)
	}
}
