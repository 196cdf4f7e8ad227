package signals

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"

	"github.com/meridian-router/meridian/control/solver"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// fakeClock is a manual clock for the aggregator.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestAggregator(t *testing.T) (*Aggregator, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	a, err := NewAggregator(DefaultConfig(), clk.now)
	if err != nil {
		t.Fatal(err)
	}
	return a, clk
}

var spec = EngineSpec{Name: "e1", Models: []string{"llama"}, Capacity: 50, Curve: solver.Curve{Base: 0.2, Queue: 0.2}}

func report(node, sidecar string, rps float64, obs ...*meridianv1.EngineObservation) *meridianv1.LoadReport {
	return &meridianv1.LoadReport{NodeId: node, SidecarId: sidecar, WindowSeconds: 1,
		Demand: []*meridianv1.ModelDemand{{Model: "llama", RequestsPerSecond: rps}}, Engines: obs}
}

func TestEngineStates(t *testing.T) {
	cfg := DefaultConfig()
	tests := []struct {
		name  string
		steps func(a *Aggregator, clk *fakeClock)
		want  State
	}{
		{"listed, never heard, within grace", func(a *Aggregator, clk *fakeClock) {}, Unknown},
		{"listed, never heard, grace over", func(a *Aggregator, clk *fakeClock) {
			a.Snapshot([]EngineSpec{spec})
			clk.advance(cfg.StaleAfter + time.Second)
		}, Suspect},
		{"scraped just now", func(a *Aggregator, clk *fakeClock) { a.ObserveScrape("e1", enginemetrics.Sample{}) }, OK},
		{"scrapes stopped", func(a *Aggregator, clk *fakeClock) {
			a.ObserveScrape("e1", enginemetrics.Sample{Running: 4})
			clk.advance(cfg.StaleAfter + time.Second)
			a.ObserveScrapeError("e1", errors.New("connection refused"))
		}, Suspect},
		{"scrapes stopped, sidecars see it answer", func(a *Aggregator, clk *fakeClock) {
			a.ObserveScrape("e1", enginemetrics.Sample{})
			clk.advance(cfg.StaleAfter + time.Second)
			mustReport(a, report("n1", "s1", 5, &meridianv1.EngineObservation{Engine: "e1", Requests: 10}))
		}, Degraded},
		{"most requests fail", func(a *Aggregator, clk *fakeClock) {
			a.ObserveScrape("e1", enginemetrics.Sample{})
			mustReport(a, report("n1", "s1", 5, &meridianv1.EngineObservation{Engine: "e1", Requests: 10, Errors: 9}))
		}, Failing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, clk := newTestAggregator(t)
			tt.steps(a, clk)
			snap := a.Snapshot([]EngineSpec{spec})
			es := snap.Engines["e1"]
			if es.State != tt.want {
				t.Fatalf("state %v, want %v", es.State, tt.want)
			}
			healthy := snap.SolverEngines([]EngineSpec{spec}, []string{"llama"})[0].Healthy
			if wantHealthy := tt.want != Suspect && tt.want != Failing; healthy != wantHealthy || es.Suspect == wantHealthy {
				t.Fatalf("healthy %v suspect %v for state %v", healthy, es.Suspect, es.State)
			}
		})
	}
}

func mustReport(a *Aggregator, r *meridianv1.LoadReport) {
	if err := a.ObserveReport(r); err != nil {
		panic(err)
	}
}

// TestSuspectIsNotIdle: a stale engine keeps its last smoothed load in the
// snapshot (it is not reported as idle) and gets no traffic.
func TestSuspectIsNotIdle(t *testing.T) {
	a, clk := newTestAggregator(t)
	a.ObserveScrape("e1", enginemetrics.Sample{Running: 12, Waiting: 30})
	clk.advance(time.Minute)
	es := a.Snapshot([]EngineSpec{spec}).Engines["e1"]
	if es.State != Suspect || es.Running != 12 || es.Waiting != 30 {
		t.Fatalf("state %v running %v waiting %v: a silent engine must be suspect with its last load", es.State, es.Running, es.Waiting)
	}
}

