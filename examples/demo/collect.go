package main

import (
	"slices"
	"sync"
	"time"

	"github.com/meridian-router/meridian/examples/loadgen/load"
	"github.com/meridian-router/meridian/sim/trace"
)

// collector keeps every finished request; the demo's runs are bounded, so this is too.
type collector struct {
	mu      sync.Mutex
	results []result
}

func (c *collector) add(r result) {
	c.mu.Lock()
	c.results = append(c.results, r)
	c.mu.Unlock()
}

// filter returns the results that keep accepts.
func (c *collector) filter(keep func(result) bool) []result {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []result
	for _, r := range c.results {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// stats summarize a set of requests.
type stats struct {
	Requests int `json:"requests"`
	OK       int `json:"ok"`
	Shed     int `json:"shed"`
	Errors   int `json:"errors"`
	// Rates are per second of the span the requests were taken from.
	OfferedRPS float64 `json:"offered_rps"`
	OKRPS      float64 `json:"ok_rps"`
	ShedRPS    float64 `json:"shed_rps"`
	TTFTP50Ms  float64 `json:"ttft_p50_ms"`
	TTFTP99Ms  float64 `json:"ttft_p99_ms"`
	// RemoteShare is the fraction of ok requests an engine outside the entry region served.
	RemoteShare float64 `json:"remote_share"`
	// Engines counts ok requests by the engine that served them.
	Engines map[string]int `json:"engines"`
	// ShedByClass is the fraction of each priority class's requests that were shed.
	ShedByClass map[string]float64 `json:"shed_by_class"`
	// EngineTTFTP50Ms is the median TTFT of each engine's ok requests.
	EngineTTFTP50Ms map[string]float64 `json:"engine_ttft_p50_ms"`
}

func summarize(rs []result, span time.Duration, topo *topology) stats {
	s := stats{Requests: len(rs), Engines: map[string]int{}, ShedByClass: map[string]float64{}, EngineTTFTP50Ms: map[string]float64{}}
	var ttft []float64
	perEngine := map[string][]float64{}
	remote := 0
	classN, classShed := map[string]int{}, map[string]int{}
	for _, r := range rs {
		classN[r.class]++
		switch r.res.Class {
		case load.ClassOK:
		case load.ClassShed:
			s.Shed++
			classShed[r.class]++
			continue
		default:
			s.Errors++
			continue
		}
		s.OK++
		s.Engines[r.res.Engine]++
		if topo.region(r.res.Engine) != topo.nodeRegion(r.node) {
			remote++
		}
		if r.res.TTFT > 0 {
			ms := float64(r.res.TTFT) / float64(time.Millisecond)
			ttft = append(ttft, ms)
			perEngine[r.res.Engine] = append(perEngine[r.res.Engine], ms)
		}
	}
	if secs := span.Seconds(); secs > 0 {
		s.OfferedRPS, s.OKRPS, s.ShedRPS = round(float64(s.Requests)/secs, 1), round(float64(s.OK)/secs, 1), round(float64(s.Shed)/secs, 1)
	}
	if s.OK > 0 {
		s.RemoteShare = round(float64(remote)/float64(s.OK), 3)
	}
	s.TTFTP50Ms, s.TTFTP99Ms = percentile(ttft, 50), percentile(ttft, 99)
	for e, v := range perEngine {
		s.EngineTTFTP50Ms[e] = percentile(v, 50)
	}
	for c, n := range classN {
		s.ShedByClass[c] = round(float64(classShed[c])/float64(n), 3)
	}
	return s
}

func percentile(v []float64, p float64) float64 {
	slices.Sort(v)
	return round(trace.Percentile(v, p), 1)
}

func round(x float64, digits int) float64 {
	m := 1.0
	for range digits {
		m *= 10
	}
	return float64(int64(x*m+0.5)) / m
}
