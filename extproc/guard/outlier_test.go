package guard

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/extproc/guard/guardtest"
)

// engineSim produces outcomes for one simulated engine.
type engineSim struct {
	name    string
	errRate float64
	ttft    time.Duration
	itl     time.Duration
}

func (e engineSim) outcome(r *rand.Rand) Outcome {
	jitter := func(d time.Duration) time.Duration { return time.Duration(float64(d) * (0.8 + 0.4*r.Float64())) }
	if r.Float64() < e.errRate {
		return Outcome{Engine: e.name, OK: false} // failed before the first byte
	}
	return Outcome{Engine: e.name, OK: true, TTFT: jitter(e.ttft), ITL: jitter(e.itl)}
}

func healthyFleet(n int) []engineSim {
	out := make([]engineSim, n)
	for i := range out {
		out[i] = engineSim{name: fmt.Sprintf("engine-%d", i), errRate: 0.01, ttft: 200 * time.Millisecond, itl: 20 * time.Millisecond}
	}
	return out
}

// run feeds every engine 50 outcomes per second of virtual time, evaluating once a
// second, and calls each(second, snapshot) after every evaluation.
func run(clk *guardtest.Clock, o *Outliers, fleet []engineSim, r *rand.Rand, seconds int, each func(int, *Penalties)) {
	for s := range seconds {
		for range 50 {
			clk.Advance(20 * time.Millisecond)
			for _, e := range fleet {
				o.Observe(e.outcome(r))
			}
		}
		each(s, o.Evaluate())
	}
}

func newTestOutliers(t *testing.T) (*Outliers, *guardtest.Clock) {
	t.Helper()
	clk := guardtest.NewClock()
	o, err := NewOutliers(DefaultOutlierConfig(), clk)
	if err != nil {
		t.Fatal(err)
	}
	return o, clk
}

func TestFailingEngineIsPenalizedAndRecovers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(*engineSim)
		reason Reason
		within int // seconds until the factor is at most 0.5
	}{
		// Errors show at once. A latency signal moves once the new samples outweigh
		// the decayed old ones (the median needs about one StatsHalfLife, 5 s).
		{"errors", func(e *engineSim) { e.errRate = 0.5 }, ReasonErrors, 3},
		{"slow-ttft", func(e *engineSim) { e.ttft *= 4 }, ReasonTTFT, 10},
		{"slow-itl", func(e *engineSim) { e.itl *= 3 }, ReasonITL, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, clk := newTestOutliers(t)
			r := rand.New(rand.NewPCG(1, 2))
			fleet := healthyFleet(6)
			bad := fleet[2].name
			peersUntouched := func(s int, p *Penalties) {
				for _, e := range fleet {
					if e.name != bad && p.Factor(e.name) != 1 {
						t.Fatalf("second %d: healthy %s has factor %v", s, e.name, p.Factor(e.name))
					}
				}
			}
			run(clk, o, fleet, r, 20, func(s int, p *Penalties) {
				peersUntouched(s, p)
				if f := p.Factor(bad); f != 1 {
					t.Fatalf("second %d: %s penalized (%v) while healthy", s, bad, f)
				}
			})

			tc.break_(&fleet[2])
			dropped := -1
			run(clk, o, fleet, r, 30, func(s int, p *Penalties) {
				peersUntouched(s, p)
				if dropped < 0 && p.Factor(bad) <= 0.5 {
					dropped = s + 1
					if st := status(p, bad); st.Reason&tc.reason == 0 {
						t.Errorf("%s penalized for %v, want %v", bad, st.Reason, tc.reason)
					}
				}
			})
			if dropped < 0 || dropped > tc.within {
				t.Fatalf("factor of the failing engine fell to 0.5 after %d s, want within %d s", dropped, tc.within)
			}
			if f := o.Penalties().Factor(bad); f > 0.1 {
				t.Errorf("after 30 s of failing, factor is %v, want at most 0.1", f)
			}

			fleet[2] = healthyFleet(3)[2]
			recovered := -1
			run(clk, o, fleet, r, 300, func(s int, p *Penalties) {
				peersUntouched(s, p)
				if recovered < 0 && p.Factor(bad) == 1 {
					recovered = s + 1
				}
			})
			if recovered < 0 {
				t.Fatalf("healed engine still has factor %v after 300 s", o.Penalties().Factor(bad))
			}
			t.Logf("factor ≤ 0.5 after %d s of failure; back to 1 after %d s of health", dropped, recovered)
		})
	}
}

