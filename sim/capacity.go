package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// CapacityConfig is a capacity search: for each policy and deployment, the highest offered
// request rate at which at least Target of the requests meet Base.SLO.
type CapacityConfig struct {
	// Base is the simulation every run starts from: trace, fleet, engine, scenario, SLO,
	// seed. Its Load, Policies, Deployment, Replicas and StopBelow are set per run.
	Base Config
	// Policies and Deployments are searched in every combination.
	Policies    []string
	Deployments []Deployment
	// Replicas is the router replicas per region pool in DeployRegion (DeployGlobal has 1).
	Replicas int
	// Target is the SLO attainment a rate must reach (0.9).
	Target float64
	// StartLoad is the first rate tried, as a fraction of the fleet's cold capacity.
	StartLoad float64
	// Precision ends a search when the passing and failing rates are within this
	// relative distance (0.03: 3%).
	Precision float64
	// StopBelow ends a run once its attainment is certain to be below it (at most
	// Target). The search only needs Target; a lower value costs time on overloaded runs
	// and buys the attainment curve below the target for the plot.
	StopBelow float64
	// MaxRuns bounds the runs of one search.
	MaxRuns int
	// BelowCapacity, when > 0, ends each search with one more run at this fraction of the
	// capacity found (issue 14: no shedding at or below 0.9x it), reported in
	// Capacity.Below; 0: none.
	BelowCapacity float64
	// Workers is how many runs go at once (runs are independent; one per core).
	Workers int
	// Seeds is how many runs judge each rate: one per seed, from Base.Seed up, whose
	// requests are pooled (the attainment is the share of all of them that met the SLO).
	// A seed redraws which region each conversation enters through and each request's
	// router replica; one seed's attainment near the capacity moves by more than a
	// search step from seed to seed, and pooling several judges the rate, not the draw.
	Seeds int
}

// DefaultCapacityConfig returns a search over base with the parameters.
func DefaultCapacityConfig(base Config) CapacityConfig {
	return CapacityConfig{Base: base, Policies: PolicyNames, Deployments: []Deployment{DeployRegion},
		Replicas: 4, Target: 0.9, StartLoad: 0.5, Precision: 0.03, StopBelow: 0.5, MaxRuns: 12, BelowCapacity: 0.9, Workers: 2,
		Seeds: 1}
}

// Search bounds on the offered load, as a fraction of cold capacity. Below 1/16 a run's
// virtual span (and meridian's solves) grow past what a search can afford, and a router
// that cannot serve 6% of the fleet's cold capacity is broken, not slow.
const (
	minSearchLoad = 1.0 / 16
	maxSearchLoad = 64
)

// maxSeeds bounds CapacityConfig.Seeds: each multiplies a search's runs.
const maxSeeds = 64

// Validate reports every problem with c. It does not modify c.
func (c *CapacityConfig) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("capacity config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if !c.Base.SLO.set() {
		bad("Base.SLO", "is not set; capacity is measured at an SLO")
	}
	if len(c.Policies) == 0 {
		bad("Policies", "is empty")
	}
	for _, p := range c.Policies {
		if !knownPolicy(p) {
			bad("Policies", "%q is not one of %v or %v", p, PolicyNames, ReferenceNames)
		}
	}
	if len(c.Deployments) == 0 {
		bad("Deployments", "is empty")
	}
	for _, d := range c.Deployments {
		if !slices.Contains(Deployments, d) {
			bad("Deployments", "%q is not one of %v", d, Deployments)
		}
	}
	if c.Replicas < 1 {
		bad("Replicas", "is %d, must be at least 1", c.Replicas)
	}
	if !(c.Target > 0 && c.Target <= 1) {
		bad("Target", "is %v, must be in (0, 1]", c.Target)
	}
	if !(c.StartLoad >= minSearchLoad && c.StartLoad <= maxSearchLoad) {
		bad("StartLoad", "is %v, must be in [%v, %v]", c.StartLoad, minSearchLoad, maxSearchLoad)
	}
	if !(c.StopBelow >= 0 && c.StopBelow <= c.Target) {
		bad("StopBelow", "is %v, must be in [0, Target]", c.StopBelow)
	}
	if !(c.Precision > 0 && c.Precision < 1) {
		bad("Precision", "is %v, must be in (0, 1)", c.Precision)
	}
	if !(c.BelowCapacity >= 0 && c.BelowCapacity < 1) {
		bad("BelowCapacity", "is %v, must be in [0, 1) (0: no run below the capacity)", c.BelowCapacity)
	}
	if c.MaxRuns < 2 {
		bad("MaxRuns", "is %d, must be at least 2", c.MaxRuns)
	}
	if c.Workers < 1 {
		bad("Workers", "is %d, must be at least 1", c.Workers)
	}
	if c.Seeds < 1 || c.Seeds > maxSeeds {
		bad("Seeds", "is %d, must be in [1, %d]", c.Seeds, maxSeeds)
	}
	return errors.Join(errs...)
}

