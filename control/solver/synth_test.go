package solver

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// synthFleet describes a synthetic multi-region fleet for tests and
// benchmarks: clusters and engines spread round-robin over regions on a ring,
// RTT growing with ring distance, engines of mixed size and speed, and demand
// skewed so that the first region is hot and must spill to its neighbours.
type synthFleet struct {
	clusters, engines, models int
	regions                   int
	utilization               float64 // total demand / Σ RhoMax·capacity
	seed                      uint64
}

func (f synthFleet) problem() *Problem {
	rng := rand.New(rand.NewPCG(f.seed, 42))
	params := DefaultParams()
	p := &Problem{Params: params}
	for m := range f.models {
		p.Models = append(p.Models, fmt.Sprintf("model-%d", m))
	}
	totalCap := 0.0
	for e := range f.engines {
		eng := Engine{
			Name:     fmt.Sprintf("engine-%04d", e),
			Models:   []int{e % f.models},
			Capacity: 20 + 40*rng.Float64(),
			Healthy:  true,
			Curve:    Curve{Base: 0.08 + 0.07*rng.Float64(), Queue: 0.05 + 0.1*rng.Float64()},
		}
		totalCap += eng.Capacity * params.RhoMax
		p.Engines = append(p.Engines, eng)
	}
	weights := make([]float64, f.clusters)
	sum := 0.0
	for c := range f.clusters {
		p.Clusters = append(p.Clusters, fmt.Sprintf("cluster-%03d", c))
		weights[c] = 0.3 + 0.7*rng.Float64()
		if c%f.regions == 0 {
			weights[c] *= 3 // the hot region
		}
		sum += weights[c]
		row := make([]float64, f.engines)
		for e := range row {
			row[e] = f.regionRTT(c%f.regions, e%f.regions) + 0.004*rng.Float64()
		}
		p.RTT = append(p.RTT, row)
	}
	for c := range f.clusters {
		row := make([]float64, f.models)
		for m := range row {
			row[m] = f.utilization * totalCap * weights[c] / sum / float64(f.models)
		}
		p.Demand = append(p.Demand, row)
	}
	return p
}

// regionRTT is 1 ms inside a region and 10–110 ms across, by ring distance.
func (f synthFleet) regionRTT(a, b int) float64 {
	if a == b {
		return 0.001
	}
	d := min((a-b+f.regions)%f.regions, (b-a+f.regions)%f.regions)
	return 0.01 + 0.1*float64(d)/math.Max(1, float64(f.regions/2))
}

// perturbed returns a copy of p with each demand scaled by a factor in
// [1−spread, 1+spread]: the next period's problem.
func perturbed(p *Problem, spread float64, seed uint64) *Problem {
	rng := rand.New(rand.NewPCG(seed, 7))
	q := *p
	q.Demand = make([][]float64, len(p.Demand))
	for c, row := range p.Demand {
		q.Demand[c] = make([]float64, len(row))
		for m, d := range row {
			q.Demand[c][m] = d * (1 - spread + 2*spread*rng.Float64())
		}
	}
	return &q
}

func benchFleet(clusters, engines int) synthFleet {
	return synthFleet{clusters: clusters, engines: engines, models: 1, regions: min(8, clusters),
		utilization: 0.7, seed: uint64(clusters*100000 + engines)}
}
