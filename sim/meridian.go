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
	"github.com/meridian-router/meridian/control/xds"
	"github.com/meridian-router/meridian/extproc/decide"
	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/picker"
	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/xdsapi"
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
//     for 200 ms requests).
func fleetTuning(w *Workload) tuning {
	t := defaultTuning(w)
	t.solvePeriod = 5 * time.Second
	t.optimizer.Params.MoveCost = w.ColdService / 2
	return t
}

// tune applies what c states of meridian's configuration to t: the sidecar's (with the
// simulator's bucket count), the optimizer's movement price, smallest share change and highest planned utilization, and
// the control server's --shed-backlog.
func (c *Config) tune(t tuning) tuning {
	if c.Sidecar != nil {
		t.sidecar = *c.Sidecar
		t.sidecar.Picker.Buckets = simBuckets
	}
	if c.MoveCost != nil {
		t.optimizer.Params.MoveCost = *c.MoveCost
	}
	if c.RhoMax != nil {
		t.optimizer.Params.RhoMax = *c.RhoMax
	}
	if c.MinShareChange != nil {
		t.optimizer.MinShareChange = *c.MinShareChange
	}
	if c.CacheHalfLife != nil {
		t.signals.CacheHalfLife = *c.CacheHalfLife
	}
	t.optimizer.ShedBacklog = c.ShedBacklog
	return t
}

// meridian is the full design, run from the real packages. The control server's loop is
// control/optimizer (which calls control/solver) on a control/fleet.Fleet describing the
// simulated fleet, its weights turned into each node's EDS view by control/xds's plan, fed
// every SolvePeriod with what the sidecars report through control/signals (smoothing,
// staleness, curve fitting). Each cluster's sidecars are extproc/decide cores, the very
// code the ext_proc server runs, with the sidecar's default configuration on virtual time.
// Only the translation is written here: a request becomes a decide.Request, an attempt's
// end becomes the outcome.Record Envoy's access log would carry, and engine state is handed
// over as a scrape of its /metrics would read it (meridian_control.go).
type meridian struct {
	shape       fleetShape
	fleet       *fleet.Fleet
	opt         *optimizer.Optimizer
	cfg         server.Config
	clock       *virtualClock
	names       []string
	byName      map[string]int
	byAddr      map[string]int
	addrs       []string
	agg         *signals.Aggregator
	specs       []signals.EngineSpec
	sidecars    [][]*sidecar // [cluster][replica]
	inflight    map[int]*attemptState
	solvePeriod time.Duration
	lastSolve   time.Duration
	lastReport  time.Duration
	lastPen     time.Duration
	lastScrape  time.Duration
	// lastEngineScrape is when the sidecars last scraped their engines.
	lastEngineScrape time.Duration
	// lastExchange is when the sidecars' placements were last relayed; placed is its buffer.
	lastExchange time.Duration
	placed       []decide.Placement
	// lastPeers is when the sidecars of each cluster last sent each other their requests in
	// flight; inFlight is its buffer.
	lastPeers time.Duration
	inFlight  []decide.EngineInFlight
	// kvTokens is each engine's KV capacity in tokens, as its cache_config_info states it.
	kvTokens  float64
	buf       [picker.MaxExamined]int
	engineBuf []string
	targets   []decide.LoadTarget
}

// sidecar is one sidecar of one cluster: a decision core and its identity.
type sidecar struct {
	node, id string
	core     *decide.Core
	// moved is set when the core may have started or ended a request since sendInFlight
	// last read its requests in flight (Route and Outcome are the only calls that do).
	moved bool
}

// attemptState is what the proxy knows of a request in flight, for its access log entry.
type attemptState struct {
	sc       *sidecar
	ticket   string
	attempts int
	sentAt   time.Duration // the current attempt's
	ttft     time.Duration // from sending the current attempt to its first token
	first    time.Duration // when the first token reached the proxy
}

// virtualClock adapts run time to guard.Clock.
type virtualClock struct{ now time.Duration }

