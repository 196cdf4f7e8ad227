package xds

import (
	"fmt"
	"sort"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/envoy/resources"
)

// Plan is what every node should hold: for each node (data-plane cluster) and model, the
// weighted engines that node may send that model's traffic to.
type Plan struct {
	Models       []string
	DefaultModel string
	// Assignments[node][model] lists the engines with weight >= 1.
	Assignments map[string]map[string][]resources.Endpoint
}

// WeightFunc returns the EDS weights one node should use for one model, by engine name.
// Engines that are absent or weighted 0 are left out of that node's assignment.
type WeightFunc func(node, model string) map[string]uint32

// StaticWeights uses the fleet file's weights section, and for clusters without one, weights
// proportional to capacity over every engine serving the model.
func StaticWeights(f *fleet.Fleet) WeightFunc {
	return func(node, model string) map[string]uint32 {
		if w, ok := f.Weights[node]; ok {
			return w
		}
		return CapacityWeights(f, model)
	}
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
	p := &Plan{DefaultModel: f.DefaultModel, Assignments: map[string]map[string][]resources.Endpoint{}}
	for _, m := range f.Models {
		p.Models = append(p.Models, m.Name)
	}
	for _, c := range f.Clusters {
		perModel := map[string][]resources.Endpoint{}
		for _, m := range p.Models {
			w := weights(c.Name, m)
			for _, e := range f.Engines {
				if !e.Serves(m) || w[e.Name] == 0 {
					continue
				}
				perModel[m] = append(perModel[m], resources.Endpoint{
					Engine: e.Name, Region: e.Region, Address: e.Address, Weight: w[e.Name], Draining: e.Draining, MaxInFlight: e.MaxInFlight,
				})
			}
			for name := range w {
				if _, ok := f.Engine(name); !ok {
					return nil, fmt.Errorf("weights for node %s, model %s: unknown engine %q", c.Name, m, name)
				}
			}
			sort.Slice(perModel[m], func(i, j int) bool { return perModel[m][i].Engine < perModel[m][j].Engine })
		}
		p.Assignments[c.Name] = perModel
	}
	return p, nil
}