// CapacityPoint is one run of a search.
type CapacityPoint struct {
	OfferedRPS    float64 `json:"offered_rps"`
	Load          float64 `json:"load"`
	SLOAttainment float64 `json:"slo_attainment"`
	TTFTP50       float64 `json:"ttft_p50_ms"`
	TTFTP90       float64 `json:"ttft_p90_ms"`
	// ShedRate is the fraction of the run's requests the policy shed.
	ShedRate float64 `json:"shed_rate"`
	// Stopped: the run ended once its attainment was certain to be below the search's
	// StopBelow, so its attainment is an upper bound and its latencies cover what finished
	// by then.
	Stopped bool `json:"stopped,omitempty"`
	Pass    bool `json:"pass"`
}

// Capacity is one policy's capacity at the SLO under one deployment, and what was
// measured at that rate. The JSON names are capacity.json's.
type Capacity struct {
	Policy     string `json:"policy"`
	Deployment string `json:"deployment"`
	Replicas   int    `json:"replicas"`
	// CapacityRPS is the highest offered rate found to meet the target (0 if even the
	// lowest rate tried missed); CapacityLoad is it as a fraction of cold capacity.
	CapacityRPS  float64 `json:"capacity_rps"`
	CapacityLoad float64 `json:"capacity_load"`
	// Bracketed is false when the search hit one of its bounds: no rate up to the top
	// one failed (the capacity is at least CapacityRPS), or even the lowest rate missed
	// (CapacityRPS is 0 and the capacity is below the lowest rate in Points).
	Bracketed       bool    `json:"bracketed"`
	SLOAttainment   float64 `json:"slo_attainment"`
	KVHitRate       float64 `json:"kv_hit_rate"`
	KVHitUpperBound float64 `json:"kv_hit_upper_bound"`
	ShedRate        float64 `json:"shed_rate"`
	WeightChurn     float64 `json:"weight_churn"`
	MaxShareStep    float64 `json:"max_share_step"`
	// SteadyWeightChurn and SteadyMaxShareStep leave out the run's warm-up (Result's).
	SteadyWeightChurn  float64 `json:"steady_weight_churn"`
	SteadyMaxShareStep float64 `json:"steady_max_share_step"`
	TTFTP50            float64 `json:"ttft_p50_ms"`
	TTFTP90            float64 `json:"ttft_p90_ms"`
	ITLP50             float64 `json:"itl_p50_ms"`
	// MissedTTFT and MissedITL count the completed requests that missed the SLO on TTFT
	// and (with TTFT met) on inter-token latency, at the capacity.
	MissedTTFT int `json:"missed_ttft"`
	MissedITL  int `json:"missed_itl"`
	// Points are the runs of the search in rate order.
	Points []CapacityPoint `json:"points"`
	// Below is the run at CapacityConfig.BelowCapacity of the capacity, when there was one.
	Below *BelowCapacity `json:"below_capacity,omitempty"`
}

