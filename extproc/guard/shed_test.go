package guard

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/extproc/guard/guardtest"
)

func newTestShedder(t *testing.T) (*Shedder, *guardtest.Clock) {
	t.Helper()
	clk := guardtest.NewClock()
	s, err := NewShedder(DefaultShedConfig(), clk)
	if err != nil {
		t.Fatal(err)
	}
	return s, clk
}

// mix is the arrival share of priority classes 0..3 (0 the least important).
var mix = []float64{0.4, 0.3, 0.2, 0.1}

func drawClass(r *rand.Rand) int {
	u, cum := r.Float64(), 0.0
	for c, m := range mix {
		cum += m
		if u < cum {
			return c
		}
	}
	return len(mix) - 1
}

// expectedShed is the per-class shed fraction that sheds f of all arrivals, lowest
// classes first and nothing more than needed.
func expectedShed(f float64) []float64 {
	out := make([]float64, len(mix))
	left := f
	for c, m := range mix {
		out[c] = min(1, left/m)
		left = max(0, left-m)
	}
	return out
}

func TestShedsLowestPriorityFirst(t *testing.T) {
	for _, f := range []float64{0.05, 0.3, 0.5, 0.75, 0.95, 1} {
		t.Run(fmt.Sprint(f), func(t *testing.T) {
			s, clk := newTestShedder(t)
			if err := s.SetFractions(map[string]float64{"m": f}); err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(11, 12))
			arrived, shed := make([]float64, len(mix)), make([]float64, len(mix))
			const warmup, n = 5000, 60000 // 1000 req/s: 5 s to learn the mix, then 60 s
			for i := range warmup + n {
				clk.Advance(time.Millisecond)
				c := drawClass(r)
				d := s.Decide("m", c, false, true, 0)
				if i < warmup {
					continue
				}
				arrived[c]++
				if d.Shed() {
					shed[c]++
					if d.Reason != ShedQuota || d.RetryAfter != DefaultShedConfig().RetryAfter {
						t.Fatalf("decision %+v, want ShedQuota with Retry-After", d)
					}
				}
			}
			total := 0.0
			want := expectedShed(f)
			for c := range mix {
				total += shed[c]
				got := shed[c] / arrived[c]
				if math.Abs(got-want[c]) > 0.03 {
					t.Errorf("class %d: shed %.3f of its requests, want %.3f", c, got, want[c])
				}
			}
			if got := total / n; math.Abs(got-f) > 0.01 {
				t.Errorf("shed %.4f of all requests, want %.4f ± 0.01", got, f)
			}
		})
	}
}

func TestShedNothingUnlessAsked(t *testing.T) {
	s, clk := newTestShedder(t)
	if err := s.SetFractions(map[string]float64{"other-model": 0.5}); err != nil {
		t.Fatal(err)
	}
	for i := range 5000 {
		clk.Advance(time.Millisecond)
		if d := s.Decide("m", i%4, false, i%2 == 0, 0); d.Shed() || d.Held {
			t.Fatalf("request %d shed (%v) or held (%v) with no fraction for its model", i, d.Reason, d.Held)
		}
	}
	// Every candidate at its local limit: shed even the most important request.
	if d := s.Decide("m", 3, true, true, 0); d.Reason != ShedLimit || d.RetryAfter != time.Second {
		t.Fatalf("at limit: %+v, want ShedLimit with Retry-After 1s", d)
	}
	// Setting the fractions again replaces them: "other-model" goes back to 0.
	if err := s.SetFractions(nil); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		clk.Advance(time.Millisecond)
		if s.Decide("other-model", 0, false, true, 0).Shed() {
			t.Fatal("model dropped from the policy is still shed")
		}
	}
}

