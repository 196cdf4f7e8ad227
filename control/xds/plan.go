package xds

import (
	"fmt"
	"sort"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/xdsapi"
)

// Plan is what every node should hold: for each node (data-plane cluster) and model, the
// weighted engines that node may send that model's traffic to.
type Plan struct {
	Models       []string
	DefaultModel string
	// Assignments[node][model] lists the engines with weight >= 1.
	Assignments map[string]map[string][]xdsapi.Endpoint
}

// WeightFunc returns the EDS weights one node should use for one model, by engine name.
// Engines absent from the map are left out of that node's assignment. Engines present
// with weight 0 get no share of the traffic but stay in the assignment at failover
// priority 1 (weight 1), so the sidecar can list them as retry targets.
type WeightFunc func(node, model string) map[string]uint32

// StaticWeights uses the fleet file's weights section (where 0 leaves an engine out), and
// for clusters without one, weights proportional to capacity over every engine serving the
// model.
func StaticWeights(f *fleet.Fleet) WeightFunc {
	return func(node, model string) map[string]uint32 {
		if w, ok := f.Weights[node]; ok {
			return positive(w)
		}
		return CapacityWeights(f, model)
	}
}

// SolvedWeights takes the fleet file's weights where it gives them, else the solved
// weights[node][model] (the optimizer's Result.Weights), else (no solution for that flow
// yet) capacity-proportional ones.
func SolvedWeights(f *fleet.Fleet, weights map[string]map[string]map[string]uint32) WeightFunc {
	return func(node, model string) map[string]uint32 {
		if w, ok := f.Weights[node]; ok {
			return w
		}
		if w := weights[node][model]; len(w) > 0 {
			return w
		}
		return CapacityWeights(f, model)
	}
}

// positive drops the zero entries: in the fleet file, 0 means "leave out".
func positive(w map[string]uint32) map[string]uint32 {
	out := make(map[string]uint32, len(w))
	for k, v := range w {
		if v > 0 {
			out[k] = v
		}
	}
	return out
}

// CapacityWeights weights every engine serving model by its capacity, scaled so the largest
// is 1000.
func CapacityWeights(f *fleet.Fleet, model string) map[string]uint32 {
	maxCap := 0.0
	for _, e := range f.Engines {
		if e.Serves(model) && e.CapacityRPS > maxCap {
			maxCap = e.CapacityRPS
		}
	}
	out := map[string]uint32{}
	for _, e := range f.Engines {
		if e.Serves(model) {
			out[e.Name] = max(1, uint32(1000*e.CapacityRPS/maxCap+0.5))
		}
	}
	return out
}

// BuildPlan combines the fleet with weights into a plan.
func BuildPlan(f *fleet.Fleet, weights WeightFunc) (*Plan, error) {
	p := &Plan{DefaultModel: f.DefaultModel, Assignments: map[string]map[string][]xdsapi.Endpoint{}}
	for _, m := range f.Models {
		p.Models = append(p.Models, m.Name)
	}
	for _, c := range f.Clusters {
		perModel := map[string][]xdsapi.Endpoint{}
		for _, m := range p.Models {
			w := weights(c.Name, m)
			for _, e := range f.Engines {
				weight, listed := w[e.Name]
				if !e.Serves(m) || !listed {
					continue
				}
				ep := xdsapi.Endpoint{
					Engine: e.Name, Region: e.Region, Address: e.Address, Weight: weight, Draining: e.Draining, MaxInFlight: e.MaxInFlight,
					RTTMillis: f.RTTMillis[c.Name][e.Region], MetricsURL: e.MetricsURL,
				}
				if weight == 0 {
					ep.Weight, ep.Priority = 1, 1
				}
				perModel[m] = append(perModel[m], ep)
			}
			for name := range w {
				if _, ok := f.Engine(name); !ok {
					return nil, fmt.Errorf("weights for node %s, model %s: unknown engine %q", c.Name, m, name)
				}
			}
			promoteIfNoShare(perModel[m])
			sort.Slice(perModel[m], func(i, j int) bool { return perModel[m][i].Engine < perModel[m][j].Engine })
		}
		p.Assignments[c.Name] = perModel
	}
	return p, nil
}

// promoteIfNoShare puts failover engines back at priority 0 (weight 1 each) when no engine
// has a share: an assignment must carry its traffic somewhere, and evenly is the least wrong.
func promoteIfNoShare(eps []xdsapi.Endpoint) {
	for _, e := range eps {
		if e.Priority == 0 {
			return
		}
	}
	for i := range eps {
		eps[i].Priority = 0
	}
}