// BelowCapacity is what a policy did at a fixed fraction of its own capacity.
type BelowCapacity struct {
	Load          float64 `json:"load"`
	OfferedRPS    float64 `json:"offered_rps"`
	SLOAttainment float64 `json:"slo_attainment"`
	Requests      int     `json:"requests"`
	Shed          int     `json:"shed"`
	ShedRate      float64 `json:"shed_rate"`
}

// CapacityProgress reports one finished run of a capacity search.
type CapacityProgress struct {
	Done                     int // runs finished, over all searches
	Policy                   string
	Deployment               Deployment
	Point                    CapacityPoint
	Elapsed, RunWall         time.Duration
	SearchesDone, SearchesOf int
}

// RunCapacity runs every search of c, Workers runs at a time, and returns one Capacity
// per policy and deployment in c's order. progress, when non-nil, is called after each
// run from the goroutine that ran it (calls do not overlap).
func RunCapacity(ctx context.Context, c CapacityConfig, progress func(CapacityProgress)) ([]Capacity, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	type job struct {
		policy string
		dep    Deployment
	}
	var jobs []job
	for _, d := range c.Deployments {
		for _, p := range c.Policies {
			jobs = append(jobs, job{p, d})
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, c.Workers)
	start := time.Now()
	var (
		mu          sync.Mutex
		done, sdone int
		out         = make([]Capacity, len(jobs))
		errs        = make([]error, len(jobs))
		wg          sync.WaitGroup
	)
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &search{c: &c, policy: j.policy, dep: j.dep, sem: sem}
			s.onRun = func(pt CapacityPoint, wall time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				done++
				if progress != nil {
					progress(CapacityProgress{Done: done, Policy: j.policy, Deployment: j.dep, Point: pt,
						Elapsed: time.Since(start), RunWall: wall, SearchesDone: sdone, SearchesOf: len(jobs)})
				}
			}
			out[i], errs[i] = s.run(ctx)
			if errs[i] != nil {
				cancel()
			}
			mu.Lock()
			sdone++
			mu.Unlock()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("capacity of %s (%s): %w", jobs[i].policy, jobs[i].dep, err)
		}
	}
	return out, nil
}

// search is one policy's bounded search under one deployment: double or halve the load
// from StartLoad until a passing and a failing rate bracket the capacity, then narrow the
// bracket (inside) until its ends are within Precision, or MaxRuns runs are spent.
type search struct {
	c      *CapacityConfig
	policy string
	dep    Deployment
	sem    chan struct{}
	onRun  func(CapacityPoint, time.Duration)
}

func (s *search) run(ctx context.Context) (Capacity, error) {
	out := Capacity{Policy: s.policy, Deployment: string(s.dep), Replicas: s.replicas()}
	best, bracketed, err := s.bisect(ctx, &out)
	if err != nil {
		return out, err
	}
	out = s.finish(out, best, bracketed)
	if f := s.c.BelowCapacity; f > 0 && out.CapacityLoad > 0 {
		res, _, err := s.runAt(ctx, f*out.CapacityLoad)
		if err != nil {
			return out, err
		}
		out.Below = &BelowCapacity{Load: f * out.CapacityLoad, OfferedRPS: f * out.CapacityRPS,
			SLOAttainment: res.SLOAttainment, Shed: res.Shed, Requests: res.Requests, ShedRate: res.ShedRate}
	}
	return out, nil
}