func status(p *Penalties, engine string) EngineStatus {
	for _, s := range p.Engines() {
		if s.Engine == engine {
			return s
		}
	}
	return EngineStatus{}
}

// Penalties are relative: when every engine degrades together nobody is singled out,
// and comparisons need enough peers and enough samples.
func TestNoPenaltyWithoutAClearOutlier(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fleet func() []engineSim
		rate  int // outcomes per engine per second (divides 50)
	}{
		{"all-failing", func() []engineSim {
			f := healthyFleet(5)
			for i := range f {
				f[i].errRate = 0.5
			}
			return f
		}, 50},
		{"two-engines", func() []engineSim {
			f := healthyFleet(2)
			f[1].errRate = 0.9
			return f
		}, 50},
		{"ttft-twice-the-peers", func() []engineSim { // a queue running ahead in a burst
			f := healthyFleet(5)
			f[0].ttft *= 2 // below MinTTFTRatio
			return f
		}, 50},
		{"small-spread", func() []engineSim {
			f := healthyFleet(5)
			f[0].ttft = f[0].ttft * 13 / 10 // 30% slower: below MinTTFTRatio
			f[1].errRate = 0.04             // +3 points: below MinErrorRateExcess
			return f
		}, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, clk := newTestOutliers(t)
			r := rand.New(rand.NewPCG(3, 4))
			run(clk, o, tc.fleet(), r, 60, func(s int, p *Penalties) {
				for _, st := range p.Engines() {
					if st.Factor != 1 {
						t.Fatalf("second %d: %s penalized to %v (%v)", s, st.Engine, st.Factor, st.Reason)
					}
				}
			})
		})
	}
}

func TestTooFewSamplesAreNotJudged(t *testing.T) {
	o, clk := newTestOutliers(t)
	r := rand.New(rand.NewPCG(5, 6))
	fleet := healthyFleet(4)
	for range 60 {
		clk.Advance(time.Second)
		for _, e := range fleet {
			o.Observe(e.outcome(r))
		}
		// The bad engine sends one outcome per second: about 7 decayed samples
		// (1/s × 5 s / ln 2), under MinRequests (20), so its 100% error rate is not
		// yet evidence.
		o.Observe(Outcome{Engine: "rare", OK: false})
		if f := o.Evaluate().Factor("rare"); f != 1 {
			t.Fatalf("engine with too few samples penalized to %v", f)
		}
	}
}

func TestVersionChangesOnlyWithFactors(t *testing.T) {
	o, clk := newTestOutliers(t)
	r := rand.New(rand.NewPCG(7, 8))
	fleet := healthyFleet(5)
	var v uint64
	run(clk, o, fleet, r, 20, func(_ int, p *Penalties) { v = p.Version })
	if v != 0 {
		t.Fatalf("healthy fleet bumped the version to %d", v)
	}
	fleet[0].errRate = 0.6
	bumps := 0
	run(clk, o, fleet, r, 10, func(_ int, p *Penalties) {
		if p.Version != v {
			bumps++
			v = p.Version
		}
	})
	if bumps == 0 || bumps > 10 {
		t.Fatalf("%d version bumps while one engine's factor fell, want 1..10", bumps)
	}
}

