package sim

import (
	"context"
	"time"

	"github.com/meridian-router/meridian/control/optimizer"
	"github.com/meridian-router/meridian/enginemetrics"
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
		for _, pool := range m.sidecars {
			for _, sc := range pool {
				_, _ = sc.core.RefreshPenalties() // weights and penalties are valid by construction
			}
		}
	}
	if now-m.lastScrape >= scrapePeriod {
		m.lastScrape = now
		m.scrape(v)
	}
	if now-m.lastReport >= m.cfg.ReportInterval {
		m.lastReport = now
		for _, pool := range m.sidecars {
			for _, sc := range pool {
				_ = m.agg.ObserveReport(sc.core.BuildReport(sc.node, sc.id)) // well-formed by construction
			}
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
			m.agg.ObserveScrapeError(m.names[e], enginemetrics.ErrScrape)
			continue
		}
		s := ev.Stats
		m.agg.ObserveScrape(m.names[e], enginemetrics.Sample{Models: []string{meridianModel},
			Running: float64(s.Running), Waiting: float64(s.Waiting), KVCacheUsage: s.KVUsage,
			PrefixQueries: float64(s.PrefixQueries), PrefixHits: float64(s.PrefixHits),
			TTFT: sampleHist(s.TTFT), ITL: sampleHist(s.ITL), E2E: sampleHist(s.E2E)})
	}
}

func sampleHist(h engine.Histogram) enginemetrics.Histogram {
	out := enginemetrics.Histogram{Count: float64(h.Count), Sum: h.Sum, Bounds: h.Bounds}
	for _, c := range h.Cumulative() {
		out.Cumulative = append(out.Cumulative, float64(c))
	}
	return out
}

// solve takes the aggregator's snapshot as the optimizer's inputs (smoothed demand, fitted
// curves, suspect engines, penalties), runs one period and hands the result to the
// sidecars as the control server does: each node's policy, and new EDS views when the
// weights changed.
func (m *meridian) solve() {
	in := optimizer.InputsFrom(m.agg.Snapshot(m.specs))
	res, err := m.opt.Step(context.Background(), m.fleet, in)
	if err != nil {
		return // the control server keeps its last good weights
	}
	for _, pool := range m.sidecars {
		if p := res.Policies[pool[0].node]; p != nil {
			for _, sc := range pool {
				_ = sc.core.ApplyPolicy(p) // built by the optimizer, valid by construction
			}
		}
	}
	if res.Changed {
		_ = m.publish(res.Weights) // the plan of a validated fleet
	}
}

// exchange relays each sidecar's new placements to the other sidecars of its cluster, as
// the control server's placement relay does every placements.exchange_interval (the
// simulator runs it on the scrape's 50 ms grid). It returns how many placements the
// sidecars adopted.
func (m *meridian) exchange() (adopted int) {
	for _, pool := range m.sidecars {
		for _, from := range pool {
			m.placed = from.core.AppendPlacements(m.placed[:0])
			if len(m.placed) == 0 {
				continue
			}
			for _, to := range pool {
				if to != from {
					adopted += to.core.AdoptPlacements(m.placed)
				}
			}
		}
	}
	return adopted
}

// peersOn reports whether the sidecars of a cluster send each other their requests in
// flight: when a cluster has more than one.
func (m *meridian) peersOn() bool { return len(m.sidecars) > 0 && len(m.sidecars[0]) > 1 }

// ScrapePeriod is how often Scrape runs: each sidecar scrapes its engines' load gauges
// every engine_load.scrape_interval (0 turns the feed off), and the sidecars of a cluster
// send each other their requests in flight every peers.interval. With both, Scrape runs
// on the grid of their greatest common divisor, so each keeps its own period exactly.
func (m *meridian) ScrapePeriod() time.Duration {
	engines := m.cfg.EngineLoad.Interval
	if !m.peersOn() {
		return engines
	}
	if engines <= 0 {
		return m.cfg.PeerInterval
	}
	a, b := engines, m.cfg.PeerInterval
	for b > 0 {
		a, b = b, a%b
	}
	return a
}

// due reports whether a period that last ran at last runs again at now, on the grid of
// ScrapePeriod ticks (half a tick of slack absorbs rounding).
func (m *meridian) due(now, last, period time.Duration) bool {
	return now-last >= period-m.ScrapePeriod()/2
}

// sendInFlight hands each sidecar its cluster's other sidecars' requests in flight, as the
// peer stream each sidecar watches (extproc/server's peers.go) delivers them every
// peers.interval. The sidecars of a cluster run in one region, so the stream's delay is
// the interval's. A sidecar that started and ended nothing since its last send would send
// the same snapshot, which its peers already hold (SetPeerInFlight keeps the sums of a
// repeated one): it is skipped.
func (m *meridian) sendInFlight() {
	for _, pool := range m.sidecars {
		for _, from := range pool {
			if !from.moved {
				continue
			}
			from.moved = false
			var ranked int64
			m.inFlight, ranked = from.core.AppendInFlight(m.inFlight[:0])
			for _, to := range pool {
				if to != from {
					to.core.SetPeerInFlight(from.id, m.inFlight, ranked)
				}
			}
		}
	}
}

// Scrape hands every sidecar, for each engine it scrapes (decide.Core.LoadTargets), the
// engine's running and waiting requests, KV-cache use and prefix-cache and generation
// counters, as its own scrape of the engine's /metrics would read them (with the capacity
// vLLM states in cache_config_info); a down engine fails the scrape, which forgets its load.
func (m *meridian) Scrape(now time.Duration, v *View) {
	m.clock.now = now
	if m.peersOn() && m.due(now, m.lastPeers, m.cfg.PeerInterval) {
		m.lastPeers = now
		m.sendInFlight()
	}
	if m.cfg.EngineLoad.Interval <= 0 || !m.due(now, m.lastEngineScrape, m.cfg.EngineLoad.Interval) {
		return
	}
	m.lastEngineScrape = now
	if now-m.lastExchange >= m.cfg.PlacementInterval {
		m.lastExchange = now
		m.exchange()
	}
	for _, pool := range m.sidecars {
		for _, sc := range pool {
			m.targets = sc.core.LoadTargets(m.targets[:0])
			for _, tg := range m.targets {
				e := m.byAddr[tg.Address]
				ev := v.Engines[e]
				if !ev.Up {
					sc.core.ForgetEngineLoad(m.addrs[e])
					continue
				}
				sc.core.ObserveEngineLoad(m.addrs[e], enginemetrics.Load{Running: float64(ev.Running),
					Waiting: float64(ev.Waiting), KVUsage: ev.KVUsage, KVTokens: m.kvTokens,
					PrefixQueries: float64(ev.PrefixQueries), PrefixHits: float64(ev.PrefixHits),
					GenerationTokens: float64(ev.GenerationTokens), PromptTokens: float64(ev.PromptTokens),
					Finished: float64(ev.Finished)})
			}
		}
	}
}
