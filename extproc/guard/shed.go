package guard

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// OtherModels names the shared entry for models beyond ShedConfig.MaxModels.
const OtherModels = "(other)"

// ShedConfig configures a Shedder. Start from DefaultShedConfig.
type ShedConfig struct {
	// Priorities is the number of priority classes, 0..Priorities-1, higher more
	// important; in [1, 64].
	Priorities int
	// RateHalfLife is the memory of the per-class arrival rates that place the cutoff.
	RateHalfLife time.Duration
	// MaxModels bounds the models tracked by name (model names come from request
	// bodies); requests for further models share one entry, OtherModels. Models named
	// by the control server's policy are always tracked.
	MaxModels int
	// RetryAfter is the delay a shed request is told to wait (Retry-After).
	RetryAfter time.Duration
	// ByWork makes the control server's fraction a share of the model's work rather than
	// of its requests: within the cutoff class a request is picked with a chance in
	// proportion to its work (Decide's work), so the fraction's relief is met by fewer,
	// larger requests. A request that states no work weighs 1, as every request does
	// without ByWork.
	ByWork bool
}

// DefaultShedConfig returns the sidecar's defaults.
func DefaultShedConfig() ShedConfig {
	return ShedConfig{Priorities: 4, RateHalfLife: 5 * time.Second, MaxModels: 256, RetryAfter: time.Second, ByWork: true}
}

// Validate reports every field that is out of range, naming it.
func (c ShedConfig) Validate() error {
	var errs []error
	if c.Priorities < 1 || c.Priorities > 64 {
		errs = append(errs, fmt.Errorf("guard: shed.priorities is %d: want 1..64", c.Priorities))
	}
	if c.RateHalfLife <= 0 {
		errs = append(errs, fmt.Errorf("guard: shed.rateHalfLife is %v: want > 0", c.RateHalfLife))
	}
	if c.MaxModels < 1 {
		errs = append(errs, fmt.Errorf("guard: shed.maxModels is %d: want >= 1", c.MaxModels))
	}
	if c.RetryAfter < time.Second || c.RetryAfter%time.Second != 0 {
		errs = append(errs, fmt.Errorf("guard: shed.retryAfter is %v: want whole seconds >= 1s (Retry-After has no fractions)", c.RetryAfter))
	}
	return errors.Join(errs...)
}

// ShedReason says why a request is shed.
type ShedReason uint8

// Why a request is shed, if it is.
const (
	Admit     ShedReason = iota // not shed
	ShedQuota                   // the control server's shed fraction for the model
	ShedLimit                   // every candidate engine is at its local limit
)

func (r ShedReason) String() string {
	switch r {
	case Admit:
		return "admit"
	case ShedQuota:
		return "quota"
	case ShedLimit:
		return "limit"
	}
	return fmt.Sprintf("ShedReason(%d)", uint8(r))
}

// Decision is the verdict on one request.
type Decision struct {
	Reason ShedReason
	// Held is set on an admitted request that the model's shed fraction would have
	// weighed had its engine been queued (Decide's queued was false while the control
	// server asks to shed a share of the model and arrivals have not yet fallen to what
	// that share leaves admitted).
	Held bool
	// RetryAfter is set when the request is shed.
	RetryAfter time.Duration
}

// Shed reports whether the request must be answered 503 now.
func (d Decision) Shed() bool { return d.Reason != Admit }

// ModelDemand is one model's recent arrival and shed rates, for load reports.
type ModelDemand struct {
	Model             string
	RequestsPerSecond float64
	ShedPerSecond     float64
}

// Shedder decides which requests to shed. For a model with shed fraction f it keeps
// decayed per-class arrival counts, and sheds whole classes from the lowest up while
// their share of arrivals fits in f, and then the needed part of the next class (the
// cutoff class), spread over its arrivals by error diffusion: evenly, or with
// ShedConfig.ByWork in proportion to each request's work, so that the part shed is that
// share of the class's work (a request of twice the work is twice as likely to be shed,
// and fewer requests are refused for the same relief). Decisions are deterministic given
// the arrival sequence and the clock. Safe for concurrent use.
type Shedder struct {
	cfg   ShedConfig
	clock Clock

	mu     sync.RWMutex
	models map[string]*modelState
}

