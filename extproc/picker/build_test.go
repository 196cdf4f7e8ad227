package picker

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"testing"
)

// rankingCases are endpoint sets whose rankings are pinned by TestRankingFormatIsStable:
// few endpoints (every bucket ranks them all) with equal and very unequal weights, where
// the build runs many rounds, and larger fleets.
var rankingCases = []struct {
	name       string
	candidates int
	weights    []float64
	digest     uint64
}{
	{"one", 4, []float64{1}, 0x8f6955bf94ec2325},
	{"two", 4, []float64{1, 1}, 0x63c117008ca6bc20},
	{"three-unequal", 4, []float64{1, 0.01, 0.5}, 0x11a82f3438a54891},
	{"four", 4, []float64{100, 100, 100, 100}, 0x1b2809bd8c27a5f0},
	{"four-one-at-0.5", 4, []float64{50, 100, 100, 100}, 0xdef3d385cb47ff49},
	{"four-one-at-0.05", 4, []float64{5, 100, 100, 100}, 0xf33ca32e420e3bbb},
	{"four-two-penalized", 4, []float64{5, 20, 100, 100}, 0xbba2f76225a0ebc2},
	{"four-of-two-candidates", 2, []float64{5, 100, 100, 100}, 0xac47ddea6046fda0},
	{"eight-skewed", 4, []float64{1, 2, 3, 4, 5, 6, 7, 0.05}, 0xe98f7cd55709d492},
	{"sixteen-skewed", 8, []float64{1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 0.05}, 0xb5ff31b12d46f281},
}

// The ranking is part of the wire format between sidecars: every sidecar, whatever its
// version, must rank a key the same for the same endpoints and weights, or prefix affinity
// splits during a rolling upgrade. This pins the exact candidate lists of a set of tables;
// a change that re-ranks keys must change seedDomain and these digests together.
func TestRankingFormatIsStable(t *testing.T) {
	for _, tc := range rankingCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Buckets = 1 << 14
			cfg.Candidates = tc.candidates
			eps := make([]Endpoint, len(tc.weights))
			for i, w := range tc.weights {
				eps[i] = Endpoint{Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Weight: w}
			}
			tb := mustTable(t, cfg, eps, NewLoads())
			h := fnv.New64a()
			var b [2]byte
			for _, s := range tb.slots {
				binary.LittleEndian.PutUint16(b[:], s)
				h.Write(b[:])
			}
			if got := h.Sum64(); got != tc.digest {
				t.Errorf("ranking digest %#x, want %#x", got, tc.digest)
			}
		})
	}
}

// BenchmarkNewTableFewEndpoints is a rebuild of a small fleet's table at the default size
// as one engine's penalty factor falls: with no more endpoints than candidates every
// bucket ranks every endpoint, so the low weight sets how far the streams are drawn.
func BenchmarkNewTableFewEndpoints(b *testing.B) {
	for _, f := range []float64{1, 0.5, 0.2, 0.05} {
		b.Run(fmt.Sprintf("endpoints=4/factor=%v", f), func(b *testing.B) {
			eps := make([]Endpoint, 4)
			for i := range eps {
				eps[i] = Endpoint{Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Weight: 100}
			}
			eps[0].Weight *= f
			loads := NewLoads()
			for b.Loop() {
				if _, err := NewTable(DefaultConfig(), eps, loads); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