func (c *virtualClock) Now() time.Time { return time.Unix(0, 0).Add(c.now) }

func newMeridian(f fleetShape, cfg *Config, w *Workload, t tuning) (*meridian, error) {
	t = cfg.tune(t)
	m := &meridian{shape: f, cfg: t.sidecar, clock: &virtualClock{}, byName: map[string]int{}, byAddr: map[string]int{},
		inflight: map[int]*attemptState{}, solvePeriod: t.solvePeriod, lastSolve: -t.solvePeriod,
		lastScrape: -scrapePeriod, lastExchange: -t.sidecar.PlacementInterval, lastPeers: -t.sidecar.PeerInterval,
		lastEngineScrape: -t.sidecar.EngineLoad.Interval,
		kvTokens:         float64(cfg.Engine.KVBlocks * cfg.Engine.BlockTokens)}
	if err := m.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sidecar config: %w", err)
	}
	var err error
	if m.fleet, err = simFleet(cfg, w); err != nil {
		return nil, err
	}
	for e, eng := range m.fleet.Engines {
		m.names = append(m.names, eng.Name)
		m.addrs = append(m.addrs, eng.Address)
		m.byName[eng.Name] = e
		m.byAddr[eng.Address] = e
		m.specs = append(m.specs, signals.EngineSpec{Name: eng.Name, Models: eng.Models,
			Capacity: eng.CapacityRPS, Curve: t.optimizer.DefaultCurve})
	}
	if m.agg, err = signals.NewAggregator(t.signals, m.clock.Now); err != nil {
		return nil, fmt.Errorf("signals: %w", err)
	}
	if m.opt, err = optimizer.New(t.optimizer); err != nil {
		return nil, fmt.Errorf("optimizer: %w", err)
	}
	replicas := max(cfg.replicas(), 1)
	coreCfg := m.cfg.Core()
	coreCfg.Rankings = &picker.Rankings{} // every replica of a node gets the same views: rank them once
	for _, c := range m.fleet.Clusters {
		var pool []*sidecar
		for i := range replicas {
			core, err := decide.New(coreCfg, m.clock)
			if err != nil {
				return nil, err
			}
			pool = append(pool, &sidecar{node: c.Name, id: fmt.Sprintf("%s-%d", c.Name, i), core: core})
		}
		m.sidecars = append(m.sidecars, pool)
	}
	// Before its first solve the control server publishes weights by capacity.
	if err := m.publish(nil); err != nil {
		return nil, err
	}
	return m, nil
}

// simFleet describes the simulated fleet as a fleet file would: one data-plane cluster per
// region, each engine's capacity the workload's cold capacity and its prefill share the
// part of that time spent in prefill (both as an operator would measure them by sending
// the workload's requests to one engine with its prefix cache off), and the RTT matrix.
func simFleet(cfg *Config, w *Workload) (*fleet.Fleet, error) {
	f := &fleet.Fleet{Models: []fleet.Model{{Name: meridianModel, PrefillShare: w.PrefillShare}}, DefaultModel: meridianModel,
		RTTMillis: map[string]map[string]float64{}}
	perEngine := 1 / w.ColdService
	for r, region := range cfg.Regions {
		f.Clusters = append(f.Clusters, fleet.Cluster{Name: region, Region: region})
		f.RTTMillis[region] = map[string]float64{}
		for r2, other := range cfg.Regions {
			f.RTTMillis[region][other] = float64(cfg.RTT[r][r2]) / float64(time.Millisecond)
		}
		for i := range cfg.EnginesPerRegion {
			addr := fmt.Sprintf("10.%d.0.%d:8000", r, i+1)
			f.Engines = append(f.Engines, fleet.Engine{Name: fmt.Sprintf("%s-%d", region, i),
				Address: addr, MetricsURL: "http://" + addr + "/metrics", Region: region,
				Models: []string{meridianModel}, CapacityRPS: perEngine})
		}
	}
	if errs := f.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("simulated fleet: %w", errors.Join(errs...))
	}
	return f, nil
}

