package picker

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// moveCase changes one endpoint of a fleet and says how.
type moveCase struct {
	name   string
	change func([]Endpoint) []Endpoint
}

// moveCases change endpoint 0, or several endpoints, in the ways a control loop and
// the local guards do.
var moveCases = []moveCase{
	{"weight x1.1", scaleFirst(1.1)},
	{"weight x1.5", scaleFirst(1.5)},
	{"weight x3", scaleFirst(3)},
	{"penalty x0.9", scaleFirst(0.9)},
	{"penalty x0.5", scaleFirst(0.5)},
	{"penalty x0.1", scaleFirst(0.1)},
	{"remove", scaleFirst(0)},
	{"tenth x1.5", scaleEvery(10, 1.5)},
	{"half x2", scaleEvery(2, 2)},
	{"add", func(eps []Endpoint) []Endpoint {
		extra := Endpoint{Address: "10.255.255.255:8000", Weight: eps[0].Weight}
		return append(append([]Endpoint(nil), eps...), extra)
	}},
}

func scaleFirst(f float64) func([]Endpoint) []Endpoint {
	return func(eps []Endpoint) []Endpoint {
		out := append([]Endpoint(nil), eps...)
		out[0].Weight *= f
		return out
	}
}

// shareDelta is the total variation distance between the two weight-share vectors,
// ½ Σ |Δshare|: the fraction of keys that must move at the very least. When one
// endpoint changes it equals that endpoint's share change δ.
func shareDelta(before, after []Endpoint) float64 {
	share := func(eps []Endpoint) map[string]float64 {
		m, sum := map[string]float64{}, 0.0
		for _, ep := range eps {
			sum += ep.Weight
		}
		for _, ep := range eps {
			m[ep.Address] += ep.Weight / sum
		}
		return m
	}
	b, a := share(before), share(after)
	d := 0.0
	for addr := range a {
		d += math.Abs(a[addr] - b[addr])
	}
	for addr := range b {
		if _, ok := a[addr]; !ok {
			d += b[addr]
		}
	}
	return d / 2
}

// movedFraction is the fraction of keys whose primary differs between two tables.
func movedFraction(a, b *Table, ks []uint64) float64 {
	pa, pb := primaries(a, ks), primaries(b, ks)
	moved := 0
	for i := range pa {
		if pa[i] != pb[i] {
			moved++
		}
	}
	return float64(moved) / float64(len(ks))
}

// When one endpoint's share changes by δ, at most δ + 2 points of the keys may change
// primary (weighted rendezvous moves exactly the keys that must move, so about δ).
// The same holds with δ the total variation distance when several weights change at
// once. The lower bound proves the table follows the weights at all.
func TestKeyMovementIsMinimal(t *testing.T) {
	ks := keys(200_000, 11)
	for _, fl := range []struct {
		name string
		eps  []Endpoint
	}{
		{"equal-4", fleet(4, equal)},
		{"equal-16", fleet(16, equal)},
		{"skewed-16", fleet(16, skewed)},
		{"skewed-200", fleet(200, skewed)},
	} {
		base := mustTable(t, testConfig(), fl.eps, NewLoads())
		for _, mc := range moveCases {
			t.Run(fl.name+"/"+mc.name, func(t *testing.T) {
				changed := mc.change(fl.eps)
				next := mustTable(t, testConfig(), changed, NewLoads())
				delta := shareDelta(fl.eps, changed)
				moved := movedFraction(base, next, ks)
				t.Logf("δ = %.4f, moved = %.4f", delta, moved)
				if moved > delta+0.02 || moved < delta-0.02 {
					t.Errorf("share changed by δ = %.4f but %.4f of keys moved, want within δ ± 0.02", delta, moved)
				}
			})
		}
	}
}

// BenchmarkKeyMovement measures, at the sidecar's default table size, the fraction of
// 2^20 keys whose primary moves for each change, next to the least possible (δ, the
// total variation distance between the share vectors). ns/op is two table builds.
// Run with -benchtime 1x.
func BenchmarkKeyMovement(b *testing.B) {
	ks := keys(1<<20, 13)
	for _, n := range benchSizes {
		eps := fleet(n, skewed)
		for _, mc := range moveCases {
			b.Run(fmt.Sprintf("endpoints=%d/%s", n, strings.ReplaceAll(mc.name, " ", "_")), func(b *testing.B) {
				var moved float64
				for b.Loop() {
					base := mustTable(b, DefaultConfig(), eps, NewLoads())
					next := mustTable(b, DefaultConfig(), mc.change(eps), NewLoads())
					moved = movedFraction(base, next, ks)
				}
				b.ReportMetric(100*shareDelta(eps, mc.change(eps)), "delta-%")
				b.ReportMetric(100*moved, "moved-%")
			})
		}
	}
}

// scaleEvery scales the weight of every k-th endpoint by f.
func scaleEvery(k int, f float64) func([]Endpoint) []Endpoint {
	return func(eps []Endpoint) []Endpoint {
		out := slices.Clone(eps)
		for i := 0; i < len(out); i += k {
			out[i].Weight *= f
		}
		return out
	}
}
