package picker

import (
	"slices"
	"testing"
)

// TestRankingsShareTheTableNewTableBuilds: a table built with a Rankings picks exactly as
// one NewTable builds, whether its ranking was computed or remembered, and the cores that
// share a Rankings rank each set of endpoints once.
func TestRankingsShareTheTableNewTableBuilds(t *testing.T) {
	cfg := testConfig()
	memo := &Rankings{}
	ks := keys(20_000, 7)
	for _, eps := range [][]Endpoint{fleet(12, equal), fleet(12, skewed), fleet(5, equal)} {
		want := mustTable(t, cfg, eps, NewLoads())
		first, err := memo.NewTable(cfg, eps, NewLoads())
		if err != nil {
			t.Fatal(err)
		}
		// The same endpoints in another order, on another process's counters.
		shuffled := slices.Clone(eps)
		slices.Reverse(shuffled)
		again, err := memo.NewTable(cfg, shuffled, NewLoads())
		if err != nil {
			t.Fatal(err)
		}
		if &first.slots[0] != &again.slots[0] {
			t.Errorf("%d endpoints: the second table ranked its endpoints again", len(eps))
		}
		for _, tb := range []*Table{first, again} {
			if !slices.Equal(tb.slots, want.slots) {
				t.Fatalf("%d endpoints: ranking differs from NewTable's", len(eps))
			}
			for _, k := range ks[:1000] {
				got, exp := tb.Pick(k, 1, 1, nil), want.Pick(k, 1, 1, nil)
				if !slices.Equal(got.Order, exp.Order) {
					t.Fatalf("key %x: order %v, NewTable's %v", k, got.Order, exp.Order)
				}
			}
		}
	}
	// A weight that moves is a new ranking, not the remembered one.
	eps := fleet(12, equal)
	before, _ := memo.NewTable(cfg, eps, NewLoads())
	eps[3].Weight = 2
	after, _ := memo.NewTable(cfg, eps, NewLoads())
	if slices.Equal(before.slots, after.slots) {
		t.Fatal("a changed weight kept the old ranking")
	}
	if want := mustTable(t, cfg, eps, NewLoads()); !slices.Equal(after.slots, want.slots) {
		t.Fatal("ranking after a weight change differs from NewTable's")
	}
	// A nil Rankings ranks every table itself.
	var none *Rankings
	if tb, err := none.NewTable(cfg, eps, NewLoads()); err != nil || !slices.Equal(tb.slots, after.slots) {
		t.Fatalf("nil Rankings: %v", err)
	}
}
