package server

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/control/signals"
)

// fleetCollector exports, at scrape time, the state behind the plan: the weight of each
// engine in each node's split, each engine's health state and penalty, how long ago its
// /metrics was last read and how many vLLM signals it lacks, and the demand per node and
// model. It reads what /debug/state reads, under the same lock, and holds no state itself.
type fleetCollector struct{ s *Server }

var (
	descWeight = prometheus.NewDesc("meridian_control_engine_weight",
		"Weight of an engine in a node's split for a model, as published (0: not in the split).", []string{"node", "model", "engine"}, nil)
	descState = prometheus.NewDesc("meridian_control_engine_state",
		"1 for the engine's current health state (ok, degraded, suspect, failing, unknown).", []string{"engine", "state"}, nil)
	descPenalty = prometheus.NewDesc("meridian_control_engine_penalty",
		"Smoothed outlier penalty the sidecars report for an engine, in (0, 1]; 1 is none.", []string{"engine"}, nil)
	descScrapeAge = prometheus.NewDesc("meridian_control_engine_scrape_age_seconds",
		"Seconds since the engine's /metrics was last read successfully (absent: never).", []string{"engine"}, nil)
	descMissing = prometheus.NewDesc("meridian_control_engine_missing_signals",
		"vLLM signals the engine's /metrics lacks (0: all present).", []string{"engine"}, nil)
	descDemand = prometheus.NewDesc("meridian_control_demand_rps",
		"Smoothed offered load the sidecars of a node report for a model, in requests/s.", []string{"node", "model"}, nil)
)

func (c fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descWeight, descState, descPenalty, descScrapeAge, descMissing, descDemand} {
		ch <- d
	}
}

func (c fleetCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	f, last, snap := s.fleet, s.last, s.snap
	s.mu.Unlock()
	if f == nil {
		return
	}
	weights := weightFunc(f, last)
	for _, cl := range f.Clusters {
		for _, m := range f.Models {
			w := weights(cl.Name, m.Name)
			for _, e := range f.Engines {
				if slices.Contains(e.Models, m.Name) {
					ch <- prometheus.MustNewConstMetric(descWeight, prometheus.GaugeValue, float64(w[e.Name]), cl.Name, m.Name, e.Name)
				}
			}
		}
	}
	now := time.Now()
	for name, es := range snap.Engines {
		for st := signals.Unknown; st <= signals.Failing; st++ {
			v := 0.0
			if st == es.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, name, st.String())
		}
		ch <- prometheus.MustNewConstMetric(descPenalty, prometheus.GaugeValue, es.Penalty, name)
		if !es.LastScrape.IsZero() {
			ch <- prometheus.MustNewConstMetric(descScrapeAge, prometheus.GaugeValue, now.Sub(es.LastScrape).Seconds(), name)
		}
		ch <- prometheus.MustNewConstMetric(descMissing, prometheus.GaugeValue, float64(len(es.Missing)), name)
	}
	for node, models := range snap.Demand {
		for model, rps := range models {
			ch <- prometheus.MustNewConstMetric(descDemand, prometheus.GaugeValue, rps, node, model)
		}
	}
}
