package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// conversationTrace writes a Mooncake-format trace of n requests from multi-turn
// conversations: each turn repeats its conversation's previous prompt and adds blocks, so
// prefix caching and affinity matter, as in the real traces.
func conversationTrace(n int, seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 1))
	type conv struct{ blocks []int }
	var convs []*conv
	next := 0
	var b strings.Builder
	for i := range n {
		var c *conv
		if len(convs) == 0 || rng.Float64() < 0.35 {
			c = &conv{}
			convs = append(convs, c)
		} else {
			c = convs[rng.IntN(len(convs))]
		}
		for range 2 + rng.IntN(6) {
			c.blocks = append(c.blocks, next)
			next++
		}
		if len(c.blocks) > 60 {
			c.blocks = c.blocks[:8] // a new topic on the same system prompt
		}
		ids := fmt.Sprint(c.blocks)
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": %s}`+"\n",
			i*250, len(c.blocks)*512-100, 20+rng.IntN(200), strings.ReplaceAll(ids, " ", ", "))
	}
	return b.String()
}

func testSimConfig(t *testing.T, tr string, sc Scenario) *Config {
	t.Helper()
	reqs, err := trace.Read(strings.NewReader(tr), "test.jsonl", trace.FormatAuto)
	if err != nil {
		t.Fatalf("read trace: %v", err)
	}
	ecfg := engine.A100Llama8B(trace.BlockTokens)
	ecfg.KVBlocks = 200
	return &Config{Trace: reqs, Regions: DefaultRegions, EnginesPerRegion: 2, RTT: DefaultRTT(),
		Engine: ecfg, Load: 0.7, Scenario: sc, Policies: PolicyNames, Seed: 7,
		Retries: 1, Deployment: DeployGlobal}
}

func byPolicy(t *testing.T, results []Result) map[string]Result {
	t.Helper()
	m := map[string]Result{}
	for _, r := range results {
		m[r.Policy] = r
	}
	return m
}