// bisect runs the search proper, appending its points to out, and returns the result at
// the highest passing rate (nil if none passed) and whether a passing and a failing rate
// bracket the capacity.
func (s *search) bisect(ctx context.Context, out *Capacity) (*Result, bool, error) {
	lo, hi := 0.0, math.Inf(1)
	var atLo, atHi float64 // their attainments
	hiKnown := false       // hi's run went to the end: atHi is its attainment, not a bound
	var best *Result
	load := s.c.StartLoad
	for range s.c.MaxRuns {
		res, w, err := s.runAt(ctx, load)
		if err != nil {
			return nil, false, err
		}
		pt := s.point(load, w, res)
		out.Points = append(out.Points, pt)
		out.KVHitUpperBound = res.KVHitUpperBound
		if pt.Pass {
			lo, atLo, best = load, pt.SLOAttainment, &res
			out.CapacityRPS, out.CapacityLoad = pt.OfferedRPS, load
		} else {
			hi, atHi, hiKnown = load, pt.SLOAttainment, !pt.Stopped
		}
		switch {
		case lo > 0 && !math.IsInf(hi, 1):
			if hi/lo <= 1+s.c.Precision {
				return best, true, nil
			}
			load = s.inside(lo, hi, atLo, atHi, hiKnown)
		case lo > 0:
			if load*2 > maxSearchLoad {
				return best, false, nil
			}
			load *= 2
		default:
			if load/2 < minSearchLoad {
				return best, true, nil
			}
			load /= 2
		}
	}
	return best, lo > 0 && !math.IsInf(hi, 1), nil
}

// inside is the next load to try between lo, which passed with attainment atLo, and hi,
// which failed with atHi (a bound only, unless hiKnown): where the straight line through
// the two (attainment against log load) crosses the target, since attainment falls
// about linearly near the capacity; kept a Precision step inside either end, so that
// the run closes the bracket or narrows it by that much; the geometric midpoint when
// hi's attainment is not known, or when the ends are within two steps (either outcome of
// the midpoint then closes the bracket).
func (s *search) inside(lo, hi, atLo, atHi float64, hiKnown bool) float64 {
	step := 1 + s.c.Precision
	if !hiKnown || !(atLo > atHi) || hi/lo <= step*step {
		return math.Sqrt(lo * hi)
	}
	f := (atLo - s.c.Target) / (atLo - atHi)
	load := lo * math.Pow(hi/lo, f)
	return min(max(load, lo*step), hi/step)
}

func (s *search) replicas() int {
	if s.dep == DeployGlobal {
		return 1
	}
	return s.c.Replicas
}

// finish fills what was measured at the capacity and sorts the points by rate.
func (s *search) finish(out Capacity, best *Result, bracketed bool) Capacity {
	out.Bracketed = bracketed
	if best != nil {
		out.SLOAttainment, out.KVHitRate, out.ShedRate = best.SLOAttainment, best.KVHitRate, best.ShedRate
		out.WeightChurn, out.MaxShareStep = best.WeightChurn, best.MaxShareStep
		out.SteadyWeightChurn, out.SteadyMaxShareStep = best.SteadyWeightChurn, best.SteadyMaxShareStep
		out.TTFTP50, out.TTFTP90, out.ITLP50 = best.TTFTP50, best.TTFTP90, best.ITLP50
		out.MissedTTFT, out.MissedITL = best.MissedTTFT, best.MissedITL
	}
	slices.SortFunc(out.Points, func(a, b CapacityPoint) int { return cmp.Compare(a.Load, b.Load) })
	return out
}

// runAt simulates the search's policy at one load, once per seed (CapacityConfig.Seeds,
// each run holding a worker slot), and pools the runs (poolResults). The workload returned
// is the first seed's.
func (s *search) runAt(ctx context.Context, load float64) (Result, *Workload, error) {
	n := s.c.Seeds // at least 1: RunCapacity validated it
	res, ws, walls, errs := make([]Result, n), make([]*Workload, n), make([]time.Duration, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], ws[i], walls[i], errs[i] = s.runSeed(ctx, load, s.c.Base.Seed+uint64(i))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Result{}, nil, err
	}
	pooled := poolResults(res)
	if s.onRun != nil {
		s.onRun(s.point(load, ws[0], pooled), slices.Max(walls))
	}
	return pooled, ws[0], nil
}