// LastWaiting is the last successful scrape's queue as read, while Waiting smooths it;
// a failed scrape changes neither.
func TestLastWaitingIsTheLastScrape(t *testing.T) {
	a, clk := newTestAggregator(t)
	if es := a.Snapshot([]EngineSpec{spec}).Engines["e1"]; es.LastWaiting != 0 {
		t.Fatalf("never scraped: last waiting %v, want 0", es.LastWaiting)
	}
	a.ObserveScrape("e1", enginemetrics.Sample{Waiting: 0})
	clk.advance(2 * time.Second)
	a.ObserveScrape("e1", enginemetrics.Sample{Waiting: 30})
	clk.advance(2 * time.Second)
	a.ObserveScrapeError("e1", enginemetrics.ErrScrape)
	es := a.Snapshot([]EngineSpec{spec}).Engines["e1"]
	if es.LastWaiting != 30 {
		t.Fatalf("last waiting %v, want the last successful scrape's 30", es.LastWaiting)
	}
	if !(es.Waiting > 0 && es.Waiting < 30) {
		t.Fatalf("smoothed waiting %v, want between the two scrapes", es.Waiting)
	}
}

func TestScrapeRates(t *testing.T) {
	a, clk := newTestAggregator(t)
	h := func(count, sum float64) enginemetrics.Histogram {
		return enginemetrics.Histogram{Count: count, Sum: sum, Bounds: []float64{1}, Cumulative: []float64{count}}
	}
	a.ObserveScrape("e1", enginemetrics.Sample{TTFT: h(100, 20), ITL: h(1000, 30), PrefixQueries: 1000, PrefixHits: 100})
	clk.advance(5 * time.Second)
	a.ObserveScrape("e1", enginemetrics.Sample{TTFT: h(150, 35), ITL: h(2000, 50), PrefixQueries: 3000, PrefixHits: 1700})
	es := a.Snapshot([]EngineSpec{spec}).Engines["e1"]
	want := map[string]float64{"arrival": 10, "ttft": 0.3, "itl": 0.02, "prefix hit": 0.8}
	got := map[string]float64{"arrival": es.ArrivalRate, "ttft": es.TTFT, "itl": es.ITL, "prefix hit": es.PrefixHitRate}
	for k := range want {
		if math.Abs(got[k]-want[k]) > 1e-12 {
			t.Errorf("%s = %v, want %v", k, got[k], want[k])
		}
	}
	// A restart resets the counters: no negative rate, the last one holds.
	clk.advance(5 * time.Second)
	a.ObserveScrape("e1", enginemetrics.Sample{TTFT: h(3, 1)})
	if es := a.Snapshot([]EngineSpec{spec}).Engines["e1"]; es.ArrivalRate != 10 || es.TTFT != 0.3 {
		t.Errorf("after a counter reset: arrival %v ttft %v, want the previous 10 and 0.3", es.ArrivalRate, es.TTFT)
	}
}

// TestHalfLife: an observation spanning one half-life moves the average
// halfway, and two spanning half as long each do the same.
func TestHalfLife(t *testing.T) {
	hl := DefaultConfig().HalfLife
	for _, tt := range []struct {
		spans []time.Duration
		want  float64
	}{
		{[]time.Duration{hl}, 5},
		{[]time.Duration{hl / 2, hl / 2}, 5},
		{[]time.Duration{2 * hl}, 7.5},
	} {
		var e ewma
		e.add(0, 0, hl)
		for _, s := range tt.spans {
			e.add(10, s, hl)
		}
		if math.Abs(e.value(-1)-tt.want) > 1e-9 {
			t.Errorf("spans %v: %v, want %v", tt.spans, e.value(-1), tt.want)
		}
	}
}

func TestDemand(t *testing.T) {
	cfg := DefaultConfig()
	a, clk := newTestAggregator(t)
	mustReport(a, report("n1", "s1", 10))
	mustReport(a, report("n1", "s2", 5))
	mustReport(a, report("n2", "s1", 7))
	snap := a.Snapshot(nil)
	if got := snap.SolverDemand([]string{"n1", "n2", "n3"}, []string{"llama", "other"}); !reflect.DeepEqual(got, [][]float64{{15, 0}, {7, 0}, {0, 0}}) {
		t.Fatalf("demand %v", got)
	}
	// n2 goes silent: its demand holds while stale, then is forgotten.
	clk.advance(cfg.StaleAfter + time.Second)
	mustReport(a, report("n1", "s1", 10))
	mustReport(a, report("n1", "s2", 5))
	snap = a.Snapshot(nil)
	if snap.Demand["n2"]["llama"] != 7 || !reflect.DeepEqual(snap.StaleNodes, []string{"n2"}) {
		t.Fatalf("stale node: demand %v stale %v", snap.Demand["n2"], snap.StaleNodes)
	}
	clk.advance(cfg.ForgetAfter + time.Second)
	if snap = a.Snapshot(nil); len(snap.Demand) != 0 {
		t.Fatalf("after ForgetAfter: demand %v", snap.Demand)
	}
}

