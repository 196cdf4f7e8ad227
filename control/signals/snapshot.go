package signals

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/meridian-router/meridian/control/solver"
)

// State is what the signals say about an engine.
type State int

const (
	// Unknown: listed less than StaleAfter ago and no scrape tried yet. It is
	// trusted with its configured curve until the grace ends or a scrape fails.
	Unknown State = iota
	// OK: scraped within StaleAfter.
	OK
	// Degraded: its metrics are stale, but sidecars saw it answer within
	// StaleAfter, so it serves and only its metrics endpoint is down.
	Degraded
	// Suspect: no scrape and no answer seen for StaleAfter. It gets no
	// traffic: an engine whose signals stopped must not look idle.
	Suspect
	// Failing: sidecars see at least FailingErrorRate of its requests fail.
	Failing
)

var stateNames = [...]string{"unknown", "ok", "degraded", "suspect", "failing"}

func (s State) String() string {
	if s < 0 || int(s) >= len(stateNames) {
		return fmt.Sprintf("state(%d)", int(s))
	}
	return stateNames[s]
}

// MarshalText makes State readable in the introspection JSON.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// EngineSpec is what the fleet file says about an engine.
type EngineSpec struct {
	Name   string
	Models []string
	// Capacity is the configured saturation rate (req/s).
	Capacity float64
	// Curve is the default latency curve, used until one is fitted.
	Curve solver.Curve
}

// EngineState is the aggregated view of one engine. Smoothed values are 0
// until the first observation of their kind.
type EngineState struct {
	State State `json:"state"`
	// Suspect is true for Suspect and Failing engines: plan no traffic.
	Suspect bool `json:"suspect"`
	// Penalty is the smoothed local penalty sidecars apply, in (0, 1]; 1
	// without reports. Plan with Capacity × Penalty.
	Penalty float64 `json:"penalty"`
	// Curve is the latency curve the optimizer plans with: the one fitted to the
	// points of every engine of the same class (same models, capacity and default
	// curve), or the spec's default when Fitted is false; FitWeight is the
	// recency-weighted number of points behind it. Engines of a class are the same
	// hardware serving the same models: fitting them apart would model one of them as
	// fast from a few lucky points, the plan would pile traffic on it, and it would
	// then look slow (the feedback loop that makes weights oscillate). An engine that
	// really is slower is caught by the sidecars' outlier penalties, which scale its
	// planned capacity (Penalty).
	Curve     solver.Curve `json:"curve"`
	Fitted    bool         `json:"fitted"`
	FitWeight float64      `json:"fit_weight"`
	// OwnCurve is the curve fitted to this engine's points alone (for introspection).
	OwnCurve  solver.Curve `json:"own_curve"`
	OwnFitted bool         `json:"own_fitted"`

	// ClassHitRate is the share of the prompt tokens sent to the engines of this one's
	// class (see Curve) that their prefix caches served, over Config.CacheHalfLife; 0
	// until they were asked for any. It is the class's, not the engine's, for the reason
	// the curve is: a plan that credited one engine for the hits its own traffic brought
	// would send it more, and chase its own tail.
	ClassHitRate float64 `json:"class_prefix_hit_rate"`

	ArrivalRate   float64 `json:"arrival_rps"`
	Running       float64 `json:"running"`
	Waiting       float64 `json:"waiting"`
	KVCacheUsage  float64 `json:"kv_cache_usage"`
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	TTFT          float64 `json:"ttft_seconds"`
	ITL           float64 `json:"itl_seconds"`
	E2E           float64 `json:"e2e_seconds"`
	// SidecarTTFT is the smoothed median TTFT sidecars report, RTT included.
	SidecarTTFT float64 `json:"sidecar_ttft_seconds"`
	ErrorRate   float64 `json:"error_rate"`

	LastScrape time.Time `json:"last_scrape,omitzero"`
	LastServed time.Time `json:"last_served,omitzero"`
	LastError  string    `json:"last_error,omitempty"`
	// Missing lists vLLM signals the engine's /metrics lacks.
	Missing []string `json:"missing,omitempty"`
	// LastWaiting is Waiting as the last successful scrape read it, unsmoothed: a queue
	// that builds shows here one scrape later, not a half-life later.
	LastWaiting float64 `json:"last_waiting"`
}

