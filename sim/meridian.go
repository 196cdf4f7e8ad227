package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/optimizer"
	"github.com/meridian-router/meridian/control/signals"
	"github.com/meridian-router/meridian/control/solver"
	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/picker"
	"github.com/meridian-router/meridian/extproc/server"
)

// simBuckets is the picker's key-space size in the simulator. The sidecar's default (2^18)
// only matters for memory and build time: with a dozen engines 2^12 buckets still quantize
// shares to 0.02%, and a table builds in about a millisecond instead of tens (the
// simulator rebuilds thousands).
const simBuckets = 1 << 12

// meridianModel is the one model the simulated fleet serves.
const meridianModel = "model"

// sidecarConfig is the real sidecar's default configuration, with simBuckets.
func sidecarConfig() server.Config {
	cfg := server.DefaultConfig(slog.New(slog.DiscardHandler))
	cfg.Picker.Buckets = simBuckets
	return cfg
}

// tuning is a meridian deployment's configuration: the sidecars', the optimizer's and the
// control server's solve period.
type tuning struct {
	sidecar     server.Config
	optimizer   optimizer.Config
	signals     signals.Config
	solvePeriod time.Duration
}

// defaultTuning is what meridian ships with: the sidecar's and optimizer's defaults and the
// control server's default --solve-period, with the operator's latency curve for the
// workload (a lone request's engine time, M/M/1 queueing on top).
func defaultTuning(w *Workload) tuning {
	t := tuning{sidecar: sidecarConfig(), optimizer: optimizer.DefaultConfig(), signals: signals.DefaultConfig(),
		solvePeriod: time.Second}
	t.optimizer.DefaultCurve = solver.Curve{Base: w.ColdService, Queue: w.ColdService}
	return t
}

// fleetTuning adapts the defaults to a fleet whose request rate is low (a few requests per
// second per cluster, because each request is long), using only configuration knobs:
//   - the control server solves every 5 s instead of every second: demand, smoothed by
//     control/signals, still moves by tens of percent between seconds at these rates, and
//     every solve that moves a share republishes weights and moves keys;
//   - the LP's movement price is half a request's cold engine time, the order of the
//     prefill work a moved conversation loses with its cache (the default, 5 ms, was set
//     for 200 ms requests);
//   - weights are republished only when a share moves by 5 points, not 2.
//
// The picker's bounded-load slack stays at 0.25: a slack of 1 raised the hit rate from
// about 0.12 to 0.15 on the steady run but let a 5x slower engine keep its share (TTFT p99
// 290 s instead of 37 s in the slow-engine scenario). The outlier penalties keep their
// defaults too: at under one request per second per engine they rarely have the 20 recent
// samples they need, and loosening that turned prompt-length noise into false penalties.
func fleetTuning(w *Workload) tuning {
	t := defaultTuning(w)
	t.solvePeriod = 5 * time.Second
	t.optimizer.Params.MoveCost = w.ColdService / 2
	t.optimizer.MinShareChange = 0.05
	return t
}

// meridian is the full design, run from the real packages. The control server's loop is
// control/optimizer (which calls control/solver) on a control/fleet.Fleet describing the
// simulated fleet, fed every SolvePeriod with what the sidecars report. Each cluster's
// sidecar routes with an extproc/picker table (weighted rendezvous hashing with bounded
// loads over the published weights times its outlier penalties) and applies the
// extproc/guard outlier penalties, retry budget and shedder, all with the sidecar's default
// configuration (extproc/server.DefaultConfig). Sidecar load reports and engine scrapes go
// through control/signals (smoothing, staleness, curve fitting) into the optimizer. Only the
// glue is written here (meridian_control.go): reports are built as extproc/server builds
// them, and engine state is handed over as a scrape of its /metrics would read it.
type meridian struct {
	shape       fleetShape
	fleet       *fleet.Fleet
	opt         *optimizer.Optimizer
	cfg         server.Config
	clock       *virtualClock
	names       []string
	byName      map[string]int
	agg         *signals.Aggregator
	specs       []signals.EngineSpec
	sidecars    []*sidecar
	attempts    map[int]*attemptState // by request ID
	solvePeriod time.Duration
	lastSolve   time.Duration
	lastReport  time.Duration
	lastPen     time.Duration
	lastScrape  time.Duration
}

// sidecar is one cluster's data plane.
type sidecar struct {
	node     string
	loads    *picker.Loads
	table    *picker.Table
	engineOf []int             // table index -> engine
	weights  map[string]uint32 // published EDS weights by engine name
	penVer   uint64
	outliers *guard.Outliers
	retries  *guard.Retries
	shedder  *guard.Shedder
	util     float64 // the policy's planned utilization, for the retry budget
	arrivals int     // in the current report window
	buf      []int
}

// attemptState is what the sidecar remembers of a request in flight.
type attemptState struct {
	ticket picker.Ticket
	ttft   time.Duration
}

// virtualClock adapts run time to guard.Clock.
type virtualClock struct{ now time.Duration }

func (c *virtualClock) Now() time.Time { return time.Unix(0, 0).Add(c.now) }