func TestSteadyRunDistinguishesPolicies(t *testing.T) {
	cfg := testSimConfig(t, conversationTrace(600, 1), Steady)
	results, w, err := Run(context.Background(), cfg, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(Table(results, w))
	r := byPolicy(t, results)
	for _, res := range results {
		// Baselines never shed; meridian's control plane may shed a little on demand noise.
		maxShed := 0
		if strings.HasPrefix(res.Policy, "meridian") {
			maxShed = res.Requests / 50
		}
		if res.Completed+res.Shed != res.Requests || res.Shed > maxShed {
			t.Errorf("%s: %d of %d completed, %d shed", res.Policy, res.Completed, res.Requests, res.Shed)
		}
		if !(res.TTFTP50 > 0 && res.TTFTP50 <= res.TTFTP90 && res.TTFTP90 <= res.TTFTP99) {
			t.Errorf("%s: TTFT percentiles %v %v %v not ordered", res.Policy, res.TTFTP50, res.TTFTP90, res.TTFTP99)
		}
		if res.KVHitRate > res.KVHitUpperBound {
			t.Errorf("%s: hit rate %v above the infinite-cache bound %v", res.Policy, res.KVHitRate, res.KVHitUpperBound)
		}
	}
	if w.UpperBound < 0.5 {
		t.Fatalf("test trace shares too little: bound %v", w.UpperBound)
	}
	if rr, ph := r["round-robin"].KVHitRate, r["prefix-hash"].KVHitRate; !(ph > 2*rr) {
		t.Errorf("prefix-hash hit rate %v not above 2x round-robin's %v", ph, rr)
	}
	if rr, m := r["round-robin"].KVHitRate, r["meridian"].KVHitRate; !(m > 2*rr) {
		t.Errorf("meridian hit rate %v not above 2x round-robin's %v", m, rr)
	}
	if r["round-robin"].WeightChurn != 0 || r["p-controller"].WeightChurn <= 0 {
		t.Errorf("churn: round-robin %v (want 0), p-controller %v (want > 0)",
			r["round-robin"].WeightChurn, r["p-controller"].WeightChurn)
	}
}

func TestRunIsDeterministic(t *testing.T) {
	tr := conversationTrace(300, 2)
	run := func() []Result {
		cfg := testSimConfig(t, tr, Outage)
		res, _, err := Run(context.Background(), cfg, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if a, b := run(), run(); !reflect.DeepEqual(a, b) {
		t.Fatal("two runs of the same config differ")
	}
}

func TestScenarios(t *testing.T) {
	tr := conversationTrace(450, 3)
	tests := []struct {
		sc    Scenario
		check func(t *testing.T, w *Workload, r map[string]Result)
	}{
		{Step, func(t *testing.T, w *Workload, r map[string]Result) {
			if w.Requests[len(w.Requests)-1].ID != len(w.Requests)-1 || len(w.Requests) <= 450 {
				t.Errorf("step added no requests: %d", len(w.Requests))
			}
		}},
		{Outage, func(t *testing.T, w *Workload, r map[string]Result) {
			if rr := r["round-robin"]; rr.Retries == 0 {
				t.Errorf("round-robin made no retries through an outage: %+v", rr)
			}
		}},
		{Overload, func(t *testing.T, w *Workload, r map[string]Result) {
			if w.Load != overloadFactor {
				t.Errorf("overload offered %v x capacity", w.Load)
			}
		}},
		{SlowEngine, func(t *testing.T, w *Workload, r map[string]Result) {
			if len(w.Actions) != 1 || w.Actions[0].Slowdown != slowFactor {
				t.Errorf("slow-engine actions %+v", w.Actions)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(string(tc.sc), func(t *testing.T) {
			cfg := testSimConfig(t, tr, tc.sc)
			cfg.Policies = []string{"round-robin", "prefix-hash"}
			res, w, err := Run(context.Background(), cfg, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, w, byPolicy(t, res))
		})
	}
}

// azureTrace is n requests in the Azure trace's format, one a second: no prefix is
// shared, so nothing is cached and cold capacity is the capacity.
func azureTrace(t *testing.T, n int) []trace.Request {
	t.Helper()
	var b strings.Builder
	b.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	for i := range n {
		fmt.Fprintf(&b, "2023-11-16 %02d:%02d:%02d.0000000,%d,%d\n", 18+i/3600, i/60%60, i%60, 300+i*7%900, 20+i%50)
	}
	reqs, err := trace.Read(strings.NewReader(b.String()), "azure.csv", trace.FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func TestAzureTraceHasNoPrefixHits(t *testing.T) {
	cfg := testSimConfig(t, conversationTrace(1, 1), Steady)
	cfg.Trace = azureTrace(t, 200)
	res, w, err := Run(context.Background(), cfg, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.KVHitRate != 0 || r.Completed != 200 {
			t.Errorf("%s: hit rate %v, completed %d of 200", r.Policy, r.KVHitRate, r.Completed)
		}
	}
	if w.UpperBound != 0 {
		t.Errorf("bound %v for a trace without hash ids", w.UpperBound)
	}
}

func TestConfigValidateNamesFields(t *testing.T) {
	cfg := testSimConfig(t, conversationTrace(10, 1), "bogus")
	cfg.Load = 0
	cfg.Policies = []string{"random"}
	err := cfg.Validate()
	for _, field := range []string{"Scenario", "Load", "Policies"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("error %v does not name %s", err, field)
		}
	}
}

func TestLogHistQuantile(t *testing.T) {
	h := newLogHist()
	for i := 1; i <= 1000; i++ {
		h.observe(float64(i) / 1000)
	}
	for _, tc := range []struct{ q, want float64 }{{0.5, 0.5}, {0.99, 0.99}} {
		if got := h.quantile(tc.q); got < tc.want*0.99 || got > tc.want*1.01 {
			t.Errorf("quantile(%v) = %v, want %v within 1%%", tc.q, got, tc.want)
		}
	}
}

// Sheds are counted by the sidecar's verdict. Under overload meridian's come from the
// control server's shed fraction, and they still do when the control server waits for the
// engines to queue before it sends one (--shed-backlog): overload makes them queue. The
// trace shares no prefix, so 1.5x cold capacity is an overload (with a prefix cache's
// savings credited, a conversation trace's is not).
func TestOverloadShedsAreCountedByReason(t *testing.T) {
	reqs := azureTrace(t, 450)
	for _, backlog := range []time.Duration{0, 500 * time.Millisecond} {
		cfg := testSimConfig(t, conversationTrace(1, 1), Overload)
		cfg.Trace = reqs
		cfg.Policies = []string{"meridian-defaults"}
		cfg.ShedBacklog = backlog
		res, _, err := Run(context.Background(), cfg, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		r := res[0]
		counted := 0
		for _, n := range r.ShedReasons {
			counted += n
		}
		t.Logf("shed backlog %v: %d of %d shed, %v", backlog, r.Shed, r.Requests, r.ShedReasons)
		if r.Shed == 0 || counted != r.Shed || r.ShedReasons["shed_quota"] == 0 {
			t.Errorf("shed backlog %v: %d shed, by reason %v: want every shed counted, the quota's among them",
				backlog, r.Shed, r.ShedReasons)
		}
	}
}

// In an outage, a per-region router has nowhere to send region 0's requests, and the
// event measure (region 0's requests of the middle third) shows it; meridian's plan sends
// them to the other regions.
func TestOutageEventGoodput(t *testing.T) {
	cfg := testSimConfig(t, conversationTrace(450, 3), Outage)
	cfg.Policies, cfg.Deployment, cfg.Load, cfg.SLO = []string{"llm-d", "meridian-defaults"}, DeployRegion, 0.4, DefaultSLO()
	res, w, err := Run(context.Background(), cfg, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(Table(res, w))
	r := byPolicy(t, res)
	want := 0
	for i := range w.Requests {
		if q := &w.Requests[i]; q.Cluster == 0 && q.Arrival >= w.Span/3 && q.Arrival < 2*w.Span/3 {
			want++
		}
	}
	for name, res := range r {
		if res.Event.Requests != want || want == 0 {
			t.Errorf("%s: %d event requests, want region 0's %d of the middle third", name, res.Event.Requests, want)
		}
	}
	if got := r["llm-d"].Event; got.SLOAttainment != 0 || got.SLOGoodputRPS != 0 {
		t.Errorf("llm-d per region served region 0's requests through its outage: %+v", got)
	}
	if got := r["meridian-defaults"].Event; got.SLOAttainment < 0.5 {
		t.Errorf("meridian-defaults met the SLO for %.2f of region 0's requests through its outage, want most", got.SLOAttainment)
	}
}

// TestTuneAppliesMeridiansConfiguration: what Config states of meridian's configuration
// replaces both policies' tuning, the fleet tuning's included; what it leaves unset does
// not.
func TestTuneAppliesMeridiansConfiguration(t *testing.T) {
	w := &Workload{ColdService: 2}
	sc := sidecarConfig()
	sc.Picker.Buckets, sc.MoveFactor = 1<<18, 3
	moveCost, minShare, rho := 0.02, 0.04, 0.97
	halfLife := 20 * time.Second
	cfg := &Config{Sidecar: &sc, MoveCost: &moveCost, MinShareChange: &minShare, RhoMax: &rho, ShedBacklog: time.Second, CacheHalfLife: &halfLife}
	for name, base := range map[string]tuning{"meridian-defaults": defaultTuning(w), "meridian": fleetTuning(w)} {
		got := cfg.tune(base)
		if got.sidecar.MoveFactor != 3 || got.sidecar.Picker.Buckets != simBuckets {
			t.Errorf("%s: move_factor %v, buckets %d; want the file's 3 and the simulator's %d", name,
				got.sidecar.MoveFactor, got.sidecar.Picker.Buckets, simBuckets)
		}
		if got.optimizer.Params.MoveCost != moveCost || got.optimizer.MinShareChange != minShare || got.optimizer.ShedBacklog != time.Second ||
			got.optimizer.Params.RhoMax != rho || got.signals.CacheHalfLife != halfLife {
			t.Errorf("%s: move cost %v, min share change %v, shed backlog %v, rho max %v, cache half-life %v", name,
				got.optimizer.Params.MoveCost, got.optimizer.MinShareChange, got.optimizer.ShedBacklog, got.optimizer.Params.RhoMax, got.signals.CacheHalfLife)
		}
		if unset := (&Config{}).tune(base); unset.optimizer.Params.MoveCost != base.optimizer.Params.MoveCost ||
			unset.optimizer.MinShareChange != base.optimizer.MinShareChange || unset.optimizer.Params.RhoMax != base.optimizer.Params.RhoMax ||
			unset.sidecar.MoveFactor != base.sidecar.MoveFactor || unset.signals.CacheHalfLife != base.signals.CacheHalfLife {
			t.Errorf("%s: an empty Config changed the tuning", name)
		}
	}
	deep := sidecarConfig()
	deep.Request.KeyBlocks *= 4
	deep.Request.MaxBlocks *= 2
	got, shipped := (&Config{Sidecar: &deep}).ladder(), (&Config{}).ladder()
	if got.first != 4*shipped.first || got.last != 2*shipped.last {
		t.Errorf("key ladder %+v with affinity_blocks x4 and max_blocks x2, %+v shipped: the ladder ignores the file", got, shipped)
	}
}

// A request its engine cannot admit on arrival waits for running requests to finish: the
// count of them grows with the load, never exceeds the completed requests, and the misses
// among them are among the SLO's misses.
func TestQueuedOnArrivalCountsRequestsThatWaitedForTheirEngine(t *testing.T) {
	tr := conversationTrace(400, 3)
	run := func(sc Scenario, load float64) Result {
		cfg := testSimConfig(t, tr, sc)
		cfg.Policies, cfg.Load = []string{"round-robin"}, load
		cfg.SLO = DefaultSLO()
		res, _, err := Run(context.Background(), cfg, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	light, over := run(Steady, 0.05), run(Overload, 0.7)
	t.Logf("queued on arrival: %d (%d missed) at 0.05, %d (%d missed) overloaded", light.QueuedOnArrival,
		light.QueuedMissed, over.QueuedOnArrival, over.QueuedMissed)
	for _, r := range []Result{light, over} {
		missed := r.Requests - int(math.Round(r.SLOAttainment*float64(r.Requests)))
		if r.QueuedOnArrival > r.Completed || r.QueuedMissed > r.QueuedOnArrival || r.QueuedMissed > missed {
			t.Errorf("%s: %d queued on arrival, %d of them missed, of %d completed and %d missed", r.Scenario,
				r.QueuedOnArrival, r.QueuedMissed, r.Completed, missed)
		}
	}
	if !(over.QueuedOnArrival > 2*light.QueuedOnArrival) || over.QueuedMissed == 0 {
		t.Errorf("overloaded: %d queued on arrival (%d missed), at 0.05 %d: want more than twice as many, some missed",
			over.QueuedOnArrival, over.QueuedMissed, light.QueuedOnArrival)
	}
}
