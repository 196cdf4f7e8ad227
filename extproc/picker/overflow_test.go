package picker

import (
	"slices"
	"testing"
)

// overflowFleet is two ranked engines and two overflow engines (the far one listed
// first: the caller's order, not the address order, breaks ties), every KV cache 100,000
// tokens, so the default OverflowAt (0.2) puts the threshold at 20,000.
func overflowFleet(t *testing.T, loads *Loads) *Table {
	t.Helper()
	eps := append(fleet(2, equal),
		Endpoint{Address: "10.1.0.9:8000", Engine: "far", Overflow: true},
		Endpoint{Address: "10.1.0.2:8000", Engine: "near", Weight: 5, Overflow: true})
	tb := mustTable(t, testConfig(), eps, loads)
	for i := range tb.Len() + tb.Overflows() {
		loads.SetKVWritten(tb.Endpoint(i).Address, 0, 100_000)
	}
	return tb
}

func TestOverflowTakesWhatTheEngineWouldQueue(t *testing.T) {
	const key, work = 0xfeed, 2_000
	loads := NewLoads()
	tb := overflowFleet(t, loads)
	if tb.Len() != 2 || tb.Overflows() != 2 {
		t.Fatalf("Len %d, Overflows %d: want 2 ranked and 2 overflow endpoints", tb.Len(), tb.Overflows())
	}
	far, near := tb.Len(), tb.Len()+1
	if tb.Endpoint(far).Engine != "far" || tb.Endpoint(near).Engine != "near" {
		t.Fatalf("overflow endpoints %q, %q: want them in the order given", tb.Endpoint(far).Engine, tb.Endpoint(near).Engine)
	}
	// observe sets what others hold on every ranked engine and on both overflow engines.
	observe := func(ranked, overflow int64) {
		for i := range tb.Len() + tb.Overflows() {
			w := overflow
			if i < tb.Len() {
				w = ranked
			}
			loads.SetObserved(tb.Endpoint(i).Address, w)
		}
	}
	observe(17_000, 0)
	r := tb.Pick(key, work, 0, nil)
	if r.Overflowed || r.Order[0] >= tb.Len() {
		t.Fatalf("19,000 of 20,000 after the request: order %v overflowed %v, want a ranked primary", r.Order, r.Overflowed)
	}
	primary := r.Order[0]
	// Past the threshold on both ranked engines: the overflow engines, equally empty, take
	// it, the first listed winning the tie, and the ranked ones follow as fallbacks.
	observe(30_000, 0)
	r = tb.Pick(key, work, 0, nil)
	if !r.Overflowed || !r.Spilled || r.Order[0] != far {
		t.Fatalf("ranked engines at 32,000: order %v overflowed %v, want the far overflow engine %d first", r.Order, r.Overflowed, far)
	}
	// The list holds at most Fallbacks+1 (4): both ranked engines follow, in the key's order.
	if !slices.Equal(r.Order[1:], []int{primary, 1 - primary}) {
		t.Errorf("fallbacks %v: want the ranked engines, %d first", r.Order[1:], primary)
	}
	if n := testing.AllocsPerRun(100, func() { r = tb.Pick(key, work, 0, r.Order[:0]) }); n != 0 {
		t.Errorf("an overflowing Pick allocates %v times with room in dst", n)
	}
	// The emptier overflow engine wins.
	loads.SetObserved(tb.Endpoint(far).Address, 5_000)
	if r = tb.Pick(key, work, 0, nil); r.Order[0] != near {
		t.Errorf("far engine holding 5,000: primary %d, want the near one %d", r.Order[0], near)
	}
	// The gate is the primary's: an overflow engine past its own threshold still takes the
	// request while it would hold less than the primary (21,000 + the request's work
	// against 32,000), and not once it would hold more (31,000 + 2,000).
	observe(30_000, 19_000)
	if r = tb.Pick(key, work, 0, nil); !r.Overflowed {
		t.Errorf("overflow engines at 21,000 after the request, the primary at 32,000: order %v, want overflow", r.Order)
	}
	observe(30_000, 29_000)
	if r = tb.Pick(key, work, 0, nil); r.Overflowed {
		t.Errorf("overflow engines at 33,000 with the charge, the primary at 32,000: order %v, want no overflow", r.Order)
	}
	// An overflow engine whose cache size is unknown (its scrape failed) takes nothing: it
	// would look empty.
	observe(30_000, 0)
	for _, i := range []int{far, near} {
		loads.SetKVWritten(tb.Endpoint(i).Address, 0, 0)
	}
	if r = tb.Pick(key, work, 0, nil); r.Overflowed {
		t.Errorf("overflow engines' caches unknown: order %v, want no overflow", r.Order)
	}
	for _, i := range []int{far, near} {
		loads.SetKVWritten(tb.Endpoint(i).Address, 0, 100_000)
	}
	// An overflow engine caches none of the prompt: even for a key with no home it is
	// charged the request's work again. Ranked engines at 21,000 after the request, an
	// overflow engine at 19,500: 1,500 less, but 500 more with the charge.
	observe(19_000, 17_500)
	if r = tb.Pick(key, work, 0, nil); r.Overflowed {
		t.Errorf("overflow engines 1,500 below the primary, less than the request's work: order %v, want no overflow", r.Order)
	}
	observe(30_000, 0)
	// A key at home on the primary: an overflow engine is charged the move, and the key
	// stays unless the move still leaves it below the primary's work.
	if r = tb.PickHome(key, work, 40_000, primary, nil); r.Overflowed {
		t.Errorf("home holding 32,000, move 40,000: order %v, want the key to stay", r.Order)
	}
	if r = tb.PickHome(key, work, 20_000, primary, nil); !r.Overflowed {
		t.Errorf("home holding 32,000, move 20,000: order %v, want overflow", r.Order)
	}
	// A key at home on an overflow engine goes back there uncharged.
	loads.SetObserved(tb.Endpoint(near).Address, 10_000)
	if r = tb.PickHome(key, work, 40_000, near, nil); r.Order[0] != near {
		t.Errorf("key at home on the near overflow engine (10,000): order %v, want it first", r.Order)
	}
	// Its home past its own threshold still takes the key while it holds less than the
	// primary: the key's context is there.
	loads.SetObserved(tb.Endpoint(near).Address, 19_000)
	if r = tb.PickHome(key, work, 35_000, near, nil); r.Order[0] != near {
		t.Errorf("home (near) at 21,000 with the request, move 35,000: order %v, want the near engine %d", r.Order, near)
	}
	// Its home fuller than the primary, the key's context is on neither the ranked primary
	// nor the far engine: both pay the move, and the emptier far engine takes it (were the
	// primary not charged, 32,000 against the far engine's 2,000 + 35,000 would keep it).
	loads.SetObserved(tb.Endpoint(near).Address, 40_000)
	if r = tb.PickHome(key, work, 35_000, near, nil); r.Order[0] != far {
		t.Errorf("home (near) at 42,000, move 35,000: order %v, want the far engine %d", r.Order, far)
	}
	// An overflow engine at its hard cap is never picked.
	capped := testConfig()
	capped.MaxInFlight = 1
	observe(30_000, 0)
	tc := mustTable(t, capped, []Endpoint{tb.Endpoint(0), tb.Endpoint(1), tb.Endpoint(far), tb.Endpoint(near)}, loads)
	tkt := tc.Start(tc.Len(), 1)
	tkt2 := tc.Start(tc.Len()+1, 1)
	if r = tc.Pick(key, work, 0, nil); r.Overflowed {
		t.Errorf("overflow engines at their cap: order %v, want none of them", r.Order)
	}
	tkt.Done()
	tkt2.Done()
}

