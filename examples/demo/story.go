package main

import (
	"fmt"
	"time"
)

// class is a priority class of traffic. The demo's load generator plays the trusted
// gateway that sets x-meridian-priority (the demo's Envoys keep that header).
type class struct {
	name     string
	priority int
	share    float64 // of each node's request rate
}

var classes = []class{
	{name: "interactive", priority: 3, share: 0.6},
	{name: "batch", priority: 0, share: 0.4},
}

// phase is one act of the story. Rates are fractions of a node's local capacity (the
// capacity_rps of the engines in its region), so the story fits any fleet file.
type phase struct {
	name string
	what string
	// share of the run, summing to 1 over the story
	share float64
	// load of the busy node (the first cluster) and of every other node
	busyLoad, otherLoad float64
	// slowEngine: the chosen engine's latency is multiplied by this during the phase (0: none)
	slowFactor float64
}

var story = []phase{
	{name: "steady", share: 0.2, busyLoad: 0.5, otherLoad: 0.5,
		what: "both regions at half their local capacity"},
	{name: "surge", share: 0.2, busyLoad: 1.35, otherLoad: 0.5,
		what: "the busy region's demand grows past its local capacity"},
	{name: "slow engine", share: 0.2, busyLoad: 0.7, otherLoad: 0.5, slowFactor: 8,
		what: "one engine of the busy region becomes 8x slower"},
	{name: "overload", share: 0.2, busyLoad: 1.3, otherLoad: 1.0,
		what: "demand exceeds the whole fleet's capacity"},
	{name: "recovery", share: 0.2, busyLoad: 0.4, otherLoad: 0.4,
		what: "demand falls back below the steady level"},
}

// plan is the story laid out on a run: when each phase starts and what it sends.
type plan struct {
	topo     *topology
	duration time.Duration
	scale    float64
	starts   []time.Duration // one per phase, plus the end
	slow     string          // the engine slowed in the slow-engine phase
}

func newPlan(topo *topology, duration time.Duration, scale float64) (*plan, error) {
	if duration < 5*time.Second {
		return nil, fmt.Errorf("--duration %s: the story needs at least 5s", duration)
	}
	if !(scale > 0) {
		return nil, fmt.Errorf("--scale %v: want > 0", scale)
	}
	p := &plan{topo: topo, duration: duration, scale: scale}
	at := 0.0
	for _, ph := range story {
		p.starts = append(p.starts, time.Duration(at*float64(duration)))
		at += ph.share
	}
	p.starts = append(p.starts, duration)
	busyRegion := topo.nodes[0].Region
	for _, e := range topo.engines {
		if e.Region == busyRegion {
			p.slow = e.Name // the last of the busy region: its peers stay as the baseline
		}
	}
	return p, nil
}

// rate is the request rate node sends in phase i.
func (p *plan) rate(i int, node string) float64 {
	f := story[i].otherLoad
	if node == p.topo.nodes[0].Name {
		f = story[i].busyLoad
	}
	return f * p.topo.localCapacity(node) * p.scale
}

// phaseAt returns the phase index at offset d from the start of traffic.
func (p *plan) phaseAt(d time.Duration) int {
	for i := range story {
		if d < p.starts[i+1] {
			return i
		}
	}
	return len(story) - 1
}

// span is how long phase i lasts.
func (p *plan) span(i int) time.Duration { return p.starts[i+1] - p.starts[i] }