// Snapshot is the aggregated inputs at one instant. It is a copy: the
// caller owns it.
type Snapshot struct {
	At time.Time `json:"at"`
	// Demand[node][model] is the smoothed offered load in req/s, summed
	// over the node's sidecars.
	Demand map[string]map[string]float64 `json:"demand_rps"`
	// StaleNodes lists nodes none of whose sidecars reported within
	// StaleAfter; their demand holds its last value until ForgetAfter.
	StaleNodes []string `json:"stale_nodes,omitempty"`
	// Engines has one entry per spec passed to Snapshot.
	Engines map[string]EngineState `json:"engines"`
}

// Snapshot aggregates the current state for the given engines. Listing an
// engine starts its grace period if nothing was heard from it yet.
func (a *Aggregator) Snapshot(specs []EngineSpec) Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	snap := Snapshot{At: now, Demand: map[string]map[string]float64{}, Engines: make(map[string]EngineState, len(specs))}
	a.sumDemand(now, &snap)
	a.demand = make(map[string]map[string]float64, len(snap.Demand)) // a copy: callers own snap
	for node, m := range snap.Demand {
		a.demand[node] = maps.Clone(m)
	}
	views := a.reporterViews(now)
	listed := make(map[string]bool, len(specs))
	byClass := map[string][]int{}
	states := make([]*engineState, len(specs))
	for i, spec := range specs {
		listed[spec.Name] = true
		states[i] = a.engine(spec.Name, now)
		snap.Engines[spec.Name] = a.engineState(states[i], spec, views[spec.Name], now)
		k := classKey(spec)
		byClass[k] = append(byClass[k], i)
	}
	for _, members := range byClass {
		// Fit the class, then again without the members its fit shows to be much slower,
		// so one bad host neither hides in nor skews its class's curve.
		fit := func(skip map[int]bool) (solver.Curve, float64, bool) {
			n := 0
			for _, i := range members {
				if !skip[i] {
					n += len(states[i].fit.pts)
				}
			}
			pooled := &fitter{pts: make([]point, 0, n)}
			for _, i := range members {
				if !skip[i] {
					pooled.pts = append(pooled.pts, states[i].fit.pts...)
				}
			}
			first := specs[members[0]]
			return pooled.fit(first.Capacity, now, a.cfg.Fit, first.Curve)
		}
		// A member is apart when its own fit is much slower than the median member's.
		var own []float64
		for _, i := range members {
			if es := snap.Engines[specs[i].Name]; es.OwnFitted {
				own = append(own, es.OwnCurve.Latency(specs[i].Capacity/2, specs[i].Capacity))
			}
		}
		apartOnes := map[int]bool{}
		if len(own) >= 2 {
			slices.Sort(own)
			med := own[len(own)/2]
			if len(own)%2 == 0 {
				med = (own[len(own)/2-1] + own[len(own)/2]) / 2
			}
			for _, i := range members {
				es := snap.Engines[specs[i].Name]
				if es.OwnFitted && es.OwnCurve.Latency(specs[i].Capacity/2, specs[i].Capacity) > apartRatio*med {
					apartOnes[i] = true
				}
			}
		}
		curve, weight, fitted := fit(apartOnes)
		var queried, hit float64
		for _, i := range members {
			queried += states[i].cacheQueried.value(0)
			hit += states[i].cacheHit.value(0)
		}
		for _, i := range members {
			es := snap.Engines[specs[i].Name]
			es.Curve, es.FitWeight, es.Fitted = curve, weight, fitted
			if queried > 0 {
				es.ClassHitRate = hit / queried
			}
			if apartOnes[i] {
				es.Curve = es.OwnCurve
			}
			snap.Engines[specs[i].Name] = es
		}
	}
	// Engines no longer listed are forgotten: state is bounded by the fleet file.
	for name := range a.engines {
		if !listed[name] {
			delete(a.engines, name)
		}
	}
	return snap
}

// apartRatio is how much slower than its class's median member, at half load, an engine's
// own fit must say it is before the plan models it apart: well past the noise a class's members show
// when a burst queues on one of them, so only an engine that really is slower (a bad
// host, a throttled GPU) loses its class's curve.
const apartRatio = 2

// classKey groups engines that share a latency curve: same models, capacity and default
// curve.
func classKey(spec EngineSpec) string {
	models := slices.Clone(spec.Models)
	slices.Sort(models)
	return fmt.Sprintf("%v|%g|%g|%g", models, spec.Capacity, spec.Curve.Base, spec.Curve.Queue)
}