type modelState struct {
	mu       sync.Mutex
	fraction float64
	// admit is the arrival rate (req/s) the fraction leaves admitted, fixed when the
	// fraction arrives: when arrivals fall below it, nothing needs shedding any more,
	// though the control server, which smooths demand, still asks for a while.
	admit     float64
	arrivals  []float64 // per class, decayed
	recent    float64   // all classes, decayed fast (recentHalfLife)
	shed      float64   // decayed
	carry     []float64 // error-diffusion remainder per class
	decayedAt time.Time
	// workMean and workSquare average the work of the model's arrivals and its square
	// (ShedConfig.ByWork), by workAverageWeight per arrival; 0 before the first.
	workMean, workSquare float64
}

// workAverageWeight is the weight of each arrival in modelState's work averages: the work
// of a model's requests is a property of its workload, so the averages span a few hundred
// arrivals (minutes at a sidecar's rate) rather than the arrival rates' seconds.
const workAverageWeight = 1.0 / 256

// recentHalfLife is the memory of the arrival rate that lifts a quota once arrivals fall.
const recentHalfLife = time.Second

// NewShedder returns a shedder that sheds nothing until SetFractions says so (or a
// request arrives with every candidate at its limit).
func NewShedder(cfg ShedConfig, clock Clock) (*Shedder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		return nil, errors.New("guard: NewShedder needs a Clock (SystemClock in production)")
	}
	return &Shedder{cfg: cfg, clock: clock, models: make(map[string]*modelState)}, nil
}