func TestNilPenaltiesPenalizeNobody(t *testing.T) {
	var p *Penalties
	if p.Factor("x") != 1 || p.Engines() != nil {
		t.Fatal("a nil *Penalties must give factor 1 and no engines")
	}
}

func TestTTFTQuantiles(t *testing.T) {
	var s engineStats
	for i := 1; i <= 1000; i++ { // uniform 1..1000 ms
		s.add(Outcome{Engine: "e", OK: true, TTFT: time.Duration(i) * time.Millisecond})
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Millisecond}, {0.9, 900 * time.Millisecond}, {0.1, 100 * time.Millisecond}} {
		got := s.ttftQuantile(tc.q)
		if rel := math.Abs(float64(got)/float64(tc.want) - 1); rel > 0.1 {
			t.Errorf("quantile %.1f = %v, want %v ± 10%%", tc.q, got, tc.want)
		}
	}
	for _, d := range []time.Duration{0, time.Microsecond, 350 * time.Microsecond, time.Second, time.Hour} {
		lo, hi := bucketBounds(latencyBucket(d))
		if d < lo || (d >= hi && latencyBucket(d) != latencyBuckets-1) {
			t.Errorf("%v lands in bucket %d = [%v, %v)", d, latencyBucket(d), lo, hi)
		}
	}
}

func TestOutlierConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*OutlierConfig)
	}{
		{"statsHalfLife", func(c *OutlierConfig) { c.StatsHalfLife = 0 }},
		{"dropHalfLife", func(c *OutlierConfig) { c.DropHalfLife = -time.Second }},
		{"recoverHalfLife", func(c *OutlierConfig) { c.RecoverHalfLife = 0 }},
		{"minRequests", func(c *OutlierConfig) { c.MinRequests = 0.5 }},
		{"minPeers", func(c *OutlierConfig) { c.MinPeers = 2 }},
		{"madFactor", func(c *OutlierConfig) { c.MADFactor = math.NaN() }},
		{"minErrorRateExcess", func(c *OutlierConfig) { c.MinErrorRateExcess = 0 }},
		{"minLatencyRatio", func(c *OutlierConfig) { c.MinLatencyRatio = 1 }},
		{"minTTFTRatio", func(c *OutlierConfig) { c.MinTTFTRatio = 1 }},
		{"minFactor", func(c *OutlierConfig) { c.MinFactor = 0 }},
		{"quantum", func(c *OutlierConfig) { c.Quantum = 0.6 }},
		{"publishInterval", func(c *OutlierConfig) { c.PublishInterval = -time.Second }},
	} {
		c := DefaultOutlierConfig()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Validate() = %v, want an error naming %s", err, tc.field)
		}
		if _, err := NewOutliers(c, guardtest.NewClock()); err == nil {
			t.Errorf("NewOutliers accepted a config with a bad %s", tc.field)
		}
	}
	if err := DefaultOutlierConfig().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
	if _, err := NewOutliers(DefaultOutlierConfig(), nil); err == nil {
		t.Error("NewOutliers accepted a nil clock")
	}
}