// A request whose engine is not queued is admitted whatever the fraction; the fraction
// falls on the queued ones, and every request counts in the demand.
func TestShedOnlyQueued(t *testing.T) {
	s, clk := newTestShedder(t)
	if err := s.SetFractions(map[string]float64{"m": 0.25}); err != nil {
		t.Fatal(err)
	}
	queuedShed, queued := 0, 0
	for i := range 30000 { // 30 s: six of the rates' half-lives
		clk.Advance(time.Millisecond)
		q := i%2 == 0
		d := s.Decide("m", 0, false, q, 0)
		switch {
		case !q && (d.Shed() || !d.Held):
			t.Fatalf("request %d: shed %v (%v), held %v; want admitted and held, its engine not queued", i, d.Shed(), d.Reason, d.Held)
		case q && d.Held:
			t.Fatalf("request %d held though its engine is queued", i)
		case q:
			queued++
			if d.Shed() {
				queuedShed++
			}
		}
	}
	if got := float64(queuedShed) / float64(queued); math.Abs(got-0.25) > 0.01 {
		t.Errorf("shed %.4f of the queued requests, want 0.25 ± 0.01", got)
	}
	if d := s.Demand(); len(d) != 1 || math.Abs(d[0].RequestsPerSecond-1000) > 50 {
		t.Errorf("demand %+v, want model m at 1000 req/s (every arrival counts)", d)
	}
	// The fraction set now leaves 750 req/s admitted. Once arrivals fall to 100 req/s the
	// quota weighs nothing: a request on an engine with room is no longer held.
	if err := s.SetFractions(map[string]float64{"m": 0.25}); err != nil {
		t.Fatal(err)
	}
	for i := range 3000 { // 30 s at 100 req/s
		clk.Advance(10 * time.Millisecond)
		if d := s.Decide("m", 0, false, false, 0); i >= 1000 && d.Held {
			t.Fatalf("request %d held at 100 req/s, below the 750 req/s the fraction leaves admitted", i)
		}
	}
}

func TestShedDemandRates(t *testing.T) {
	s, clk := newTestShedder(t)
	_ = s.SetFractions(map[string]float64{"m": 0.25})
	r := rand.New(rand.NewPCG(1, 1))
	for range 30 * 200 { // 200 req/s for 30 s (six half-lives)
		clk.Advance(5 * time.Millisecond)
		s.Decide("m", drawClass(r), false, true, 0)
	}
	d := s.Demand()
	if len(d) != 1 || d[0].Model != "m" {
		t.Fatalf("Demand() = %+v, want one entry for m", d)
	}
	if math.Abs(d[0].RequestsPerSecond/200-1) > 0.05 || math.Abs(d[0].ShedPerSecond/50-1) > 0.05 {
		t.Fatalf("Demand() = %+v, want about 200 req/s and 50 shed/s", d[0])
	}
}

func TestShedModelsAreBounded(t *testing.T) {
	cfg := DefaultShedConfig()
	cfg.MaxModels = 3
	s, err := NewShedder(cfg, guardtest.NewClock())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		s.Decide(fmt.Sprintf("junk-%d", i), 0, false, true, 0)
	}
	d := s.Demand()
	if len(d) != 4 || d[0].Model != OtherModels { // 3 named + the shared entry
		t.Fatalf("Demand() has %d models (%+v), want 3 named and %s", len(d), d, OtherModels)
	}
}

// Concurrent callers must not race (run with -race) and every arrival is counted.
func TestShedConcurrent(t *testing.T) {
	s, clk := newTestShedder(t)
	_ = s.SetFractions(map[string]float64{"a": 0.5, "b": 0.1})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				clk.Advance(time.Microsecond)
				s.Decide([]string{"a", "b"}[(g+i)%2], i%4, false, true, 0)
				if i%500 == 0 {
					_ = s.SetFractions(map[string]float64{"a": 0.5, "b": 0.1})
					s.Demand()
				}
			}
		})
	}
	wg.Wait()
	total := 0.0
	for _, d := range s.Demand() {
		total += d.RequestsPerSecond
	}
	if total <= 0 {
		t.Fatal("no arrivals counted")
	}
}

func TestShedValidate(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*ShedConfig)
	}{
		{"priorities", func(c *ShedConfig) { c.Priorities = 0 }},
		{"priorities", func(c *ShedConfig) { c.Priorities = 65 }},
		{"rateHalfLife", func(c *ShedConfig) { c.RateHalfLife = 0 }},
		{"maxModels", func(c *ShedConfig) { c.MaxModels = 0 }},
		{"retryAfter", func(c *ShedConfig) { c.RetryAfter = 1500 * time.Millisecond }},
	} {
		c := DefaultShedConfig()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Validate() = %v, want an error naming %s", err, tc.field)
		}
	}
	s, _ := newTestShedder(t)
	for _, bad := range []float64{-0.1, 1.1, math.NaN()} {
		if err := s.SetFractions(map[string]float64{"m": bad}); err == nil {
			t.Errorf("SetFractions accepted %v", bad)
		}
	}
}

