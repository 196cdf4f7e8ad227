package guard

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Outcome is what the sidecar learned about one finished request.
type Outcome struct {
	// Engine names the engine that served the request.
	Engine string
	// OK is false for 5xx answers, resets and timeouts.
	OK bool
	// TTFT is the time to first token (first response byte); 0 when unknown, for
	// example when the request failed before any byte.
	TTFT time.Duration
	// ITL is the request's mean inter-token latency; 0 when unknown.
	ITL time.Duration
}

// Reason says which signals made an engine an outlier.
type Reason uint8

// The signals an engine is compared on.
const (
	ReasonErrors Reason = 1 << iota // error rate
	ReasonTTFT                      // median time to first token
	ReasonITL                       // mean inter-token latency
)

func (r Reason) String() string {
	if r == 0 {
		return "none"
	}
	var parts []string
	for _, p := range []struct {
		bit  Reason
		name string
	}{{ReasonErrors, "errors"}, {ReasonTTFT, "ttft"}, {ReasonITL, "itl"}} {
		if r&p.bit != 0 {
			parts = append(parts, p.name)
		}
	}
	return strings.Join(parts, "|")
}

// OutlierConfig tunes outlier detection and penalties. Start from
// DefaultOutlierConfig.
type OutlierConfig struct {
	// StatsHalfLife is how fast old outcomes fade from an engine's statistics.
	StatsHalfLife time.Duration
	// MinRequests is the decayed request count an engine needs before it is judged
	// (and counted as a peer). For latency signals the same count of latency samples
	// is needed.
	MinRequests float64
	// MinPeers is how many judged engines a comparison needs, itself included.
	MinPeers int
	// MADFactor is k in the fence median + k × 1.4826 × MAD.
	MADFactor float64
	// MinErrorRateExcess is the least an error rate must exceed the peers' median by.
	MinErrorRateExcess float64
	// MinLatencyRatio is the least multiple of the peers' median inter-token latency an
	// engine's must reach.
	MinLatencyRatio float64
	// MinTTFTRatio is the same for the median time to first token. It is larger: TTFT
	// includes queueing, and under bursty arrivals one engine's queue runs ahead of its
	// peers' for seconds at a time; a penalty for that would move traffic back and forth
	// (in the simulator, on the Azure conversation trace, 1.5 made the weights churn
	// 1.1 shares a minute where 3 leaves 0.2). A broken engine (several times slower) is
	// still caught.
	MinTTFTRatio float64
	// MinLatencyExcess is the least a latency must exceed the peers' median by: with
	// identical engines the spread is near zero and the ratio alone would let one stalled
	// stream on a busy host flag a healthy engine whose latencies are milliseconds.
	MinLatencyExcess time.Duration
	// DropHalfLife: while an engine is an outlier its factor halves this often.
	DropHalfLife time.Duration
	// RecoverHalfLife: once it is not, the factor's distance from 1 halves this often.
	RecoverHalfLife time.Duration
	// MinFactor is the lowest factor, in (0, 1]: the engine keeps a trickle of
	// traffic, so its recovery can be observed.
	MinFactor float64
	// Quantum rounds published factors to multiples of it (0 publishes them exactly),
	// so the picker's table is rebuilt only when a factor moves by a step.
	Quantum float64
	// PublishInterval is the least time between two changes of the published factors
	// (0 publishes every change at the evaluation that makes it). Each change costs the
	// sidecar a rebuild of its routing tables, tens of milliseconds of CPU at the
	// default size, and while a factor falls or climbs back its rounded value moves at
	// almost every evaluation. A change that comes after a quiet interval is published
	// at once, so a newly failing engine is cut at the next evaluation; later changes
	// wait out the interval and are then published together, at their current values.
	PublishInterval time.Duration
}

