package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/envoy/stack"
)

// mockEngineArgs size every mock engine so that it saturates at about 9 requests/s of the
// demo's requests (16 output tokens): a small batch keeps the demo's CPU use low and makes
// queueing visible at laptop rates. fleet.yaml's capacity_rps is set from this.
var mockEngineArgs = []string{"--max-num-seqs", "2"}

// topology is the demo's fleet as read from fleet.yaml: names, regions, capacities and
// round trips. Its addresses belong to the compose network; locally every engine gets a
// free port on 127.0.0.1 instead.
type topology struct {
	model   string
	nodes   []stack.NodeSpec
	engines []stack.EngineSpec
	rtt     map[string]map[string]float64 // node -> engine region -> ms
}

func loadTopology(path string) (*topology, error) {
	f, err := fleet.Load(path)
	if err != nil {
		return nil, err
	}
	if len(f.Weights) > 0 {
		return nil, fmt.Errorf("%s: the demo fleet must not set static weights: they would keep the optimizer from setting them", path)
	}
	t := &topology{model: f.DefaultModel, rtt: f.RTTMillis}
	for _, c := range f.Clusters {
		t.nodes = append(t.nodes, stack.NodeSpec{Name: c.Name, Region: c.Region})
	}
	for _, e := range f.Engines {
		t.engines = append(t.engines, stack.EngineSpec{Name: e.Name, Region: e.Region, Models: e.Models,
			CapacityRPS: e.CapacityRPS, Args: mockEngineArgs})
	}
	if len(t.nodes) < 2 {
		return nil, fmt.Errorf("%s: the demo needs two data-plane clusters, found %d", path, len(t.nodes))
	}
	return t, nil
}

// nodeNames lists the data-plane clusters in file order.
func (t *topology) nodeNames() []string {
	out := make([]string, len(t.nodes))
	for i, n := range t.nodes {
		out[i] = n.Name
	}
	return out
}

// engineNames lists the engines in file order.
func (t *topology) engineNames() []string {
	out := make([]string, len(t.engines))
	for i, e := range t.engines {
		out[i] = e.Name
	}
	return out
}

func (t *topology) region(engine string) string {
	i := slices.IndexFunc(t.engines, func(e stack.EngineSpec) bool { return e.Name == engine })
	if i < 0 {
		return ""
	}
	return t.engines[i].Region
}

func (t *topology) nodeRegion(node string) string {
	i := slices.IndexFunc(t.nodes, func(n stack.NodeSpec) bool { return n.Name == node })
	if i < 0 {
		return ""
	}
	return t.nodes[i].Region
}

// localCapacity is the capacity_rps of the engines in node's region.
func (t *topology) localCapacity(node string) float64 {
	sum := 0.0
	for _, e := range t.engines {
		if e.Region == t.nodeRegion(node) {
			sum += e.CapacityRPS
		}
	}
	return sum
}

func (t *topology) totalCapacity() float64 {
	sum := 0.0
	for _, e := range t.engines {
		sum += e.CapacityRPS
	}
	return sum
}

// rttFunc is the fleet's rtt_ms, which the engine fronts apply.
func (t *topology) rttFunc() stack.RTTFunc {
	return func(node, region string) time.Duration {
		return time.Duration(t.rtt[node][region] * float64(time.Millisecond))
	}
}

func (t *topology) spec(dir string, bins stack.Binaries) stack.Spec {
	return stack.Spec{Dir: dir, Bins: bins, Nodes: t.nodes, Engines: t.engines, RTTMillis: t.rtt}
}