// runSeed is one run of runAt, under the given seed, holding a worker slot; it returns
// the run's wall time, from when it had the slot.
func (s *search) runSeed(ctx context.Context, load float64, seed uint64) (Result, *Workload, time.Duration, error) {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return Result{}, nil, 0, ctx.Err()
	}
	defer func() { <-s.sem }()
	start := time.Now()
	cfg := s.c.Base
	cfg.Load, cfg.Policies, cfg.Deployment, cfg.Replicas = load, []string{s.policy}, s.dep, s.replicas()
	cfg.StopBelow, cfg.Seed = s.c.StopBelow, seed
	w, err := BuildWorkload(&cfg)
	if err != nil {
		return Result{}, nil, 0, err
	}
	var progress atomic.Int64
	r, err := newRun(&cfg, w, s.policy, &progress)
	if err != nil {
		return Result{}, nil, 0, err
	}
	if err := r.simulate(ctx); err != nil {
		return Result{}, nil, 0, err
	}
	res := r.rec.result(s.policy, &cfg, w)
	res.TTFTs, res.Samples = nil, nil
	return res, w, time.Since(start), nil
}

// poolResults is what a search reads of several runs at one rate, one per seed: their
// requests pooled (counts summed; SLO attainment and shed rate over all of them), the
// largest share step, Stopped when any run stopped (the pooled attainment is then a
// bound too), the scenario's event requests and the home-retention bands pooled the same
// way, and the mean over runs of every other figure (latency percentiles, KV hit rates,
// churn, the event's goodput). One run is returned as it is.
func poolResults(rs []Result) Result {
	if len(rs) == 1 {
		return rs[0]
	}
	out := Result{Policy: rs[0].Policy, Scenario: rs[0].Scenario}
	var met, eventMet float64
	n := float64(len(rs))
	for _, r := range rs {
		out.Requests += r.Requests
		out.Completed += r.Completed
		out.Shed += r.Shed
		for reason, k := range r.ShedReasons {
			if out.ShedReasons == nil {
				out.ShedReasons = map[string]int{}
			}
			out.ShedReasons[reason] += k
		}
		out.Event.Requests += r.Event.Requests
		eventMet += r.Event.SLOAttainment * float64(r.Event.Requests)
		out.Event.SLOGoodputRPS += r.Event.SLOGoodputRPS / n
		out.Failed += r.Failed
		out.MissedTTFT += r.MissedTTFT
		out.MissedITL += r.MissedITL
		out.Retries += r.Retries
		out.TooLarge += r.TooLarge
		out.QueuedOnArrival += r.QueuedOnArrival
		out.QueuedMissed += r.QueuedMissed
		met += r.SLOAttainment * float64(r.Requests)
		out.Stopped = out.Stopped || r.Stopped
		out.MaxShareStep = max(out.MaxShareStep, r.MaxShareStep)
		out.SteadyMaxShareStep = max(out.SteadyMaxShareStep, r.SteadyMaxShareStep)
		out.TTFTP50 += r.TTFTP50 / n
		out.TTFTP90 += r.TTFTP90 / n
		out.TTFTP99 += r.TTFTP99 / n
		out.ITLP50 += r.ITLP50 / n
		out.ITLP99 += r.ITLP99 / n
		out.E2EP99 += r.E2EP99 / n
		out.SLOGoodputRPS += r.SLOGoodputRPS / n
		out.KVHitRate += r.KVHitRate / n
		out.KVHitUpperBound += r.KVHitUpperBound / n
		out.WeightChurn += r.WeightChurn / n
		out.SteadyWeightChurn += r.SteadyWeightChurn / n
	}
	if out.Event.Requests > 0 {
		out.Event.SLOAttainment = eventMet / float64(out.Event.Requests)
	}
	out.HomeRetention = poolRetention(rs)
	if out.Requests > 0 {
		out.SLOAttainment = met / float64(out.Requests)
		out.ShedRate = float64(out.Shed) / float64(out.Requests)
	}
	return out
}

// point summarizes one run.
func (s *search) point(load float64, w *Workload, res Result) CapacityPoint {
	return CapacityPoint{OfferedRPS: load * w.Capacity, Load: load, SLOAttainment: res.SLOAttainment,
		TTFTP50: res.TTFTP50, TTFTP90: res.TTFTP90, ShedRate: res.ShedRate, Stopped: res.Stopped,
		Pass: !res.Stopped && res.SLOAttainment >= s.c.Target}
}
