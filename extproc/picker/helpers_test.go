package picker

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// fleet returns n endpoints with addresses 10.x.y.z:8000 and the given weights.
func fleet(n int, weight func(i int) float64) []Endpoint {
	eps := make([]Endpoint, n)
	for i := range eps {
		eps[i] = Endpoint{
			Address: fmt.Sprintf("10.%d.%d.%d:8000", i>>16&0xff, i>>8&0xff, i&0xff),
			Engine:  fmt.Sprintf("engine-%d", i),
			Weight:  weight(i),
		}
	}
	return eps
}

func equal(int) float64 { return 1 }

// skewed gives weights 1..7 cyclically, so shares differ up to sevenfold.
func skewed(i int) float64 { return float64(1 + i%7) }

// keys returns n pseudo-random prefix keys, the same on every run.
func keys(n int, seed uint64) []uint64 {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	out := make([]uint64, n)
	for i := range out {
		out[i] = r.Uint64()
	}
	return out
}

// testConfig is DefaultConfig with fewer buckets, so tests build tables fast.
func testConfig() Config {
	c := DefaultConfig()
	c.Buckets = 1 << 16
	return c
}

func mustTable(t testing.TB, cfg Config, eps []Endpoint, loads *Loads) *Table {
	t.Helper()
	tb, err := NewTable(cfg, eps, loads)
	if err != nil {
		t.Fatalf("NewTable: %v", err)
	}
	return tb
}

// primaryShares returns the fraction of keys whose primary is each address, with no
// load on the table.
func primaryShares(tb *Table, ks []uint64) map[string]float64 {
	out := make(map[string]float64)
	dst := make([]int, 0, tb.cfg.Choices)
	for _, k := range ks {
		r := tb.Pick(k, 1, 1, dst)
		out[tb.Endpoint(r.Order[0]).Address]++
	}
	for a := range out {
		out[a] /= float64(len(ks))
	}
	return out
}

// primaries returns the primary address of every key.
func primaries(tb *Table, ks []uint64) []string {
	out := make([]string, len(ks))
	dst := make([]int, 0, tb.cfg.Choices)
	for i, k := range ks {
		out[i] = tb.Endpoint(tb.Pick(k, 1, 1, dst).Order[0]).Address
	}
	return out
}