// Every ranked engine at its hard cap: an overflow engine with room takes the request
// instead of the caller shedding it. Requests sent there count in the loads' total but
// not in the ranked engines' utilization or bounded loads' denominator.
func TestOverflowWhenTheRankedEnginesAreCapped(t *testing.T) {
	const key = 0xfeed
	loads := NewLoads()
	tb := overflowFleet(t, loads)
	cfg := testConfig()
	cfg.MaxInFlight = 1
	eps := []Endpoint{tb.Endpoint(0), tb.Endpoint(1), tb.Endpoint(2), tb.Endpoint(3)}
	tc := mustTable(t, cfg, eps, loads)
	a, b := tc.Start(0, 1_000), tc.Start(1, 1_000)
	if u, _ := tc.Utilization(); u != 1 {
		t.Fatalf("both ranked engines at their cap of 1: utilization %v, want 1", u)
	}
	r := tc.Pick(key, 2_000, 0, nil)
	if r.AtLimit || !r.Overflowed || len(r.Order) != 1 || r.Order[0] < tc.Len() {
		t.Fatalf("ranked engines capped, overflow engines idle: %+v, want one overflow engine and no AtLimit", r)
	}
	o := tc.Start(r.Order[0], 2_000)
	a.Done()
	b.Done()
	if u, _ := tc.Utilization(); u != 0 || loads.Total() != 1 || loads.TotalWork() != 2_000 {
		t.Errorf("one request on an overflow engine: utilization %v (want 0), total %d (want 1), work %d (want 2000)",
			u, loads.Total(), loads.TotalWork())
	}
	o.Done()
	if loads.Total() != 0 || loads.TotalWork() != 0 {
		t.Errorf("after Done: total %d, work %d", loads.Total(), loads.TotalWork())
	}
}