// engineViews is what the live reporters say of one engine, combined.
type engineViews struct {
	penaltySum float64 // sum of the reporters' (fading) penalties
	reporters  int
	errWeighed float64 // Σ error rate × request rate
	reqRate    float64 // Σ request rate
	anyErr     float64 // the largest error rate, for when no reporter sent requests lately
}

// penalty is the reporters' mean penalty, 1 with none.
func (v engineViews) penalty() float64 {
	if v.reporters == 0 {
		return 1
	}
	return v.penaltySum / float64(v.reporters)
}

// errorRate is the reporters' error rate weighted by the requests each sent.
func (v engineViews) errorRate() float64 {
	if v.reqRate > 0 {
		return v.errWeighed / v.reqRate
	}
	return v.anyErr
}

// reporterViews combines every live reporter's view of each engine; a.mu is held.
func (a *Aggregator) reporterViews(now time.Time) map[string]engineViews {
	out := map[string]engineViews{}
	for _, key := range a.sidecarOrder() {
		for name, rv := range a.sidecars[key].engines {
			v := out[name]
			v.reporters++
			v.penaltySum += rv.penaltyAt(now, a.cfg.HalfLife)
			r := rv.errorRateAt(now, a.cfg.HalfLife)
			q := rv.reqRate.value(0)
			v.errWeighed += r * q
			v.reqRate += q
			v.anyErr = math.Max(v.anyErr, r)
			out[name] = v
		}
	}
	return out
}

// sidecarOrder is every sidecar's key, sorted: sums over sidecars run in this order, so
// that a snapshot (and the plan solved from it) is the same bit for bit on every run, not
// rounded differently with Go's map order. a.mu is held.
func (a *Aggregator) sidecarOrder() []sidecarKey {
	keys := make([]sidecarKey, 0, len(a.sidecars))
	for k := range a.sidecars {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y sidecarKey) int {
		return cmp.Or(strings.Compare(x.node, y.node), strings.Compare(x.sidecar, y.sidecar))
	})
	return keys
}

// follow makes node's demand for model follow its fast estimate until until. a.mu is held.
func (a *Aggregator) follow(node, model string, until time.Time) {
	if a.following == nil {
		a.following = map[string]map[string]time.Time{}
	}
	if a.following[node] == nil {
		a.following[node] = map[string]time.Time{}
	}
	a.following[node][model] = until
}

// leave returns since when node's fast demand for model has been out of its slow
// demand's noise, now if it just left. a.mu is held.
func (a *Aggregator) leave(node, model string, now time.Time) time.Time {
	if a.leaving == nil {
		a.leaving = map[string]map[string]time.Time{}
	}
	if a.leaving[node] == nil {
		a.leaving[node] = map[string]time.Time{}
	}
	since, ok := a.leaving[node][model]
	if !ok {
		since = now
		a.leaving[node][model] = now
	}
	return since
}

func (a *Aggregator) sumDemand(now time.Time, snap *Snapshot) {
	type sums struct {
		fast, slow float64
		parts      []*demandEstimate
	}
	byNode := map[string]map[string]*sums{}
	fresh := map[string]bool{}
	for _, key := range a.sidecarOrder() {
		sc := a.sidecars[key]
		age := now.Sub(sc.last)
		if age > a.cfg.ForgetAfter {
			delete(a.sidecars, key)
			continue
		}
		fresh[key.node] = fresh[key.node] || age <= a.cfg.StaleAfter
		m := byNode[key.node]
		if m == nil {
			m = map[string]*sums{}
			byNode[key.node] = m
		}
		for model, e := range sc.demand {
			t := m[model]
			if t == nil {
				t = &sums{}
				m[model] = t
			}
			t.fast += e.fast.value(0)
			t.slow += e.slow.value(0)
			t.parts = append(t.parts, e)
		}
	}
	// One report per HalfLife-long window moves the fast estimate by a; on Poisson
	// arrivals at rate r its variance is a/(2-a)·r (for 1 s windows).
	a1 := 1 - math.Exp2(-1/a.cfg.HalfLife.Seconds())
	for node, models := range byNode {
		out := map[string]float64{}
		for model, t := range models {
			d := t.slow
			if dev := math.Abs(t.fast - t.slow); dev > 0 && dev > shiftSigmas*math.Sqrt(a1/(2-a1)*math.Max(t.slow, 1e-9)) {
				if since := a.leave(node, model, now); now.Sub(since) >= time.Duration(shiftConfirm*float64(a.cfg.HalfLife)) {
					a.follow(node, model, now.Add(shiftFollow*a.cfg.HalfLife))
				}
			} else {
				delete(a.leaving[node], model)
			}
			if until, ok := a.following[node][model]; ok {
				if now.Before(until) {
					for _, e := range t.parts {
						e.slow = e.fast
					}
					d = t.fast
				} else {
					delete(a.following[node], model)
				}
			}
			out[model] = d
		}
		snap.Demand[node] = out
	}
	for node := range a.following { // nodes whose sidecars are all gone
		if _, ok := byNode[node]; !ok {
			delete(a.following, node)
		}
	}
	for node := range a.leaving {
		if _, ok := byNode[node]; !ok {
			delete(a.leaving, node)
		}
	}
	for node, ok := range fresh {
		if !ok {
			snap.StaleNodes = append(snap.StaleNodes, node)
		}
	}
	slices.Sort(snap.StaleNodes)
}

