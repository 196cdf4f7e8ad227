package signals

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// Config controls smoothing, staleness and curve fitting.
type Config struct {
	// HalfLife is the EWMA half-life of every smoothed signal.
	HalfLife time.Duration `json:"half_life"`
	// DemandEvidence is how many requests a (node, model) demand estimate rests on at
	// least: where the node's demand is low, its half-life grows from HalfLife to
	// DemandEvidence / demand (up to MaxDemandHalfLife), so that Poisson noise in a few
	// requests per second does not move the plan. 0 keeps HalfLife at every rate.
	DemandEvidence float64 `json:"demand_evidence"`
	// MaxDemandHalfLife caps the half-life DemandEvidence may give a demand estimate.
	MaxDemandHalfLife time.Duration `json:"max_demand_half_life"`
	// StaleAfter is how long an engine may go without a successful scrape
	// (and without a sidecar seeing it answer) before it is Suspect. It is
	// also the grace a newly listed engine gets before its first scrape.
	StaleAfter time.Duration `json:"stale_after"`
	// ForgetAfter is how long a silent sidecar's demand keeps counting. Until
	// then its last demand holds: a node that stops reporting is not idle.
	ForgetAfter time.Duration `json:"forget_after"`
	// FailingErrorRate is the smoothed share of requests failing, as
	// sidecars see them, at which an engine is Failing.
	FailingErrorRate float64 `json:"failing_error_rate"`
	// CacheHalfLife is the half-life of the prompt tokens each engine is asked for and
	// finds in its prefix cache (vLLM's prefix_cache_queries and _hits), whose ratio over
	// an engine class is EngineState.ClassHitRate: long, because the plan's capacity
	// credit follows it, and a credit that moved with every burst would move the plan.
	CacheHalfLife time.Duration `json:"cache_half_life"`
	Fit           FitConfig     `json:"fit"`
}

// DefaultConfig is what meridian-control ships with: a 1 s control period and scrapes every
// few seconds. Demand reacts within seconds (a 3 s half-life), and the simulator runs the
// same value, so what is measured is what ships.
func DefaultConfig() Config {
	return Config{
		HalfLife:          3 * time.Second,
		DemandEvidence:    DefaultDemandEvidence,
		MaxDemandHalfLife: time.Minute,
		StaleAfter:        15 * time.Second,
		ForgetAfter:       5 * time.Minute,
		FailingErrorRate:  0.5,
		CacheHalfLife:     time.Minute,
		Fit:               FitConfig{HalfLife: 10 * time.Minute, MinWeight: 20, MinSpread: 0.05, Window: 512},
	}
}

// Validate reports the first unusable field, naming it.
func (c Config) Validate() error {
	switch {
	case c.HalfLife <= 0:
		return fmt.Errorf("signals.half_life %v must be > 0", c.HalfLife)
	case !(c.DemandEvidence >= 0) || math.IsInf(c.DemandEvidence, 1):
		return fmt.Errorf("signals.demand_evidence %v must be a finite value >= 0 (0: the half-life alone)", c.DemandEvidence)
	case c.DemandEvidence > 0 && c.MaxDemandHalfLife < c.HalfLife:
		return fmt.Errorf("signals.max_demand_half_life %v must be >= half_life %v", c.MaxDemandHalfLife, c.HalfLife)
	case c.StaleAfter <= 0:
		return fmt.Errorf("signals.stale_after %v must be > 0", c.StaleAfter)
	case c.ForgetAfter < c.StaleAfter:
		return fmt.Errorf("signals.forget_after %v must be ≥ stale_after %v", c.ForgetAfter, c.StaleAfter)
	case !(c.FailingErrorRate > 0 && c.FailingErrorRate <= 1):
		return fmt.Errorf("signals.failing_error_rate %v must be in (0, 1]", c.FailingErrorRate)
	case c.CacheHalfLife <= 0:
		return fmt.Errorf("signals.cache_half_life %v must be > 0", c.CacheHalfLife)
	case c.Fit.HalfLife <= 0:
		return fmt.Errorf("signals.fit.half_life %v must be > 0", c.Fit.HalfLife)
	case !(c.Fit.MinWeight > 0):
		return fmt.Errorf("signals.fit.min_weight %v must be > 0", c.Fit.MinWeight)
	case !(c.Fit.MinSpread >= 0):
		return fmt.Errorf("signals.fit.min_spread %v must be ≥ 0", c.Fit.MinSpread)
	case c.Fit.Window < 2:
		return fmt.Errorf("signals.fit.window %d must be ≥ 2", c.Fit.Window)
	}
	return nil
}