// Overflow needs what it compares: a known KV cache on the primary, overflow endpoints, a
// non-zero OverflowAt and a ranked endpoint to overflow from.
func TestOverflowNeedsItsInputs(t *testing.T) {
	const key = 0xfeed
	loads := NewLoads()
	tb := overflowFleet(t, loads)
	for i := range tb.Len() {
		loads.SetObserved(tb.Endpoint(i).Address, 30_000)
	}
	primary := tb.Pick(key, 2_000, 0, nil).Order[1]
	loads.SetKVWritten(tb.Endpoint(primary).Address, 0, 0) // the primary states no cache
	if r := tb.Pick(key, 2_000, 0, nil); r.Overflowed {
		t.Errorf("primary with an unknown KV cache: order %v, want no overflow", r.Order)
	}
	loads.SetKVWritten(tb.Endpoint(primary).Address, 0, 100_000)
	off := testConfig()
	off.OverflowAt = 0
	eps := []Endpoint{tb.Endpoint(0), tb.Endpoint(1), tb.Endpoint(2), tb.Endpoint(3)}
	if to := mustTable(t, off, eps, loads); to.Overflows() != 0 || to.Pick(key, 2_000, 0, nil).Overflowed {
		t.Errorf("OverflowAt 0: %d overflow endpoints kept, want none", to.Overflows())
	}
	if to := mustTable(t, testConfig(), eps[2:], loads); to.Len() != 0 || to.Overflows() != 0 || len(to.Pick(key, 1, 0, nil).Order) != 0 {
		t.Errorf("only overflow endpoints: Len %d Overflows %d, want an empty table", to.Len(), to.Overflows())
	}
	bad := testConfig()
	bad.OverflowAt = -1
	if bad.Validate() == nil {
		t.Error("OverflowAt -1 validated")
	}
}

// A key whose previous request overflowed is at home on that overflow endpoint: it goes
// back there while the home's cache has room for the prompt, however little its ranked
// engines hold, and no other overflow endpoint is weighed for it then.
func TestOverflowHomeWithRoomKeepsItsKey(t *testing.T) {
	const key, work, prompt = 0xfeed, 2_000, 1_500
	loads := NewLoads()
	tb := overflowFleet(t, loads)
	far, near := tb.Len(), tb.Len()+1
	// observe records a scrape of every engine, each cache 100,000 tokens: what the
	// running requests hold of it, and the work other routers hold there.
	observe := func(nearHeld, nearWork int64) {
		for i := range tb.Len() + tb.Overflows() {
			held, w := int64(0), int64(5_000) // 7,000 with the request: below the 20,000 threshold
			switch i {
			case near:
				held, w = nearHeld, nearWork
			case far:
				w = 0
			}
			observeKV(loads, tb, i, held, 100_000)
			loads.SetObserved(tb.Endpoint(i).Address, w)
		}
	}
	ask := func(home int) Result {
		return tb.PickFor(&Ask{Key: key, Work: work, Move: 16 * prompt, Home: home, Prompt: prompt}, nil)
	}
	observe(0, 10_000)
	if r := ask(near); !r.Overflowed || r.Order[0] != near {
		t.Fatalf("home (near) with room at 12,000 against the primary's 7,000 + the move: order %v, want the near engine %d first", r.Order, near)
	}
	// Without a prompt to check room for, the gate is the primary's, as for any key.
	if r := tb.PickHome(key, work, 16*prompt, near, nil); r.Overflowed {
		t.Errorf("no prompt stated: order %v, want the ranked primary", r.Order)
	}
	// The home without room for the prompt: the key returns to its ranked engines.
	observe(99_000, 10_000)
	if r := ask(near); r.Overflowed {
		t.Errorf("home (near) without room: order %v, want the ranked primary", r.Order)
	}
	// With room but holding more than the primary would with the move (42,000 against
	// 7,000 + 24,000): the key leaves, and to the ranked primary, not to the far engine
	// (26,000 with its charge): the primary would not queue the request.
	observe(0, 40_000)
	if r := ask(near); r.Overflowed || r.Order[0] >= tb.Len() {
		t.Errorf("home (near) at 42,000: order %v, want a ranked primary", r.Order)
	}
	// A key at home on a ranked engine is untouched: the gate is its primary's.
	observe(0, 0)
	primary := ask(-1).Order[0]
	if r := ask(primary); r.Overflowed || r.Order[0] != primary {
		t.Errorf("key at home on ranked %d: order %v, want it first", primary, r.Order)
	}
	// The home's cache of unknown size (its scrape failed): no room to go by.
	loads.SetKVWritten(tb.Endpoint(near).Address, 0, 0)
	if r := ask(near); r.Overflowed {
		t.Errorf("home (near) with its cache unknown: order %v, want the ranked primary", r.Order)
	}
}