func (a *Aggregator) engineState(st *engineState, spec EngineSpec, views engineViews, now time.Time) EngineState {
	fresh := func(t time.Time) bool { return !t.IsZero() && now.Sub(t) <= a.cfg.StaleAfter }
	es := EngineState{
		Penalty:       views.penalty(),
		ArrivalRate:   st.arrival.value(0),
		Running:       st.running.value(0),
		Waiting:       st.waiting.value(0),
		KVCacheUsage:  st.kvCache.value(0),
		PrefixHitRate: st.prefixHit.value(0),
		TTFT:          st.ttft.value(0),
		ITL:           st.itl.value(0),
		E2E:           st.e2e.value(0),
		SidecarTTFT:   st.sidecarTTFT.value(0),
		ErrorRate:     views.errorRate(),
		LastScrape:    st.lastScrape,
		LastServed:    st.lastServed,
		LastError:     st.lastError,
		Missing:       slices.Clone(st.missing),
	}
	if st.prev != nil {
		es.LastWaiting = st.prev.Waiting
	}
	switch {
	case es.ErrorRate >= a.cfg.FailingErrorRate:
		es.State = Failing
	case fresh(st.lastScrape):
		es.State = OK
	case fresh(st.lastServed):
		es.State = Degraded
	case !st.everScraped && !st.served && st.lastError == "" && now.Sub(st.listed) <= a.cfg.StaleAfter:
		// Trusted on its configured curve until its first scrape; an engine whose first
		// scrape failed (not running at start) is not trusted for the grace period.
		es.State = Unknown
	default:
		es.State = Suspect
	}
	es.Suspect = es.State == Suspect || es.State == Failing
	es.OwnCurve, _, es.OwnFitted = st.fit.fit(spec.Capacity, now, a.cfg.Fit, spec.Curve)
	return es
}

// SolverDemand lays Demand out as solver.Problem wants it: [cluster][model]
// in the given orders, 0 where nothing was reported.
func (s Snapshot) SolverDemand(clusters, models []string) [][]float64 {
	out := make([][]float64, len(clusters))
	for c, node := range clusters {
		out[c] = make([]float64, len(models))
		for m, model := range models {
			out[c][m] = s.Demand[node][model]
		}
	}
	return out
}

// SolverEngines lays the specs out as solver engines: model names become
// indices into models (names not there are dropped), capacity is scaled by
// the penalty, suspect engines are unhealthy, and the curve is the fitted
// one when there is one. Engines missing from the snapshot keep their spec.
func (s Snapshot) SolverEngines(specs []EngineSpec, models []string) []solver.Engine {
	out := make([]solver.Engine, len(specs))
	for i, spec := range specs {
		e := solver.Engine{Name: spec.Name, Capacity: spec.Capacity, Healthy: true, Curve: spec.Curve}
		for _, name := range spec.Models {
			if m := slices.Index(models, name); m >= 0 {
				e.Models = append(e.Models, m)
			}
		}
		if es, ok := s.Engines[spec.Name]; ok {
			e.Capacity *= es.Penalty
			e.Healthy = !es.Suspect
			e.Curve = es.Curve
		}
		out[i] = e
	}
	return out
}

// UnmarshalText reads what MarshalText writes, so the introspection JSON round-trips.
func (s *State) UnmarshalText(b []byte) error {
	for i, n := range stateNames {
		if n == string(b) {
			*s = State(i)
			return nil
		}
	}
	return fmt.Errorf("unknown engine state %q", b)
}