// Aggregator turns scrapes and sidecar load reports into smoothed solver
// inputs. All methods are safe for concurrent use; the clock is injected so
// tests and the simulator can run it on virtual time.
type Aggregator struct {
	cfg Config
	now func() time.Time

	mu       sync.Mutex
	engines  map[string]*engineState
	sidecars map[sidecarKey]*sidecarState
	// demand is each node's demand per model at the last Snapshot, for the half-life of
	// the next reports' demand (Config.DemandEvidence).
	demand map[string]map[string]float64
	// following[node][model] is until when the node's demand follows its fast estimate,
	// after a shift (demandEstimate).
	following map[string]map[string]time.Time
	// leaving[node][model] is since when the node's fast demand has been out of its slow
	// demand's noise, while that is not yet a shift (shiftConfirm).
	leaving map[string]map[string]time.Time
}

// DefaultDemandEvidence is the shipped Config.DemandEvidence.
const DefaultDemandEvidence = 50

// demandEstimate is one sidecar's demand for one model, smoothed twice: fast with
// HalfLife, slow with the half-life DemandEvidence gives. The node's demand is the slow
// sum, until the fast sum stays out of it by more than shiftSigmas standard deviations of
// the fast one's noise for shiftConfirm half-lives: then the demand has moved (a step, not
// noise), and for shiftFollow half-lives the node's demand is the fast sum, every slow
// estimate kept at its fast one.
type demandEstimate struct{ fast, slow ewma }

// shiftFollow is how many HalfLife spans the demand follows the fast estimate after a
// shift: three take the fast estimate 7/8 of the way to a step.
const shiftFollow = 3

// shiftSigmas is how far, in standard deviations of Poisson noise, a node's fast demand
// must leave its slow demand to count as a shift: at 2.5, noise passes for one about
// once per 80 independent looks, and a doubling of 2 req/s shows after about 4 s (when the
// 3 s estimate has moved 1.2 req/s, 2.5 of its 0.48 standard deviations).
const shiftSigmas = 2.5

// shiftConfirm is how many HalfLife spans the fast demand must stay out of the slow one's
// noise before that counts as a shift: a third, one control period at the shipped 1 s
// period and 3 s half-life, so two snapshots in a row. At a few requests per second a
// burst lifted the fast estimate past shiftSigmas about once a minute per node, for one
// snapshot, and each time the plan spilled for shiftFollow half-lives and came back: most
// of the plan's churn at such rates (docs/results/README.md). A step stays out.
const shiftConfirm = 1.0 / 3

// demandHalfLife is the half-life of node's demand for model: HalfLife, lengthened where
// the node's last demand is too low for DemandEvidence requests per half-life. a.mu is
// held.
func (a *Aggregator) demandHalfLife(node, model string) time.Duration {
	hl := a.cfg.HalfLife
	if a.cfg.DemandEvidence <= 0 {
		return hl
	}
	rate := a.demand[node][model]
	if rate <= 0 {
		return hl // no estimate yet: the first reports set it
	}
	want := time.Duration(a.cfg.DemandEvidence / rate * float64(time.Second))
	return min(max(hl, want), a.cfg.MaxDemandHalfLife)
}

type sidecarKey struct{ node, sidecar string }

type sidecarState struct {
	last   time.Time
	demand map[string]*demandEstimate // by model, req/s
	// engines is what this sidecar said of each engine. It is kept per reporter, not
	// folded into the engine's state, so that it leaves with the reporter: a forged or
	// stale view of an engine ends with the stream that sent it (ForgetSidecar), and
	// fades while its reporter is silent (see reporterView.penaltyAt).
	engines map[string]*reporterView
}

// reporterView is one sidecar's view of one engine.
type reporterView struct {
	errRate, penalty ewma
	reqRate          ewma      // requests/s the sidecar sent it: weighs its error rate
	errAt            time.Time // when errRate last had requests to learn from
	at               time.Time // the last report that mentioned the engine
}

type engineState struct {
	listed             time.Time             // first seen in a Snapshot or an observation
	prev               *enginemetrics.Sample // last scrape, for rates
	prevAt, lastScrape time.Time
	lastServed         time.Time // a sidecar saw it answer
	lastError          string
	missing            []string
	running, waiting   ewma
	kvCache, prefixHit ewma
	// cacheQueried and cacheHit are prompt tokens/s asked of and found in the prefix
	// cache, smoothed over Config.CacheHalfLife.
	cacheQueried, cacheHit ewma
	arrival                ewma
	ttft, itl, e2e         ewma
	sidecarTTFT            ewma
	fit                    fitter
	everScraped, served    bool
}