// publish builds every node's EDS view from solved weights (nil: before any solve) as the
// control server's plan does, and hands it to that node's sidecars.
func (m *meridian) publish(weights map[string]map[string]map[string]uint32) error {
	plan, err := xds.BuildPlan(m.fleet, xds.SolvedWeights(m.fleet, weights))
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	for _, pool := range m.sidecars {
		node := pool[0].node
		v := &xdsapi.View{Version: "sim", Models: map[string]xdsapi.ModelView{}}
		for model, eps := range plan.Assignments[node] {
			v.Models[model] = xdsapi.ModelView{Name: model, Cluster: xdsapi.ClusterName(model), Endpoints: eps}
		}
		for _, sc := range pool {
			if err := sc.core.Update(v); err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
		}
	}
	return nil
}

// sidecarFor is the sidecar that receives r: one of its cluster's, by r's replica draw.
func (m *meridian) sidecarFor(r *Request) *sidecar {
	pool := m.sidecars[r.Cluster]
	return pool[r.replica()%len(pool)]
}

func (m *meridian) Route(now time.Duration, r *Request) Route {
	m.clock.now = now
	sc := m.sidecarFor(r)
	sc.moved = true
	d := sc.core.Route(decide.Request{Model: meridianModel, Key: r.LadderKey, ParentKey: r.ParentKey, Marks: r.Marks, Priority: m.cfg.Priority.Default,
		PromptBytes: r.InputTokens * decide.BytesPerToken, BodyBytes: r.InputTokens * decide.BytesPerToken}, m.buf[:0])
	if d.Verdict != decide.Steer {
		return Route{ShedReason: d.Verdict.String()} // shed (or no engine): the proxy answers 503 at once
	}
	m.engineBuf = d.AppendEngines(m.engineBuf[:0])
	out := make([]int, len(m.engineBuf))
	for i, name := range m.engineBuf {
		out[i] = m.byName[name]
	}
	m.inflight[r.ID] = &attemptState{sc: sc, ticket: d.Ticket}
	return Route{Engines: out, Retries: int(d.Retries), UnsentOnly: d.Budget == 0}
}

// Observe turns an attempt's steps into what the sidecar hears: nothing until the request
// ends, then one access log record (upstream, status, attempts, time to first byte from
// the last attempt's send, decode time and body size).
func (m *meridian) Observe(now time.Duration, o Outcome) {
	m.clock.now = now
	a := m.inflight[o.Request.ID]
	if a == nil {
		return
	}
	switch o.Kind {
	case Sent:
		a.attempts++
		a.sentAt, a.ttft = now, 0
	case FirstToken:
		a.ttft, a.first = now-a.sentAt, now
	case Done, Failed:
		if o.Kind == Failed && !o.Final {
			return // Envoy retries; its log entry comes when the request ends
		}
		rec := outcome.Record{Ticket: a.ticket, Upstream: m.addrs[o.Engine], Attempts: max(a.attempts, 1)}
		if o.Kind == Done {
			rec.Status, rec.TTFT, rec.TTFB = 200, a.ttft, a.ttft
			rec.Decode = now - a.first
			rec.BodyBytes = uint64(o.Request.OutputTokens) * decide.SSEChunkBytes
		} else if o.Rejected {
			rec.Status = 400 // the engine's answer to a request it cannot hold
		} else {
			rec.Status, rec.UpstreamFailure = 503, true
		}
		a.sc.core.Outcome(rec)
		a.sc.moved = true
		delete(m.inflight, o.Request.ID)
	}
}

func (m *meridian) Weights(c int, dst []float64) {
	for e := range dst {
		dst[e] = 0
	}
	total := 0.0
	m.sidecars[c][0].core.Weights(meridianModel, func(engine string, w float64) {
		dst[m.byName[engine]] = w
		total += w
	})
	for e := range dst {
		if total > 0 {
			dst[e] /= total
		}
	}
}