// With traffic following the factors (as the picker does), a penalized engine gets too
// few requests to be judged on MinRequests. It must stay penalized while it is still slow,
// not bounce back up between verdicts, and still recover once it heals.
func TestPenalizedEngineStaysDownWhileSlowAndRecoversWhenHealed(t *testing.T) {
	o, clk := newTestOutliers(t)
	r := rand.New(rand.NewPCG(7, 7))
	fleet := healthyFleet(3)
	fleet[0].ttft *= 10
	factor := func(p *Penalties, name string) float64 { return p.Factor(name) }
	var maxAfterFloor float64
	floorAt := -1
	for s := 0; s < 90; s++ {
		p := o.Penalties()
		var sum float64
		for _, e := range fleet {
			sum += factor(p, e.name)
		}
		for range 50 {
			clk.Advance(20 * time.Millisecond)
			for _, e := range fleet {
				// 3 requests per tick over the fleet, split by the published factors.
				if r.Float64() < 3*factor(p, e.name)/sum/float64(len(fleet)) {
					o.Observe(e.outcome(r))
				}
			}
		}
		p = o.Evaluate()
		f := p.Factor(fleet[0].name)
		if floorAt < 0 && f <= 0.1 {
			floorAt = s
		}
		if floorAt >= 0 {
			maxAfterFloor = max(maxAfterFloor, f)
		}
	}
	if floorAt < 0 || floorAt > 15 {
		t.Fatalf("the 10x slower engine reached the floor at second %d, want within 15 s", floorAt)
	}
	if maxAfterFloor > 0.2 {
		t.Fatalf("while still slow the engine's factor climbed back to %.2f after reaching the floor", maxAfterFloor)
	}
	fleet[0].ttft /= 10
	recovered := -1
	for s := 0; s < 120 && recovered < 0; s++ {
		p := o.Penalties()
		var sum float64
		for _, e := range fleet {
			sum += factor(p, e.name)
		}
		for range 50 {
			clk.Advance(20 * time.Millisecond)
			for _, e := range fleet {
				if r.Float64() < 3*factor(p, e.name)/sum/float64(len(fleet)) {
					o.Observe(e.outcome(r))
				}
			}
		}
		if o.Evaluate().Factor(fleet[0].name) >= 0.9 {
			recovered = s
		}
	}
	if recovered < 0 {
		t.Fatal("the healed engine did not recover within 120 s")
	}
	t.Logf("floor at %d s, max factor while slow %.2f, recovered %d s after healing", floorAt, maxAfterFloor, recovered)
}

// evaluations feeds two trackers the same outcomes (a failing engine among healthy ones,
// 50 outcomes per engine per second, not following the factors) and evaluates both every
// 250 ms, as the sidecar does, for the given seconds. each sees the evaluation number and
// both snapshots.
func evaluations(t *testing.T, limited, unlimited OutlierConfig, seconds int, each func(n int, l, u *Penalties)) {
	t.Helper()
	clk := guardtest.NewClock()
	lo, err := NewOutliers(limited, clk)
	if err != nil {
		t.Fatal(err)
	}
	uo, err := NewOutliers(unlimited, clk)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 9))
	fleet := healthyFleet(5)
	for n := range seconds * 4 {
		switch n {
		case 20 * 4: // from 20 s on, engine 0 fails half its requests
			fleet[0].errRate = 0.5
		case 35 * 4: // healed after 15 s
			fleet[0].errRate = healthyFleet(1)[0].errRate
		}
		for range 10 {
			clk.Advance(25 * time.Millisecond)
			for _, e := range fleet {
				for range 5 {
					o := e.outcome(r)
					lo.Observe(o)
					uo.Observe(o)
				}
			}
		}
		each(n, lo.Evaluate(), uo.Evaluate())
	}
}