// DefaultOutlierConfig returns the sidecar's defaults.
func DefaultOutlierConfig() OutlierConfig {
	return OutlierConfig{
		StatsHalfLife:      5 * time.Second,
		MinRequests:        20,
		MinPeers:           3,
		MADFactor:          3,
		MinErrorRateExcess: 0.05,
		MinLatencyRatio:    1.5,
		MinTTFTRatio:       3,
		MinLatencyExcess:   20 * time.Millisecond,
		DropHalfLife:       time.Second,
		RecoverHalfLife:    20 * time.Second,
		MinFactor:          0.05,
		Quantum:            0.05,
		PublishInterval:    time.Second,
	}
}

// Validate reports every field that is out of range, naming it.
func (c OutlierConfig) Validate() error {
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, fmt.Errorf("guard: outlier.%s is %v: want %s", field, v, want))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"statsHalfLife", c.StatsHalfLife}, {"dropHalfLife", c.DropHalfLife}, {"recoverHalfLife", c.RecoverHalfLife}} {
		if d.v <= 0 {
			bad(d.name, d.v, "> 0")
		}
	}
	if c.PublishInterval < 0 {
		bad("publishInterval", c.PublishInterval, ">= 0 (0 publishes every change at once)")
	}
	if !(c.MinRequests >= 1) || math.IsInf(c.MinRequests, 0) {
		bad("minRequests", c.MinRequests, "a finite value >= 1")
	}
	if c.MinPeers < 3 {
		bad("minPeers", c.MinPeers, ">= 3 (a median of two cannot single one out)")
	}
	if !(c.MADFactor > 0) || math.IsInf(c.MADFactor, 0) {
		bad("madFactor", c.MADFactor, "a finite value > 0")
	}
	if !(c.MinErrorRateExcess > 0 && c.MinErrorRateExcess < 1) {
		bad("minErrorRateExcess", c.MinErrorRateExcess, "in (0, 1)")
	}
	if c.MinLatencyExcess < 0 {
		bad("minLatencyExcess", c.MinLatencyExcess, ">= 0")
	}
	if !(c.MinLatencyRatio > 1) || math.IsInf(c.MinLatencyRatio, 0) {
		bad("minLatencyRatio", c.MinLatencyRatio, "a finite value > 1")
	}
	if !(c.MinTTFTRatio > 1) || math.IsInf(c.MinTTFTRatio, 0) {
		bad("minTTFTRatio", c.MinTTFTRatio, "a finite value > 1")
	}
	if !(c.MinFactor > 0 && c.MinFactor <= 1) {
		bad("minFactor", c.MinFactor, "in (0, 1]")
	}
	if !(c.Quantum >= 0 && c.Quantum <= 0.5) {
		bad("quantum", c.Quantum, "in [0, 0.5]")
	}
	return errors.Join(errs...)
}

// EngineStatus is one engine's state in a Penalties snapshot. Counts are decayed with
// StatsHalfLife (a steady rate λ settles at λ × StatsHalfLife / ln 2).
type EngineStatus struct {
	Engine           string
	Requests, Errors float64
	TTFTP50, TTFTP90 time.Duration
	ITLMean          time.Duration
	// Factor is the published weight multiplier in [MinFactor, 1].
	Factor float64
	// Reason is why the engine is an outlier now; 0 when it is not.
	Reason Reason
}

// Penalties is an immutable snapshot of every tracked engine's factor.
type Penalties struct {
	// Version increases whenever any published factor changes, at most once per
	// OutlierConfig.PublishInterval: rebuild the picker's table when it does.
	Version uint64
	// At is when the snapshot was taken.
	At      time.Time
	factors map[string]float64 // engines with factor < 1
	engines []EngineStatus
}

// Factor returns the engine's weight multiplier: 1 for engines that are not penalized
// or not known. A nil *Penalties penalizes nobody.
func (p *Penalties) Factor(engine string) float64 {
	if p == nil {
		return 1
	}
	if f, ok := p.factors[engine]; ok {
		return f
	}
	return 1
}

// Engines lists every tracked engine, sorted by name. The slice is shared: do not
// modify it.
func (p *Penalties) Engines() []EngineStatus {
	if p == nil {
		return nil
	}
	return p.engines
}