// NewAggregator returns an Aggregator; now is its clock (time.Now in
// production).
func NewAggregator(cfg Config, now func() time.Time) (*Aggregator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		return nil, errors.New("signals: NewAggregator needs a clock")
	}
	return &Aggregator{cfg: cfg, now: now, engines: map[string]*engineState{}, sidecars: map[sidecarKey]*sidecarState{}}, nil
}

func (a *Aggregator) engine(name string, now time.Time) *engineState {
	st := a.engines[name]
	if st == nil {
		st = &engineState{listed: now}
		a.engines[name] = st
	}
	return st
}

// ObserveScrape ingests one successful scrape of engine, taken now.
// Counters and histograms become rates against the previous scrape; a
// counter that went backwards (a restart) only resets the baseline.
func (a *Aggregator) ObserveScrape(engine string, s enginemetrics.Sample) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	st := a.engine(engine, now)
	span := a.cfg.HalfLife // the first scrape sets the averages outright
	if st.prev != nil {
		span = now.Sub(st.prevAt)
		if span > 0 {
			st.ingestRates(s, *st.prev, span, now, a.cfg)
		}
	}
	st.running.add(s.Running, span, a.cfg.HalfLife)
	st.waiting.add(s.Waiting, span, a.cfg.HalfLife)
	if !slices.Contains(s.Missing, "vllm:kv_cache_usage_perc") {
		st.kvCache.add(s.KVCacheUsage, span, a.cfg.HalfLife)
	}
	st.prev, st.prevAt, st.lastScrape = &s, now, now
	st.everScraped, st.lastError, st.missing = true, "", s.Missing
}

// ingestRates turns the change since prev into arrival rate, latencies,
// prefix-cache hit rate and a (load, TTFT) point for the curve fit.
func (st *engineState) ingestRates(s, prev enginemetrics.Sample, span time.Duration, now time.Time, cfg Config) {
	hl := cfg.HalfLife
	if d, ok := s.TTFT.Sub(prev.TTFT); ok {
		rate := d.Count / span.Seconds()
		st.arrival.add(rate, span, hl)
		if d.Count > 0 {
			st.ttft.add(d.Mean(), span, hl)
			st.fit.add(point{load: rate, ttft: d.Mean(), at: now}, cfg.Fit.Window)
		}
	}
	if d, ok := s.ITL.Sub(prev.ITL); ok && d.Count > 0 {
		st.itl.add(d.Mean(), span, hl)
	}
	if d, ok := s.E2E.Sub(prev.E2E); ok && d.Count > 0 {
		st.e2e.add(d.Mean(), span, hl)
	}
	dq, dh := s.PrefixQueries-prev.PrefixQueries, s.PrefixHits-prev.PrefixHits
	if dq > 0 && dh >= 0 && dh <= dq {
		st.prefixHit.add(dh/dq, span, hl)
	}
	if dq >= 0 && dh >= 0 && dh <= dq {
		st.cacheQueried.add(dq/span.Seconds(), span, cfg.CacheHalfLife)
		st.cacheHit.add(dh/span.Seconds(), span, cfg.CacheHalfLife)
	}
}

// ObserveScrapeError records a failed scrape. The engine's signals are not
// touched: if failures last StaleAfter, the engine turns Suspect.
func (a *Aggregator) ObserveScrapeError(engine string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.engine(engine, a.now()).lastError = err.Error()
}

// ErrBadReport wraps every reason ObserveReport rejects a report for.
var ErrBadReport = errors.New("bad load report")

// ObserveReport ingests one sidecar's load report: its demand per model and
// what it saw of each engine (errors, penalty, TTFT).
func (a *Aggregator) ObserveReport(r *meridianv1.LoadReport) error {
	if err := checkReport(r); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	span := time.Duration(r.GetWindowSeconds() * float64(time.Second))
	hl := a.cfg.HalfLife
	key := sidecarKey{r.GetNodeId(), r.GetSidecarId()}
	sc := a.sidecars[key]
	if sc == nil {
		sc = &sidecarState{demand: map[string]*demandEstimate{}, engines: map[string]*reporterView{}}
		a.sidecars[key] = sc
	}
	sc.last = now
	for _, d := range r.GetDemand() {
		e := sc.demand[d.GetModel()]
		if e == nil {
			e = &demandEstimate{}
			sc.demand[d.GetModel()] = e
		}
		e.fast.add(d.GetRequestsPerSecond(), span, hl)
		e.slow.add(d.GetRequestsPerSecond(), span, a.demandHalfLife(key.node, d.GetModel()))
	}
	for _, o := range r.GetEngines() {
		st := a.engine(o.GetEngine(), now)
		rv := sc.engines[o.GetEngine()]
		if rv == nil {
			rv = &reporterView{}
			sc.engines[o.GetEngine()] = rv
		}
		rv.at = now
		n := o.GetRequests()
		rv.reqRate.add(float64(n)/span.Seconds(), span, hl)
		if n > 0 {
			rv.errRate.add(float64(o.GetErrors())/float64(n), span, hl)
			rv.errAt = now
			if o.GetErrors() < n {
				st.lastServed, st.served = now, true
			}
			if t := o.GetTtftP50Seconds(); t > 0 {
				st.sidecarTTFT.add(t, span, hl)
			}
		}
		if p := o.GetPenalty(); p > 0 && p <= 1 {
			rv.penalty.add(p, span, hl)
		}
	}
	return nil
}