// A falling or recovering factor moves a quantum at almost every evaluation; each move
// would rebuild the sidecar's routing tables (tens of milliseconds of CPU each). Published
// factors change at most once per PublishInterval, the first change after a quiet interval
// at once, and every change is published at the factors' current values.
func TestPublishedFactorsChangeAtMostOncePerInterval(t *testing.T) {
	limited := DefaultOutlierConfig()
	unlimited := limited
	unlimited.PublishInterval = 0
	every := limited.PublishInterval
	var lv, uv uint64
	lastBump, firstL, firstU := -1, -1, -1
	bumpsL, bumpsU := 0, 0
	evaluations(t, limited, unlimited, 120, func(n int, l, u *Penalties) {
		if u.Version != uv {
			uv = u.Version
			bumpsU++
			if firstU < 0 {
				firstU = n
			}
		}
		if l.Version == lv {
			return
		}
		lv = l.Version
		bumpsL++
		if firstL < 0 {
			firstL = n
		}
		if lastBump >= 0 && time.Duration(n-lastBump)*250*time.Millisecond < every {
			t.Fatalf("evaluation %d: factors changed %v after the previous change, want at least %v apart",
				n, time.Duration(n-lastBump)*250*time.Millisecond, every)
		}
		lastBump = n
		for _, e := range u.Engines() {
			if l.Factor(e.Engine) != e.Factor {
				t.Fatalf("evaluation %d: %s published at %v, want its current factor %v", n, e.Engine, l.Factor(e.Engine), e.Factor)
			}
		}
	})
	if firstU < 0 || firstL != firstU {
		t.Fatalf("first change published at evaluation %d, want %d (the evaluation that made it)", firstL, firstU)
	}
	if bumpsL >= bumpsU {
		t.Fatalf("%d published changes with the interval, %d without: the interval saved nothing", bumpsL, bumpsU)
	}
	t.Logf("published changes over a failure and recovery: %d with a %v interval, %d without", bumpsL, every, bumpsU)
}

// Factors move a little at every evaluation while an engine falls or recovers: only a
// move to another multiple of Quantum is a change (a new version, a table rebuild), so
// evaluating more often does not change more often.
func TestSmallMovesDoNotChangeTheVersion(t *testing.T) {
	cfg := DefaultOutlierConfig()
	cfg.PublishInterval = 0
	changes, evals := 0, 0
	var prev *Penalties
	evaluations(t, cfg, cfg, 120, func(n int, p, _ *Penalties) {
		evals++
		if prev != nil && p.Version != prev.Version {
			changes++
			moved := 0.0
			for _, e := range p.Engines() {
				moved = max(moved, math.Abs(e.Factor-prev.Factor(e.Engine)))
			}
			if moved < cfg.Quantum-1e-9 {
				t.Fatalf("evaluation %d: version changed with factors moving %v, less than the quantum %v", n, moved, cfg.Quantum)
			}
		}
		prev = p
	})
	// Down from 1 to MinFactor and back is 2 × 19 steps of 0.05.
	if changes == 0 || changes > 2*int(math.Round((1-cfg.MinFactor)/cfg.Quantum))+2 {
		t.Fatalf("%d version changes in %d evaluations over one failure and recovery, want 1..%d",
			changes, evals, 2*int(math.Round((1-cfg.MinFactor)/cfg.Quantum))+2)
	}
}

// A penalized engine that goes quiet is forgotten once it has recovered, and never before
// its recovery is published: a factor never changes without a new Version, or the
// sidecar's tables would keep the old one.
func TestFactorsNeverChangeWithoutANewVersion(t *testing.T) {
	o, clk := newTestOutliers(t)
	r := rand.New(rand.NewPCG(11, 11))
	fleet := healthyFleet(4)
	fleet[0].errRate = 0.6
	prev := o.Penalties()
	forgotten, lowest := false, 1.0
	for n := range 240 * 4 {
		if n == 30*4 {
			fleet = fleet[1:] // the failing engine gets no more traffic
		}
		for range 10 {
			clk.Advance(25 * time.Millisecond)
			for _, e := range fleet {
				o.Observe(e.outcome(r))
			}
		}
		p := o.Evaluate()
		for _, name := range []string{"engine-0", "engine-1"} {
			if p.Factor(name) != prev.Factor(name) && p.Version == prev.Version {
				t.Fatalf("evaluation %d: %s's factor went from %v to %v at the same version %d",
					n, name, prev.Factor(name), p.Factor(name), p.Version)
			}
		}
		lowest = min(lowest, p.Factor("engine-0"))
		if status(p, "engine-0").Engine == "" {
			forgotten = true
		}
		prev = p
	}
	if lowest > 0.5 || !forgotten {
		t.Fatalf("the failing engine's factor fell to %v and it was forgotten: %v; want <= 0.5, then forgotten", lowest, forgotten)
	}
}