type engineState struct {
	stats     engineStats
	decayedAt time.Time
	factor    float64 // continuous
	published float64 // quantized as of the last publication, what snapshots show
	reason    Reason
}

// Outliers learns per-engine outcomes and keeps penalty factors. Observe may be called
// from any goroutine; Evaluate is called periodically (every second or so) by one
// owner and publishes a snapshot that Penalties returns without locking.
type Outliers struct {
	cfg   OutlierConfig
	clock Clock

	mu          sync.Mutex
	engines     map[string]*engineState
	last        time.Time
	version     uint64
	publishedAt time.Time // when the factors last changed; zero before the first change

	snap atomic.Pointer[Penalties]
}

// NewOutliers returns a tracker with no engines and an empty snapshot.
func NewOutliers(cfg OutlierConfig, clock Clock) (*Outliers, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		return nil, errors.New("guard: NewOutliers needs a Clock (SystemClock in production)")
	}
	o := &Outliers{cfg: cfg, clock: clock, engines: make(map[string]*engineState), last: clock.Now()}
	o.snap.Store(&Penalties{At: o.last})
	return o, nil
}

// Observe records one outcome. Outcomes without an engine name are ignored.
func (o *Outliers) Observe(out Outcome) {
	if out.Engine == "" {
		return
	}
	now := o.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.engines[out.Engine]
	if e == nil {
		e = &engineState{decayedAt: now, factor: 1, published: 1}
		o.engines[out.Engine] = e
	}
	o.decayTo(e, now)
	e.stats.add(out)
}

// decayTo ages an engine's statistics. Steps shorter than 1/64 of the half-life are
// skipped (outcomes inside one count at full weight), which keeps the histogram
// decay off most observations.
func (o *Outliers) decayTo(e *engineState, now time.Time) {
	if dt := now.Sub(e.decayedAt); dt >= o.cfg.StatsHalfLife/64 {
		e.stats.decay(halfLifeDecay(dt, o.cfg.StatsHalfLife))
		e.decayedAt = now
	}
}

// Penalties returns the latest published snapshot. It never blocks.
func (o *Outliers) Penalties() *Penalties { return o.snap.Load() }

// Evaluate judges every engine against its peers, moves the factors for the time
// elapsed since the previous call, and publishes and returns a new snapshot. The
// snapshot's statistics are always current; its factors change (and its Version with
// them) only when a rounded factor moved and PublishInterval has passed since the last
// change.
func (o *Outliers) Evaluate() *Penalties {
	now := o.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	dt := now.Sub(o.last)
	o.last = now
	for _, e := range o.engines {
		o.decayTo(e, now)
	}
	o.judge()
	moved := false
	for name, e := range o.engines {
		o.step(e, dt)
		if e.reason == 0 && e.factor == 1 && e.published == 1 && e.stats.requests < 0.01 {
			delete(o.engines, name) // gone quiet and healthy, and published so: forget it
			continue
		}
		moved = moved || o.quantize(e.factor) != e.published
	}
	if since := now.Sub(o.publishedAt); moved && (since >= o.cfg.PublishInterval || since < 0) {
		for _, e := range o.engines {
			e.published = o.quantize(e.factor)
		}
		o.version++
		o.publishedAt = now
	}
	p := o.snapshot(now)
	o.snap.Store(p)
	return p
}

// step moves one engine's factor over dt.
func (o *Outliers) step(e *engineState, dt time.Duration) {
	if e.reason != 0 {
		e.factor = max(o.cfg.MinFactor, e.factor*halfLifeDecay(dt, o.cfg.DropHalfLife))
		return
	}
	e.factor = 1 - (1-e.factor)*halfLifeDecay(dt, o.cfg.RecoverHalfLife)
	if o.quantize(e.factor) == 1 {
		e.factor = 1 // recovered: stop creeping towards 1 forever
	}
}

func (o *Outliers) quantize(f float64) float64 {
	if o.cfg.Quantum > 0 {
		f = math.Round(f/o.cfg.Quantum) * o.cfg.Quantum
	}
	return min(1, max(o.cfg.MinFactor, f))
}

