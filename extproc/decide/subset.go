package decide

import (
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-router/meridian/extproc/picker"
)

// restrict narrows a pick to the endpoints of subset (a GIE gateway's subset hint), keeping
// the pick's order. When none of the engines the pick examined is in the subset, the
// subset's own engines follow, in an order fixed by the key (so a prefix keeps its engine
// within the subset too), without those at their in-flight cap unless all are. It reports false when no
// engine of the subset is in the table: the protocol's 503. AtLimit is recomputed over the
// engines kept.
func restrict(t *picker.Table, key uint64, res picker.Result, subset []string) (picker.Result, bool) {
	in := func(i int) bool { return slices.Contains(subset, t.Endpoint(i).Address) }
	kept := res.Order[:0]
	for _, i := range res.Order {
		if in(i) {
			kept = append(kept, i)
		}
	}
	if len(kept) == 0 {
		for _, a := range subset {
			// Overflow endpoints come only through the picker's overflow gate.
			if i, ok := t.Lookup(a); ok && i < t.Len() && !slices.Contains(kept, i) {
				kept = append(kept, i)
			}
		}
		if len(kept) == 0 {
			return res, false
		}
		rank := func(i int) uint64 { return xxhash.Sum64String(t.Endpoint(i).Address) ^ key*0x9e3779b97f4a7c15 }
		slices.SortFunc(kept, func(a, b int) int {
			if ca, cb := atCap(t, a), atCap(t, b); ca != cb {
				if ca {
					return 1
				}
				return -1
			}
			ra, rb := rank(a), rank(b)
			switch {
			case ra < rb:
				return -1
			case ra > rb:
				return 1
			}
			return 0
		})
		res.Spilled = false
		if !atCap(t, kept[0]) { // like Pick's order: no engine at its cap unless all are
			kept = slices.DeleteFunc(kept, func(i int) bool { return atCap(t, i) })
		}
	}
	res.Order = kept
	res.Overflowed = kept[0] >= t.Len()
	res.AtLimit = true
	for _, i := range kept {
		res.AtLimit = res.AtLimit && atCap(t, i)
	}
	return res, true
}

// atCap reports whether engine i of t is at its in-flight cap.
func atCap(t *picker.Table, i int) bool {
	limit, ok := t.Limit(i)
	return ok && t.InFlight(i) >= limit
}
