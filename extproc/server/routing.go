package server

import (
	"math"
	"sort"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-router/meridian/envoy/resources"
	"github.com/meridian-router/meridian/extproc/xdsclient"
)

// routing is one immutable snapshot of what the sidecar routes on.
type routing struct {
	version string
	models  map[string]*modelRoute
}

type modelRoute struct {
	name      string
	cluster   string
	endpoints []resources.Endpoint // routable (not draining), weight >= 1
	chooser   chooser
}

// chooser orders a model's endpoints (indices into modelRoute.endpoints) for one prefix key,
// most preferred first. Implementations are immutable and safe for concurrent use.
type chooser interface {
	Order(key uint64, dst []int) []int
}

func newRouting(v *xdsclient.View) *routing {
	r := &routing{version: v.Version, models: make(map[string]*modelRoute, len(v.Models))}
	for name, m := range v.Models {
		var eps []resources.Endpoint
		for _, e := range m.Endpoints {
			if !e.Draining && e.Weight > 0 {
				eps = append(eps, e)
			}
		}
		r.models[name] = &modelRoute{name: name, cluster: m.Cluster, endpoints: eps, chooser: newRendezvous(eps)}
	}
	return r
}

// rendezvous is weighted rendezvous hashing over all endpoints: O(n log n) per pick.
type rendezvous struct {
	seeds   []uint64
	weights []float64
}

func newRendezvous(eps []resources.Endpoint) *rendezvous {
	r := &rendezvous{seeds: make([]uint64, len(eps)), weights: make([]float64, len(eps))}
	for i, e := range eps {
		r.seeds[i] = xxhash.Sum64String(e.Address)
		r.weights[i] = float64(e.Weight)
	}
	return r
}

func (r *rendezvous) Order(key uint64, dst []int) []int {
	scores := make([]float64, len(r.seeds))
	for i, s := range r.seeds {
		u := (float64(mix(key^s)>>11) + 0.5) / (1 << 53)
		scores[i] = -math.Log(u) / r.weights[i]
		dst = append(dst, i)
	}
	sort.SliceStable(dst, func(a, b int) bool { return scores[dst[a]] < scores[dst[b]] })
	return dst
}

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