// signal is one way of comparing engines. An engine is an outlier on it when its
// value exceeds the peers' median by more than max(k × MAD-based σ, floor): the floor
// keeps a tight, healthy fleet (MAD near 0) from flagging differences nobody would
// notice, or that sampling noise alone explains.
type signal struct {
	reason  Reason
	samples func(*engineStats) float64
	value   func(*engineStats) float64
	floor   func(med float64, s *engineStats) float64
}

func (o *Outliers) signals() []signal {
	// An error rate is a binomial proportion: with n samples around the median rate
	// it wanders by sqrt(p(1-p)/n), so demand three of those as well.
	errFloor := func(med float64, s *engineStats) float64 {
		return max(o.cfg.MinErrorRateExcess, 3*math.Sqrt(med*(1-med)/s.requests))
	}
	ratio := func(r float64) func(med float64, _ *engineStats) float64 {
		return func(med float64, _ *engineStats) float64 {
			return max((r-1)*med, o.cfg.MinLatencyExcess.Seconds())
		}
	}
	return []signal{
		{ReasonErrors, func(s *engineStats) float64 { return s.requests }, (*engineStats).errorRate, errFloor},
		{ReasonTTFT, func(s *engineStats) float64 { return s.ttftN },
			func(s *engineStats) float64 { return s.ttftQuantile(0.5).Seconds() }, ratio(o.cfg.MinTTFTRatio)},
		{ReasonITL, func(s *engineStats) float64 { return s.itlN },
			func(s *engineStats) float64 { return s.itlMean().Seconds() }, ratio(o.cfg.MinLatencyRatio)},
	}
}

// Samples a penalized engine needs to be judged, and below which it keeps its verdict.
// A penalized engine gets little traffic, so it never reaches MinRequests again: without
// these it would drop out of the comparison, lose its reason, recover while still bad and
// be cut again, over and over. Below minHeldSamples it has had no traffic at all for a
// while, and its verdict lapses so that recovery probes it.
const (
	minPenalizedSamples = 3
	minHeldSamples      = 0.5
)

// judge sets every engine's reason: the signals on which it is above its peers. Engines
// with enough samples for a signal take part in that signal's comparison; a penalized
// engine takes part on fewer, and keeps its previous verdict while it has too few.
func (o *Outliers) judge() {
	prev := make(map[*engineState]Reason, len(o.engines))
	for _, e := range o.engines {
		prev[e] = e.reason
		e.reason = 0
	}
	var judged []*engineState
	var vals []float64
	for _, sig := range o.signals() {
		judged, vals = judged[:0], vals[:0]
		for _, e := range o.engines {
			n := min(e.stats.requests, sig.samples(&e.stats))
			penalized := e.factor < 1
			switch {
			case n >= o.cfg.MinRequests || penalized && n >= minPenalizedSamples:
				judged = append(judged, e)
				vals = append(vals, sig.value(&e.stats))
			case penalized && n >= minHeldSamples:
				e.reason |= prev[e] & sig.reason
			}
		}
		if len(judged) < o.cfg.MinPeers {
			continue
		}
		med, sd := medianMAD(vals)
		for i, e := range judged {
			if vals[i]-med > max(o.cfg.MADFactor*sd, sig.floor(med, &e.stats)) {
				e.reason |= sig.reason
			}
		}
	}
}

func (o *Outliers) snapshot(now time.Time) *Penalties {
	p := &Penalties{Version: o.version, At: now, factors: make(map[string]float64)}
	for name, e := range o.engines {
		if e.published < 1 {
			p.factors[name] = e.published
		}
		s := &e.stats
		p.engines = append(p.engines, EngineStatus{
			Engine: name, Requests: s.requests, Errors: s.errors,
			TTFTP50: s.ttftQuantile(0.5), TTFTP90: s.ttftQuantile(0.9), ITLMean: s.itlMean(),
			Factor: e.published, Reason: e.reason,
		})
	}
	slices.SortFunc(p.engines, func(a, b EngineStatus) int { return strings.Compare(a.Engine, b.Engine) })
	return p
}