func TestPenaltyScalesCapacity(t *testing.T) {
	a, _ := newTestAggregator(t)
	a.ObserveScrape("e1", enginemetrics.Sample{})
	mustReport(a, report("n1", "s1", 5, &meridianv1.EngineObservation{Engine: "e1", Requests: 10, Penalty: 0.5}))
	eng := a.Snapshot([]EngineSpec{spec}).SolverEngines([]EngineSpec{spec}, []string{"other", "llama"})[0]
	if eng.Capacity != 25 || !reflect.DeepEqual(eng.Models, []int{1}) || !eng.Healthy {
		t.Fatalf("engine %+v: want capacity 25 (50 × penalty 0.5), models [1], healthy", eng)
	}
}

func TestBadReports(t *testing.T) {
	a, _ := newTestAggregator(t)
	for _, r := range []*meridianv1.LoadReport{
		{WindowSeconds: 1},
		{NodeId: "n", WindowSeconds: 0},
		{NodeId: "n", WindowSeconds: 1, Demand: []*meridianv1.ModelDemand{{Model: "m", RequestsPerSecond: math.NaN()}}},
		{NodeId: "n", WindowSeconds: 1, Engines: []*meridianv1.EngineObservation{{Engine: "e", Requests: 1, Errors: 2}}},
	} {
		if err := a.ObserveReport(r); !errors.Is(err, ErrBadReport) {
			t.Errorf("report %v: error %v, want ErrBadReport", r, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.HalfLife = 0 },
		func(c *Config) { c.ForgetAfter = c.StaleAfter / 2 },
		func(c *Config) { c.FailingErrorRate = 1.5 },
		func(c *Config) { c.Fit.Window = 1 },
	} {
		c := DefaultConfig()
		mod(&c)
		if _, err := NewAggregator(c, time.Now); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// A Failing engine gets no traffic; its error rate must fade so it is tried again.
func TestFailingEngineIsRetriedAfterItsErrorsFade(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := DefaultConfig()
	a, err := NewAggregator(cfg, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	spec := []EngineSpec{{Name: "e", Models: []string{"m"}, Capacity: 10}}
	a.ObserveScrape("e", enginemetrics.Sample{})
	for i := 0; i < 5; i++ {
		if err := a.ObserveReport(&meridianv1.LoadReport{NodeId: "n", SidecarId: "s", WindowSeconds: 1,
			Engines: []*meridianv1.EngineObservation{{Engine: "e", Requests: 10, Errors: 10}}}); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
	}
	if st := a.Snapshot(spec).Engines["e"]; st.State != Failing || !st.Suspect {
		t.Fatalf("after 5 s of errors: %v, want failing", st.State)
	}
	now = now.Add(3 * cfg.HalfLife) // no requests since: nothing new was learned
	a.ObserveScrape("e", enginemetrics.Sample{})
	if st := a.Snapshot(spec).Engines["e"]; st.State == Failing || st.Suspect {
		t.Fatalf("three half-lives after its last error, with fresh scrapes: %v (error rate %.2f), want it tried again", st.State, st.ErrorRate)
	}
}

// Engines of one class (same models, capacity and default curve) plan with one curve, fitted
// to all their points: an engine that has served little is not left on the default while a
// peer is modelled as fast from its own few points. An engine whose own fit is more than
// twice as slow as its class's is modelled apart.
func TestClassSharesOneCurve(t *testing.T) {
	a, clk := newTestAggregator(t)
	specs := []EngineSpec{spec, spec, spec, spec}
	for i := range specs {
		specs[i].Name = []string{"fast", "idle", "other", "slow"}[i]
	}
	ttft := map[string]float64{"fast": 0.05, "other": 0.06, "slow": 0.6}
	count := map[string]float64{}
	sum := map[string]float64{}
	for range 40 {
		for name, l := range ttft {
			count[name] += 10
			sum[name] += 10 * l
			a.ObserveScrape(name, enginemetrics.Sample{TTFT: enginemetrics.Histogram{Count: count[name], Sum: sum[name], Bounds: []float64{1}, Cumulative: []float64{count[name]}}})
		}
		a.ObserveScrape("idle", enginemetrics.Sample{})
		clk.advance(2 * time.Second)
	}
	snap := a.Snapshot(specs)
	fast, idle, other, slow := snap.Engines["fast"], snap.Engines["idle"], snap.Engines["other"], snap.Engines["slow"]
	if !fast.OwnFitted || !fast.Fitted || !idle.Fitted || idle.OwnFitted {
		t.Fatalf("fitted: fast own %v class %v, idle own %v class %v", fast.OwnFitted, fast.Fitted, idle.OwnFitted, idle.Fitted)
	}
	if fast.Curve != idle.Curve || fast.Curve != other.Curve {
		t.Fatalf("one class, curves differ: fast %+v, idle %+v, other %+v", fast.Curve, idle.Curve, other.Curve)
	}
	if fast.Curve == fast.OwnCurve {
		t.Fatalf("the fast engine plans with its own fit %+v, not its class's", fast.OwnCurve)
	}
	if slow.Curve != slow.OwnCurve || slow.Curve.Latency(25, 50) < 2*fast.Curve.Latency(25, 50) {
		t.Fatalf("the slow engine (own %+v) plans with %+v; its class's is %+v", slow.OwnCurve, slow.Curve, fast.Curve)
	}
}

// The class hit rate is the class's prompt tokens served from cache over those asked for,
// whichever engine they went to: one busy engine's hits weigh by its tokens, and an idle
// member of the class shares the rate.
func TestClassHitRateWeighsTokensOverTheClass(t *testing.T) {
	a, clk := newTestAggregator(t)
	specs := []EngineSpec{spec, spec, spec}
	for i := range specs {
		specs[i].Name = []string{"busy", "light", "idle"}[i]
	}
	var q, h = map[string]float64{}, map[string]float64{}
	for range 30 {
		q["busy"], h["busy"] = q["busy"]+9000, h["busy"]+6000  // 2/3 hit
		q["light"], h["light"] = q["light"]+1000, h["light"]+0 // none
		for _, name := range []string{"busy", "light", "idle"} {
			a.ObserveScrape(name, enginemetrics.Sample{PrefixQueries: q[name], PrefixHits: h[name]})
		}
		clk.advance(2 * time.Second)
	}
	snap := a.Snapshot(specs)
	for _, name := range []string{"busy", "light", "idle"} {
		if got := snap.Engines[name].ClassHitRate; math.Abs(got-0.6) > 1e-9 {
			t.Errorf("%s: class hit rate %v, want 6000/10000 = 0.6", name, got)
		}
	}
	if got := snap.Engines["light"].PrefixHitRate; got != 0 {
		t.Errorf("light: own hit rate %v, want 0", got)
	}
	other := spec
	other.Name, other.Capacity = "other-class", 2*spec.Capacity
	if got := a.Snapshot([]EngineSpec{other}).Engines["other-class"].ClassHitRate; got != 0 {
		t.Errorf("an engine of another class that was never asked: class hit rate %v, want 0", got)
	}
}

// A node's demand is summed over its sidecars in one order, so the same reports give the
// same snapshot to the last bit (and the optimizer the same plan) on every run; summed in
// Go's map order, 0.1 + 0.2 + 0.3 rounds differently run to run.
func TestSnapshotIsTheSameBitForBit(t *testing.T) {
	a, _ := newTestAggregator(t)
	for i := range 40 {
		if err := a.ObserveReport(report("n", fmt.Sprintf("s%02d", i), 0.1*float64(i%7+1)+1e-9*float64(i))); err != nil {
			t.Fatal(err)
		}
	}
	first := a.Snapshot([]EngineSpec{spec}).Demand["n"]["llama"]
	for range 50 {
		if got := a.Snapshot([]EngineSpec{spec}).Demand["n"]["llama"]; math.Float64bits(got) != math.Float64bits(first) {
			t.Fatalf("demand %v, then %v: the sum depends on map order", first, got)
		}
	}
}

// At a few requests per second a node's demand estimate rests on DemandEvidence requests:
// its half-life grows to DemandEvidence / demand, so one noisy second moves it little. At
// high rates the half-life stays HalfLife, and a burst still shows within seconds.
func TestDemandHalfLifeGrowsAtLowRates(t *testing.T) {
	step := func(base, burst float64) (moved float64) {
		a, clk := newTestAggregator(t)
		for range 3 { // settle on base
			if err := a.ObserveReport(report("n", "s", base)); err != nil {
				t.Fatal(err)
			}
			a.Snapshot([]EngineSpec{spec})
			clk.advance(time.Second)
		}
		if err := a.ObserveReport(report("n", "s", burst)); err != nil {
			t.Fatal(err)
		}
		got := a.Snapshot([]EngineSpec{spec}).Demand["n"]["llama"]
		return (got - base) / (burst - base)
	}
	cfg := DefaultConfig()
	// 1 req/s: a half-life of 20 s (20 requests), so a 1 s report moves 1 - 2^(-1/20).
	if got, want := step(1, 3), 1-math.Exp2(-1/cfg.DemandEvidence); math.Abs(got-want) > 1e-9 {
		t.Errorf("at 1 req/s one report moved the estimate %.4f of the way, want %.4f (half-life %v s)", got, want, cfg.DemandEvidence)
	}
	// 100 req/s: 20 requests take 0.2 s, so the 3 s half-life applies.
	if got, want := step(100, 300), 1-math.Exp2(-1/cfg.HalfLife.Seconds()); math.Abs(got-want) > 1e-9 {
		t.Errorf("at 100 req/s one report moved the estimate %.4f of the way, want %.4f (half-life %v)", got, want, cfg.HalfLife)
	}
	// 0.01 req/s: capped at MaxDemandHalfLife.
	if got, want := step(0.01, 0.03), 1-math.Exp2(-1/cfg.MaxDemandHalfLife.Seconds()); math.Abs(got-want) > 1e-9 {
		t.Errorf("at 0.01 req/s one report moved the estimate %.4f of the way, want %.4f (the cap %v)", got, want, cfg.MaxDemandHalfLife)
	}
	bad := cfg
	bad.DemandEvidence = -1
	if bad.Validate() == nil {
		t.Error("a negative demand_evidence must be refused")
	}
	bad = cfg
	bad.MaxDemandHalfLife = time.Second
	if bad.Validate() == nil {
		t.Error("max_demand_half_life below half_life must be refused")
	}
}

// A sustained step in a slow node's demand is a shift, not noise: the fast estimate leaves
// the slow one by more than Poisson noise allows, and the demand follows within seconds
// instead of the lengthened half-life's minute.
func TestDemandFollowsAShiftAtLowRates(t *testing.T) {
	// The slow estimate alone (50 s half-life) would be at 1 + 3 x (1 - 2^(-5/50)) = 1.20
	// after 5 s and 1.56 after 15 s; the fast one (3 s) at 3.05 and 3.91.
	rates := slices.Repeat([]float64{1}, 30)
	demand := reportEverySecond(t, append(rates, slices.Repeat([]float64{4}, 15)...))
	at := func(i int) float64 { return demand[29+i] } // i seconds into the step
	if at(5) < 2 || at(15) < 3 {
		t.Errorf("demand went from 1 to 4 req/s; the estimate is %.2f after 5 s and %.2f after 15 s: the shift was not followed", at(5), at(15))
	}
}

// reportEverySecond feeds one sidecar's reports of the given rates, one a second, and
// returns the node's demand after each.
func reportEverySecond(t *testing.T, rates []float64) []float64 {
	t.Helper()
	a, clk := newTestAggregator(t)
	out := make([]float64, len(rates))
	for i, r := range rates {
		if err := a.ObserveReport(report("n", "s", r)); err != nil {
			t.Fatal(err)
		}
		out[i] = a.Snapshot([]EngineSpec{spec}).Demand["n"]["llama"]
		clk.advance(time.Second)
	}
	return out
}

// A burst of a few requests in one report at a low rate is noise: the fast estimate leaves
// the slow one's noise for a snapshot and comes back, and the demand must not follow it
// (each time it did, the plan spilled for seconds and came back).
func TestDemandIgnoresAOneReportBurst(t *testing.T) {
	// The burst is past the shift rule's own threshold, so this test covers the rule.
	a1 := 1 - math.Exp2(-1/DefaultConfig().HalfLife.Seconds())
	if fast := 1.4 + a1*(7-1.4); fast-1.4 < shiftSigmas*math.Sqrt(a1/(2-a1)*1.4) {
		t.Fatalf("a burst to 7 req/s moves the fast estimate to %.2f, within the noise", fast)
	}
	rates := append(slices.Repeat([]float64{1.4}, 60), 7, 1.4, 1.4, 1.4, 1.4, 1.4)
	// The slow estimate (a 36 s half-life at 1.4 req/s) moves 5.6 x (1 - 2^(-1/36)) = 0.11.
	if peak := slices.Max(reportEverySecond(t, rates)[60:]); peak > 1.6 {
		t.Errorf("a one-second burst (7 requests at 1.4 req/s) took the demand to %.2f: followed as a shift", peak)
	}
}