// SetFractions replaces every model's shed fraction (models not named get 0). A value
// outside [0, 1] is refused and the current fractions stay.
func (s *Shedder) SetFractions(fractions map[string]float64) error {
	for m, f := range fractions {
		if !(f >= 0 && f <= 1) {
			return fmt.Errorf("guard: shed fraction for model %q is %v: want in [0, 1]", m, f)
		}
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for m := range fractions {
		if s.models[m] == nil {
			s.models[m] = s.newModel(now)
		}
	}
	perSecond := math.Ln2 / s.cfg.RateHalfLife.Seconds()
	for m, st := range s.models {
		st.mu.Lock()
		st.decayTo(now, s.cfg.RateHalfLife)
		st.fraction = fractions[m]
		st.admit = (1 - st.fraction) * sum(st.arrivals) * perSecond
		st.mu.Unlock()
	}
	return nil
}

func sum(xs []float64) float64 {
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t
}

// effective is the fraction to shed now: the control server's, or less once recent
// arrivals have fallen toward what it leaves admitted. It never sheds more than asked.
func (st *modelState) effective() float64 {
	if st.fraction == 0 {
		return 0
	}
	rate := st.recent * math.Ln2 / recentHalfLife.Seconds()
	if rate <= 0 {
		return st.fraction
	}
	return min(st.fraction, max(0, 1-st.admit/rate))
}

func (s *Shedder) newModel(now time.Time) *modelState {
	return &modelState{
		arrivals:  make([]float64, s.cfg.Priorities),
		carry:     make([]float64, s.cfg.Priorities),
		decayedAt: now,
	}
}

// model returns the state for a model name, creating it within MaxModels.
func (s *Shedder) model(name string, now time.Time) *modelState {
	s.mu.RLock()
	st := s.models[name]
	s.mu.RUnlock()
	if st != nil {
		return st
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st = s.models[name]; st != nil {
		return st
	}
	if len(s.models) >= s.cfg.MaxModels {
		name = OtherModels
		if st = s.models[name]; st != nil {
			return st
		}
	}
	st = s.newModel(now)
	s.models[name] = st
	return st
}

// Decide counts one arriving request of the model at the given priority and says
// whether to shed it. atLimit is the picker's verdict that every candidate engine is
// at its local limit: such a request is shed whatever its priority. queued says the
// engine the request would go to is loaded enough that the model's shed fraction may
// take it: the fraction applies to such requests only. A request that is not queued is
// admitted, and still counts as an arrival (in the demand Demand reports and in the
// classes' shares of it). Priorities outside [0, Priorities-1] are treated as the
// nearest class. work is the request's cost in any unit the caller keeps to (the sidecar's
// is prompt tokens plus its decode allowance), weighed by ShedConfig.ByWork; a request with
// work <= 0 weighs 1, as every request does without ByWork.
func (s *Shedder) Decide(model string, priority int, atLimit, queued bool, work float64) Decision {
	return s.Model(model).Decide(priority, atLimit, queued, work)
}

// ModelShedder decides for one model. The request path keeps one per model (it outlives
// fraction updates), so a decision takes only that model's lock, never the shedder's.
type ModelShedder struct {
	s  *Shedder
	st *modelState
}

// Model returns the model's decider, creating its state within MaxModels (past that, the
// models share OtherModels').
func (s *Shedder) Model(name string) ModelShedder {
	return ModelShedder{s: s, st: s.model(name, s.clock.Now())}
}

// Decide is Shedder.Decide for this model.
func (m ModelShedder) Decide(priority int, atLimit, queued bool, work float64) Decision {
	s, st := m.s, m.st
	now := s.clock.Now()
	p := min(max(priority, 0), s.cfg.Priorities-1)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.decayTo(now, s.cfg.RateHalfLife)
	st.arrivals[p]++
	st.recent++
	if s.cfg.ByWork {
		st.learnWork(work)
	}
	reason, eff := Admit, st.effective()
	switch {
	case atLimit:
		reason = ShedLimit
	case queued && eff > 0 && st.quota(p, eff, st.weight(s.cfg.ByWork, work)):
		reason = ShedQuota
	}
	if reason == Admit {
		return Decision{Held: !queued && eff > 0}
	}
	st.shed++
	return Decision{Reason: reason, RetryAfter: s.cfg.RetryAfter}
}

// decayTo ages the counts. Steps shorter than 1/64 of the shorter half-life are skipped
// (the counts they would age are added at full weight), which keeps Exp2 off most requests.
func (st *modelState) decayTo(now time.Time, halfLife time.Duration) {
	dt := now.Sub(st.decayedAt)
	if dt < min(halfLife, recentHalfLife)/64 {
		return
	}
	f := halfLifeDecay(dt, halfLife)
	for i := range st.arrivals {
		st.arrivals[i] *= f
	}
	st.shed *= f
	st.recent *= halfLifeDecay(dt, recentHalfLife)
	st.decayedAt = now
}

// learnWork adds an arrival's work to the model's averages (ShedConfig.ByWork); work that
// is not stated (<= 0, NaN, infinite) is left out.
func (st *modelState) learnWork(work float64) {
	if !stated(work) {
		return
	}
	if st.workSquare == 0 {
		st.workMean, st.workSquare = work, work*work
		return
	}
	st.workMean += (work - st.workMean) * workAverageWeight
	st.workSquare += (work*work - st.workSquare) * workAverageWeight
}

// weight is an arrival's weight in the quota: with byWork, work × E[work] / E[work²], which
// sheds the fraction f of the work when each request of the cutoff class is picked with f ×
// its weight (the expected work shed per arrival is f × E[work]); 1 (every request's weight
// when all have the same work) without byWork, when work is not stated, or before the
// averages hold any.
func (st *modelState) weight(byWork bool, work float64) float64 {
	if !byWork || !stated(work) || !stated(st.workSquare) {
		return 1
	}
	return work * st.workMean / st.workSquare
}

// stated reports whether x is a work (or an average of works) to weigh by: positive and
// finite.
func stated(x float64) bool { return x > 0 && !math.IsInf(x, 0) }

// quota reports whether shedding the fraction f asks to shed this arrival of class p,
// whose weight is w (1 for each when every request weighs the same).
func (st *modelState) quota(p int, f, w float64) bool {
	total := sum(st.arrivals)
	target, below := f*total, 0.0
	for c, a := range st.arrivals {
		if below+a <= target {
			if c == p {
				return true // a class wholly shed
			}
			below += a
			continue
		}
		if c != p {
			// c is the cutoff class and p is above it: every class below c was
			// wholly shed, and p would have been found among them.
			return false
		}
		// A request heavy enough to fill the remainder alone is shed, and what it
		// exceeds is not passed on to the next arrival.
		st.carry[c] += min((target-below)/a*w, 1)
		if st.carry[c] >= 1 {
			st.carry[c]--
			return true
		}
		return false
	}
	return true // unreachable: arrivals[p] > 0 puts p in the loop
}

// Demand returns every tracked model's arrival and shed rates, sorted by model.
func (s *Shedder) Demand() []ModelDemand {
	now := s.clock.Now()
	perSecond := math.Ln2 / s.cfg.RateHalfLife.Seconds() // a decayed count of a steady rate λ is λ·H/ln 2
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]ModelDemand, 0, len(s.models))
	for m, st := range s.models {
		st.mu.Lock()
		st.decayTo(now, s.cfg.RateHalfLife)
		out = append(out, ModelDemand{Model: m, RequestsPerSecond: sum(st.arrivals) * perSecond, ShedPerSecond: st.shed * perSecond})
		st.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b ModelDemand) int { return strings.Compare(a.Model, b.Model) })
	return out
}