func newMeridian(f fleetShape, cfg *Config, w *Workload, t tuning) (*meridian, error) {
	m := &meridian{shape: f, cfg: t.sidecar, clock: &virtualClock{}, byName: map[string]int{},
		attempts: map[int]*attemptState{}, solvePeriod: t.solvePeriod, lastSolve: -t.solvePeriod,
		lastScrape: -scrapePeriod}
	if err := m.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sidecar config: %w", err)
	}
	var err error
	if m.fleet, err = simFleet(cfg, w); err != nil {
		return nil, err
	}
	for e, eng := range m.fleet.Engines {
		m.names = append(m.names, eng.Name)
		m.byName[eng.Name] = e
		m.specs = append(m.specs, signals.EngineSpec{Name: eng.Name, Models: eng.Models,
			Capacity: eng.CapacityRPS, Curve: t.optimizer.DefaultCurve})
	}
	if m.agg, err = signals.NewAggregator(t.signals, m.clock.Now); err != nil {
		return nil, fmt.Errorf("signals: %w", err)
	}
	if m.opt, err = optimizer.New(t.optimizer); err != nil {
		return nil, fmt.Errorf("optimizer: %w", err)
	}
	for _, c := range m.fleet.Clusters {
		sc, err := m.newSidecar(c.Name)
		if err != nil {
			return nil, err
		}
		m.sidecars = append(m.sidecars, sc)
	}
	return m, nil
}

// simFleet describes the simulated fleet as a fleet file would: one data-plane cluster per
// region, each engine's capacity the workload's cold capacity, and the RTT matrix.
func simFleet(cfg *Config, w *Workload) (*fleet.Fleet, error) {
	f := &fleet.Fleet{Models: []fleet.Model{{Name: meridianModel}}, DefaultModel: meridianModel,
		RTTMillis: map[string]map[string]float64{}}
	perEngine := 1 / w.ColdService
	for r, region := range cfg.Regions {
		f.Clusters = append(f.Clusters, fleet.Cluster{Name: region, Region: region})
		f.RTTMillis[region] = map[string]float64{}
		for r2, other := range cfg.Regions {
			f.RTTMillis[region][other] = float64(cfg.RTT[r][r2]) / float64(time.Millisecond)
		}
		for i := range cfg.EnginesPerRegion {
			f.Engines = append(f.Engines, fleet.Engine{Name: fmt.Sprintf("%s-%d", region, i),
				Address: fmt.Sprintf("10.%d.0.%d:8000", r, i+1), Region: region,
				Models: []string{meridianModel}, CapacityRPS: perEngine})
		}
	}
	if errs := f.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("simulated fleet: %w", errors.Join(errs...))
	}
	return f, nil
}

func (m *meridian) newSidecar(node string) (*sidecar, error) {
	sc := &sidecar{node: node, loads: picker.NewLoads(), weights: map[string]uint32{}}
	var err error
	if sc.outliers, err = guard.NewOutliers(m.cfg.Outliers, m.clock); err != nil {
		return nil, err
	}
	if sc.retries, err = guard.NewRetries(m.cfg.Retry); err != nil {
		return nil, err
	}
	if sc.shedder, err = guard.NewShedder(m.cfg.Shed, m.clock); err != nil {
		return nil, err
	}
	return sc, m.rebuild(sc)
}

// rebuild makes sc's picker table from its published weights times its outlier penalties,
// as the sidecar does on every EDS update and penalty change.
func (m *meridian) rebuild(sc *sidecar) error {
	pen := sc.outliers.Penalties()
	eps := make([]picker.Endpoint, 0, len(m.names))
	for e, name := range m.names {
		w := sc.weights[name]
		if w == 0 {
			continue
		}
		eps = append(eps, picker.Endpoint{Address: m.fleet.Engines[e].Address, Engine: name,
			Weight: float64(w) * pen.Factor(name)})
	}
	t, err := picker.NewTable(m.cfg.Picker, eps, sc.loads)
	if err != nil {
		return fmt.Errorf("picker table: %w", err)
	}
	sc.table, sc.engineOf = t, sc.engineOf[:0]
	for i := range t.Len() {
		sc.engineOf = append(sc.engineOf, m.byName[t.Endpoint(i).Engine])
	}
	sc.loads.Prune(t)
	return nil
}

func (m *meridian) Route(now time.Duration, r *Request) Route {
	m.clock.now = now
	sc := m.sidecars[r.Cluster]
	sc.arrivals++
	res := sc.table.Pick(r.Key, sc.buf[:0])
	sc.buf = res.Order
	if sc.shedder.Decide(meridianModel, m.cfg.Priority.Default, res.AtLimit || len(res.Order) == 0).Shed() {
		return Route{}
	}
	grant := sc.retries.Allow(sc.util)
	out := make([]int, len(res.Order))
	for i, idx := range res.Order {
		out[i] = sc.engineOf[idx]
	}
	return Route{Engines: out, Retries: int(grant.Max)}
}

func (m *meridian) Observe(now time.Duration, o Outcome) {
	m.clock.now = now
	sc := m.sidecars[o.Request.Cluster]
	a := m.attempts[o.Request.ID]
	switch o.Kind {
	case Sent:
		if a == nil {
			a = &attemptState{}
			m.attempts[o.Request.ID] = a
		} else {
			sc.retries.Spent(1)
		}
		a.ttft, a.ticket = 0, picker.Ticket{}
		if i, ok := sc.table.Lookup(m.fleet.Engines[o.Engine].Address); ok {
			a.ticket = sc.table.Start(i)
		}
	case FirstToken:
		a.ttft = o.TTFT
	case Done, Failed:
		a.ticket.Done()
		a.ticket = picker.Ticket{}
		sc.outliers.Observe(guard.Outcome{Engine: m.names[o.Engine], OK: o.Kind == Done, TTFT: a.ttft, ITL: o.ITL})
		if o.Kind == Done {
			delete(m.attempts, o.Request.ID)
		}
	}
}

func (m *meridian) Weights(c int, dst []float64) {
	sc := m.sidecars[c]
	total := 0.0
	for e := range dst {
		dst[e] = 0
	}
	for i, e := range sc.engineOf {
		dst[e] = sc.table.Endpoint(i).Weight
		total += dst[e]
	}
	for e := range dst {
		if total > 0 {
			dst[e] /= total
		}
	}
}