// The control server smooths demand, so its fraction outlives an overload by seconds. The
// shedder turns the fraction into the rate it leaves admitted and stops shedding once
// recent arrivals fall below that rate; it never sheds more than asked.
func TestShedLiftsWhenArrivalsFall(t *testing.T) {
	s, clk := newTestShedder(t)
	run := func(rate float64, d time.Duration) (shedFrac float64) {
		gap := time.Duration(float64(time.Second) / rate)
		n, shed := 0, 0
		for elapsed := time.Duration(0); elapsed < d; elapsed += gap {
			clk.Advance(gap)
			n++
			if s.Decide("m", n%4, false, true, 0).Shed() {
				shed++
			}
		}
		return float64(shed) / float64(n)
	}
	run(100, 10*time.Second) // learn the rate
	if err := s.SetFractions(map[string]float64{"m": 0.4}); err != nil {
		t.Fatal(err)
	}
	if got := run(100, 5*time.Second); math.Abs(got-0.4) > 0.02 {
		t.Fatalf("steady overload: shed %.3f, want the asked 0.4", got)
	}
	if got := run(200, 3*time.Second); got > 0.4+1e-9 {
		t.Fatalf("arrivals doubled: shed %.3f, more than the asked 0.4", got)
	}
	run(100, 5*time.Second)
	if err := s.SetFractions(map[string]float64{"m": 0.4}); err != nil { // 60 req/s admitted
		t.Fatal(err)
	}
	// The overload ends (40 req/s) and the fraction is not updated: after the recent rate
	// has fallen (a few recentHalfLife), nothing is shed.
	first := run(40, 2*time.Second)
	if after := run(40, 3*time.Second); after != 0 {
		t.Fatalf("arrivals at 40 req/s under the 60 admitted: still shed %.3f after 2 s", after)
	}
	t.Logf("shed %.3f in the first 2 s after the overload ended", first)
}

// TestShedsAShareOfTheWork: with ShedConfig.ByWork (the default) the fraction is a share of
// the work, taken from requests in proportion to their work, so fewer requests are shed for
// the same relief; without it, a share of the requests whatever their size.
func TestShedsAShareOfTheWork(t *testing.T) {
	const f, small, large = 0.1, 1000.0, 20000.0 // a tenth of the requests are large
	for _, byWork := range []bool{true, false} {
		t.Run(fmt.Sprint("by_work=", byWork), func(t *testing.T) {
			cfg := DefaultShedConfig()
			cfg.ByWork = byWork
			clk := guardtest.NewClock()
			s, err := NewShedder(cfg, clk)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SetFractions(map[string]float64{"m": f}); err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(5, 6))
			var n, nShed, work, workShed [2]float64 // [0] small, [1] large
			const warmup, total = 5000, 60000
			for i := range warmup + total {
				clk.Advance(time.Millisecond)
				k, w := 0, small
				if r.Float64() < 0.1 {
					k, w = 1, large
				}
				d := s.Decide("m", 0, false, true, w)
				if i < warmup {
					continue
				}
				n[k]++
				work[k] += w
				if d.Shed() {
					nShed[k]++
					workShed[k] += w
				}
			}
			shareOfWork := (workShed[0] + workShed[1]) / (work[0] + work[1])
			shareOfRequests := (nShed[0] + nShed[1]) / (n[0] + n[1])
			rateSmall, rateLarge := nShed[0]/n[0], nShed[1]/n[1]
			t.Logf("shed %.4f of the work, %.4f of the requests; %.4f of the small ones, %.4f of the large", shareOfWork, shareOfRequests, rateSmall, rateLarge)
			if byWork {
				// Each request is picked with f × work × E[work] / E[work²]: 0.0071 of the
				// small ones and 0.1418 of the large, 0.0206 of all requests.
				if math.Abs(shareOfWork-f) > 0.01 {
					t.Errorf("shed %.4f of the work, want %.2f ± 0.01", shareOfWork, f)
				}
				if shareOfRequests > 0.3*f {
					t.Errorf("shed %.4f of the requests, want under %.3f: the work's share should take the large ones", shareOfRequests, 0.3*f)
				}
				if ratio := rateLarge / rateSmall; ratio < 15 || ratio > 25 {
					t.Errorf("a large request was shed %.1f times as often as a small one, want about 20 (their work's ratio)", ratio)
				}
				return
			}
			if math.Abs(shareOfRequests-f) > 0.01 || math.Abs(rateLarge-rateSmall) > 0.02 {
				t.Errorf("shed %.4f of the requests (small %.4f, large %.4f), want %.2f of each", shareOfRequests, rateSmall, rateLarge, f)
			}
		})
	}
}