// penaltyAt is the reporter's penalty, fading back to 1 with the time since it last
// reported the engine (one half-life halves the distance to 1).
func (rv *reporterView) penaltyAt(now time.Time, halfLife time.Duration) float64 {
	p := math.Min(1, rv.penalty.value(1))
	return 1 - (1-p)*math.Exp2(-now.Sub(rv.at).Seconds()/halfLife.Seconds())
}

// errorRateAt is the reporter's smoothed error rate, fading with the time since it last
// sent the engine requests. A Failing engine gets no traffic, so without the fade it would
// never be heard from again and stay Failing after it recovered; with it, it is tried
// again after a few half-lives and either serves or fails again.
func (rv *reporterView) errorRateAt(now time.Time, halfLife time.Duration) float64 {
	r := rv.errRate.value(0)
	if rv.errAt.IsZero() || r == 0 {
		return r
	}
	return r * math.Exp2(-now.Sub(rv.errAt).Seconds()/halfLife.Seconds())
}

func checkReport(r *meridianv1.LoadReport) error {
	switch {
	case r.GetNodeId() == "":
		return fmt.Errorf("%w: node_id is empty", ErrBadReport)
	case !(r.GetWindowSeconds() > 0) || math.IsInf(r.GetWindowSeconds(), 0):
		return fmt.Errorf("%w: node %q: window_seconds %v must be > 0", ErrBadReport, r.GetNodeId(), r.GetWindowSeconds())
	}
	for i, d := range r.GetDemand() {
		if v := d.GetRequestsPerSecond(); !(v >= 0) || math.IsInf(v, 0) || d.GetModel() == "" {
			return fmt.Errorf("%w: node %q: demand[%d] (model %q) requests_per_second %v must be finite, ≥ 0 and name a model",
				ErrBadReport, r.GetNodeId(), i, d.GetModel(), v)
		}
	}
	for i, o := range r.GetEngines() {
		if o.GetEngine() == "" || o.GetErrors() > o.GetRequests() {
			return fmt.Errorf("%w: node %q: engines[%d] must name an engine and have errors (%d) ≤ requests (%d)",
				ErrBadReport, r.GetNodeId(), i, o.GetErrors(), o.GetRequests())
		}
	}
	return nil
}

// Target is an engine's metrics endpoint.
type Target struct {
	Engine string
	URL    string
}

// ScrapeAll scrapes every target, at most parallel at a time, and records
// each result. It returns when all are done or ctx ends; a scrape still
// running when ctx ends fails and is recorded as such. It returns the failed
// scrapes' errors by engine (nil when all succeeded), for the caller to log.
func (a *Aggregator) ScrapeAll(ctx context.Context, sc *enginemetrics.Scraper, targets []Target, parallel int) map[string]error {
	sem := make(chan struct{}, max(1, parallel))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed map[string]error
	for _, t := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s, err := sc.Scrape(ctx, t.URL)
			if err != nil {
				a.ObserveScrapeError(t.Engine, err)
				mu.Lock()
				if failed == nil {
					failed = map[string]error{}
				}
				failed[t.Engine] = err
				mu.Unlock()
				return
			}
			a.ObserveScrape(t.Engine, s)
		}()
	}
	wg.Wait()
	return failed
}

// ForgetSidecar drops a sidecar's demand and everything it said of engines (errors,
// penalties) at once. Call it when the sidecar's report stream ends: a sidecar that
// restarts reports under a new id, and holding the old one's demand for ForgetAfter would
// count the node's demand twice; and nothing a disconnected reporter said may keep
// steering the fleet.
func (a *Aggregator) ForgetSidecar(node, sidecar string) {
	a.mu.Lock()
	delete(a.sidecars, sidecarKey{node, sidecar})
	a.mu.Unlock()
}
