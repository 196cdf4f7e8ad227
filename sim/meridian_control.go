package sim

import (
	"context"
	"maps"
	"math"
	"time"

	"github.com/meridian-router/meridian/control/optimizer"
	"github.com/meridian-router/meridian/control/signals"
	"github.com/meridian-router/meridian/extproc/guard"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
	"github.com/meridian-router/meridian/sim/engine"
)

// scrapePeriod is how often the control server scrapes every engine's /metrics.
const scrapePeriod = 2 * time.Second

// Tick runs the sidecars' penalty evaluation and load reports, the control server's scrapes
// and its solve, each on its own period.
func (m *meridian) Tick(now time.Duration, v *View) {
	m.clock.now = now
	if now-m.lastPen >= m.cfg.PenaltyInterval {
		m.lastPen = now
		for _, sc := range m.sidecars {
			if pen := sc.outliers.Evaluate(); pen.Version != sc.penVer {
				sc.penVer = pen.Version
				_ = m.rebuild(sc) // weights and penalties are valid by construction
			}
		}
	}
	if now-m.lastScrape >= scrapePeriod {
		m.lastScrape = now
		m.scrape(v)
	}
	if now-m.lastReport >= m.cfg.ReportInterval {
		window := (now - m.lastReport).Seconds()
		m.lastReport = now
		for i, sc := range m.sidecars {
			_ = m.agg.ObserveReport(m.report(sc, i, window)) // well-formed by construction
		}
	}
	if now-m.lastSolve >= m.solvePeriod {
		m.lastSolve = now
		m.solve()
	}
}

// scrape hands every engine's metrics to the aggregator; a down engine fails its scrape.
func (m *meridian) scrape(v *View) {
	for e, ev := range v.Engines {
		if !ev.Up {
			m.agg.ObserveScrapeError(m.names[e], signals.ErrScrape)
			continue
		}
		s := ev.Stats
		m.agg.ObserveScrape(m.names[e], signals.Sample{Models: []string{meridianModel},
			Running: float64(s.Running), Waiting: float64(s.Waiting), KVCacheUsage: s.KVUsage,
			PrefixQueries: float64(s.PrefixQueries), PrefixHits: float64(s.PrefixHits),
			TTFT: sampleHist(s.TTFT), ITL: sampleHist(s.ITL), E2E: sampleHist(s.E2E)})
	}
}

func sampleHist(h engine.Histogram) signals.Histogram {
	out := signals.Histogram{Count: float64(h.Count), Sum: h.Sum, Bounds: h.Bounds}
	for _, c := range h.Cumulative() {
		out.Cumulative = append(out.Cumulative, float64(c))
	}
	return out
}

// report cuts sc's report window into a LoadReport, as extproc/server's buildReport does.
func (m *meridian) report(sc *sidecar, i int, window float64) *meridianv1.LoadReport {
	now := m.clock.Now()
	secs := max(window, 1e-3)
	rep := &meridianv1.LoadReport{NodeId: sc.node, SidecarId: sc.node + "-0", WindowSeconds: secs,
		UnixMillis: now.UnixMilli()}
	shed := 0.0
	for _, d := range sc.shedder.Demand() {
		shed += d.ShedPerSecond
	}
	rep.Demand = []*meridianv1.ModelDemand{{Model: meridianModel,
		RequestsPerSecond: float64(sc.arrivals) / secs, ShedPerSecond: shed}}
	sc.arrivals = 0
	for _, e := range sc.outliers.Penalties().Engines() {
		addr := m.fleet.Engines[m.byName[e.Engine]].Address
		rep.Engines = append(rep.Engines, &meridianv1.EngineObservation{Engine: e.Engine, Address: addr,
			Requests: uint64(math.Round(e.Requests)), Errors: uint64(math.Round(e.Errors)),
			TtftP50Seconds: e.TTFTP50.Seconds(), TtftP90Seconds: e.TTFTP90.Seconds(),
			ItlMeanSeconds: e.ITLMean.Seconds(), InFlight: float64(sc.loads.InFlight(addr)), Penalty: e.Factor})
	}
	return rep
}

// solve takes the aggregator's snapshot as the optimizer's inputs (smoothed demand, fitted
// curves, suspect engines, penalties), runs one period and applies the result.
func (m *meridian) solve() {
	in := optimizer.InputsFrom(m.agg.Snapshot(m.specs))
	res, err := m.opt.Step(context.Background(), m.fleet, in)
	if err != nil {
		return // the control server keeps its last good weights
	}
	for _, sc := range m.sidecars {
		m.applyPolicy(sc, res.Policies[sc.node])
		if w := res.Weights[sc.node][meridianModel]; !maps.Equal(w, sc.weights) {
			sc.weights = w
			_ = m.rebuild(sc)
		}
	}
}

// applyPolicy takes the control server's shed fractions, retry budget and utilization, as
// extproc/server's ApplyPolicy does.
func (m *meridian) applyPolicy(sc *sidecar, p *meridianv1.Policy) {
	if p == nil {
		return
	}
	if f, err := guard.FractionsFromProto(p.GetShed()); err == nil {
		_ = sc.shedder.SetFractions(f)
	}
	if c, err := guard.CurveFromProto(p.GetRetryBudget()); err == nil {
		_ = sc.retries.SetCurve(c)
	}
	sc.util = p.GetUtilization()
}
