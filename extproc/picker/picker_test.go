package picker

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Two sidecars build their tables independently (different input order, different
// Loads) and must agree on every key, with and without load.
func TestTwoSidecarsAgree(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
	}{{"one", 1}, {"three", 3}, {"sixteen", 16}, {"three-hundred", 300}} {
		t.Run(tc.name, func(t *testing.T) {
			eps := fleet(tc.n, skewed)
			shuffled := slices.Clone(eps)
			rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) {
				shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
			})
			a := mustTable(t, testConfig(), eps, NewLoads())
			b := mustTable(t, testConfig(), shuffled, NewLoads())
			var da, db []int
			var sa, sb []byte
			// A hot key mixed with cold ones: both sidecars start the same requests, so
			// their in-flight state stays equal and spills must match too.
			ks := keys(20000, 7)
			for i, k := range ks {
				if i%3 == 0 {
					k = ks[0]
				}
				ra, rb := a.Pick(k, 1, 1, da[:0]), b.Pick(k, 1, 1, db[:0])
				da, db = ra.Order, rb.Order
				sa, sb = a.AppendAddrs(sa[:0], da), b.AppendAddrs(sb[:0], db)
				if string(sa) != string(sb) || ra.Spilled != rb.Spilled {
					t.Fatalf("key %d (%#x): sidecar A picks %q (spilled %v), B picks %q (spilled %v)",
						i, k, sa, ra.Spilled, sb, rb.Spilled)
				}
				if i%2 == 0 { // leave every other request in flight
					a.Start(da[0], 1)
					b.Start(db[0], 1)
				}
			}
		})
	}
}

func TestSharesFollowWeights(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		weight func(int) float64
		tol    float64 // relative
	}{
		// The noise is bucket quantization plus key sampling: relative σ ≈
		// sqrt(1/(share·2^18) + 1/(share·2^20)), 0.4% to 1% at 8 endpoints and 3.5% for
		// the lightest of 64 (share 0.4%). Tolerances are about 3σ.
		{"equal-8", 8, equal, 0.03},
		{"skewed-8", 8, skewed, 0.03},
		{"skewed-64", 64, skewed, 0.10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig() // 2^18 buckets: the quantization the sidecar runs with
			eps := fleet(tc.n, tc.weight)
			tb := mustTable(t, cfg, eps, NewLoads())
			got := primaryShares(tb, keys(1<<20, 3))
			sum := 0.0
			for _, ep := range eps {
				sum += ep.Weight
			}
			worst := 0.0
			for _, ep := range eps {
				want := ep.Weight / sum
				rel := math.Abs(got[ep.Address]/want - 1)
				worst = max(worst, rel)
				if rel > tc.tol {
					t.Errorf("%s: share %.4f, want %.4f (off by %.1f%%, tolerance %.0f%%)",
						ep.Address, got[ep.Address], want, 100*rel, 100*tc.tol)
				}
			}
			t.Logf("worst relative share error over %d endpoints: %.2f%%", tc.n, 100*worst)
		})
	}
}

func TestZeroWeightsExcluded(t *testing.T) {
	eps := fleet(12, func(i int) float64 { return float64(i % 3) }) // every third is 0
	tb := mustTable(t, testConfig(), eps, NewLoads())
	if tb.Len() != 8 {
		t.Fatalf("Len() = %d, want 8 (4 of 12 endpoints have weight 0)", tb.Len())
	}
	zero := map[string]bool{}
	for _, ep := range eps {
		if ep.Weight == 0 {
			zero[ep.Address] = true
			if _, ok := tb.Lookup(ep.Address); ok {
				t.Errorf("Lookup(%s) found a zero-weight endpoint", ep.Address)
			}
		}
	}
	var dst []int
	for _, k := range keys(50000, 4) {
		r := tb.Pick(k, 1, 1, dst)
		dst = r.Order
		for _, i := range r.Order {
			if zero[tb.Endpoint(i).Address] {
				t.Fatalf("key %#x: order %v includes zero-weight %s", k, r.Order, tb.Endpoint(i).Address)
			}
		}
	}
}

func TestEmptyTablePicksNothing(t *testing.T) {
	tb := mustTable(t, testConfig(), fleet(3, func(int) float64 { return 0 }), NewLoads())
	r := tb.Pick(42, 1, 1, make([]int, 0, 3))
	if len(r.Order) != 0 || r.AtLimit || r.Spilled {
		t.Fatalf("Pick on an empty table = %+v, want an empty order and no flags", r)
	}
	if _, ok := tb.Utilization(); ok {
		t.Error("Utilization() ok on an empty table")
	}
}

func TestOrderIsDistinctAndSized(t *testing.T) {
	for _, tc := range []struct {
		n, fallbacks, want int
	}{{1, 2, 1}, {2, 2, 2}, {3, 2, 3}, {50, 2, 3}, {50, 0, 1}, {50, 7, 8}, {4, 7, 4}} {
		cfg := testConfig()
		cfg.Fallbacks = tc.fallbacks
		tb := mustTable(t, cfg, fleet(tc.n, skewed), NewLoads())
		for _, k := range keys(5000, 5) {
			o := tb.Pick(k, 1, 1, nil).Order
			if len(o) != tc.want {
				t.Fatalf("n=%d fallbacks=%d: len(order) = %d, want %d", tc.n, tc.fallbacks, len(o), tc.want)
			}
			s := slices.Clone(o)
			slices.Sort(s)
			if len(slices.Compact(s)) != len(o) {
				t.Fatalf("n=%d: order %v repeats an endpoint", tc.n, o)
			}
		}
	}
}

// A hot key keeps its primary until the primary reaches (1+ε) × its share of the
// total in flight, then spills to the key's next endpoint; no endpoint ever exceeds
// its bound.
func TestHotKeySpillsAtBound(t *testing.T) {
	for _, eps := range []float64{0.1, 0.25, 1} {
		cfg := testConfig()
		cfg.Epsilon = eps
		cfg.SpillFloor = 0 // the pure Mirrokni bound; TestSpillFloorKeepsAffinity covers the floor
		tb := mustTable(t, cfg, fleet(8, skewed), NewLoads())
		const key = 0xfeedface
		unloaded := tb.Pick(key, 1, 1, nil).Order
		spills := 0
		for step := range 400 {
			r := tb.Pick(key, 1, 1, nil)
			if r.Spilled {
				spills++
			}
			if step == 0 && (r.Spilled || r.Order[0] != unloaded[0]) {
				t.Fatalf("ε=%v: first pick %+v, want the unloaded primary %d", eps, r, unloaded[0])
			}
			first := -1
			if r.Spilled {
				first = r.Order[0]
			}
			if spills == 1 && first >= 0 && first != unloaded[1] {
				t.Fatalf("ε=%v: first spill went to %d, want the key's second choice %d", eps, first, unloaded[1])
			}
			tb.Start(r.Order[0], 1)
			total := float64(tb.loadsTotal())
			for i := range tb.Len() {
				bound := math.Ceil(tb.bound[i] * total)
				if float64(tb.InFlight(i)) > bound {
					t.Fatalf("ε=%v step %d: endpoint %d has %d in flight, bound ⌈(1+ε)·share·total⌉ = %v",
						eps, step, i, tb.InFlight(i), bound)
				}
			}
		}
		if spills == 0 {
			t.Errorf("ε=%v: 400 requests for one key never spilled", eps)
		}
		t.Logf("ε=%v: %d of 400 requests for one hot key spilled", eps, spills)
	}
}

func (t *Table) loadsTotal() int64 { return t.total.n.Load() }

// With few requests in flight, a key keeps its primary up to SpillFloor in flight, then
// bounded loads apply as usual.
func TestSpillFloorKeepsAffinity(t *testing.T) {
	cfg := testConfig()
	cfg.SpillFloor = 4
	tb := mustTable(t, cfg, fleet(8, equal), NewLoads())
	const key = 0xabcdef
	primary := tb.Pick(key, 1, 1, nil).Order[0]
	for i := 0; i < 4; i++ {
		r := tb.Pick(key, 1, 1, nil)
		if r.Spilled || r.Order[0] != primary {
			t.Fatalf("request %d with %d in flight spilled to %d: the floor is 4", i, i, r.Order[0])
		}
		tb.Start(r.Order[0], 1)
	}
	if r := tb.Pick(key, 1, 1, nil); !r.Spilled {
		t.Fatalf("5th concurrent request for one key stayed on its primary: the share bound (1.25/8 of 5) must apply past the floor")
	}
}

func TestHardCapReportsAtLimit(t *testing.T) {
	cfg := testConfig()
	cfg.MaxInFlight = 2
	eps := fleet(3, equal)
	eps[2].MaxInFlight = 1 // per-endpoint cap overrides the default
	tb := mustTable(t, cfg, eps, NewLoads())
	var tickets []Ticket
	for range 5 { // capacity 2+2+1
		r := tb.Pick(99, 1, 1, nil)
		if r.AtLimit || len(r.Order) == 0 {
			t.Fatalf("after %d starts: Pick = %+v, want a free endpoint", len(tickets), r)
		}
		tickets = append(tickets, tb.Start(r.Order[0], 1))
	}
	if u, ok := tb.Utilization(); !ok || u != 1 {
		t.Errorf("Utilization() = %v, %v; want 1, true", u, ok)
	}
	r := tb.Pick(99, 1, 1, nil)
	if !r.AtLimit || len(r.Order) != 0 {
		t.Fatalf("every endpoint at its cap: Pick = %+v, want AtLimit and an empty order", r)
	}
	tickets[0].Done()
	r = tb.Pick(99, 1, 1, nil)
	if r.AtLimit || len(r.Order) != 1 {
		t.Fatalf("after one Done: Pick = %+v, want exactly the freed endpoint", r)
	}
	Ticket{}.Done() // the zero ticket is harmless
}

// Counters live in Loads, so a request started under one table ends under the next.
func TestCountersSurviveSwapAndPrune(t *testing.T) {
	loads := NewLoads()
	eps := fleet(4, equal)
	old := mustTable(t, testConfig(), eps, loads)
	tk := old.Start(0, 1)
	addr := old.Endpoint(0).Address

	eps[0].Weight = 5
	eps[3].Weight = 0 // 3 leaves the table
	next := mustTable(t, testConfig(), eps, loads)
	i, _ := next.Lookup(addr)
	if got := next.InFlight(i); got != 1 {
		t.Fatalf("new table sees %d in flight at %s, want 1", got, addr)
	}
	if got := loads.Prune(next); got != 1 {
		t.Errorf("Prune forgot %d counters, want 1 (the idle removed endpoint)", got)
	}
	tk.Done()
	if got, total := next.InFlight(i), loads.Total(); got != 0 || total != 0 {
		t.Fatalf("after Done: in flight %d, total %d; want 0, 0", got, total)
	}
	// A removed address with requests still in flight keeps its counter.
	tk = next.Start(i, 1)
	eps[0].Weight = 0
	last := mustTable(t, testConfig(), eps, loads)
	loads.Prune(last)
	if loads.InFlight(addr) != 1 {
		t.Fatalf("Prune dropped %s while a request was in flight", addr)
	}
	tk.Done()
}

func TestPickAndFormatDoNotAllocate(t *testing.T) {
	tb := mustTable(t, testConfig(), fleet(64, skewed), NewLoads())
	ks := keys(1024, 9)
	dst := make([]int, 0, tb.cfg.Choices)
	buf := make([]byte, 0, 256)
	j := 0
	allocs := testing.AllocsPerRun(1000, func() {
		r := tb.Pick(ks[j%len(ks)], 1, 1, dst)
		tk := tb.Start(r.Order[0], 1)
		buf = tb.AppendAddrs(buf[:0], r.Order)
		tk.Done()
		j++
	})
	if allocs != 0 {
		t.Fatalf("Pick+Start+AppendAddrs+Done allocates %v times per request, want 0", allocs)
	}
}

func TestAppendAddrs(t *testing.T) {
	tb := mustTable(t, testConfig(), fleet(3, equal), NewLoads())
	for _, tc := range []struct {
		order []int
		want  string
	}{
		{nil, ""},
		{[]int{1}, "10.0.0.1:8000"},
		{[]int{2, 0, 1}, "10.0.0.2:8000,10.0.0.0:8000,10.0.0.1:8000"},
	} {
		if got := string(tb.AppendAddrs([]byte("x="), tc.order)); got != "x="+tc.want {
			t.Errorf("AppendAddrs(%v) = %q, want %q", tc.order, got, "x="+tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*Config)
	}{
		{"buckets", func(c *Config) { c.Buckets = 1000 }},
		{"buckets", func(c *Config) { c.Buckets = 128 }},
		{"candidates", func(c *Config) { c.Candidates = 0 }},
		{"candidates", func(c *Config) { c.Candidates = 9 }},
		{"fallbacks", func(c *Config) { c.Fallbacks = -1 }},
		{"choices", func(c *Config) { c.Fallbacks, c.Choices = 4, 4 }},
		{"choices", func(c *Config) { c.Choices = 65 }},
		{"epsilon", func(c *Config) { c.Epsilon = 0 }},
		{"epsilon", func(c *Config) { c.Epsilon = math.NaN() }},
		{"maxInFlight", func(c *Config) { c.MaxInFlight = -1 }},
		{"maxExamined", func(c *Config) { c.MaxExamined = 11 }}, // below choices = 12
		{"maxExamined", func(c *Config) { c.MaxExamined = 65 }},
	} {
		c := DefaultConfig()
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: Validate() = %v, want an error naming %s", c, err, tc.field)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig().Validate() = %v", err)
	}
}

func TestNewTableRejectsBadEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func([]Endpoint)
		loads *Loads
		want  string
	}{
		{"duplicate", func(e []Endpoint) { e[2].Address = e[0].Address }, NewLoads(), "share address"},
		{"negative", func(e []Endpoint) { e[1].Weight = -1 }, NewLoads(), "endpoints[1]"},
		{"nan", func(e []Endpoint) { e[1].Weight = math.NaN() }, NewLoads(), "weight NaN"},
		{"inf", func(e []Endpoint) { e[0].Weight = math.Inf(1) }, NewLoads(), "weight +Inf"},
		{"no-address", func(e []Endpoint) { e[1].Address = "" }, NewLoads(), "no address"},
		{"negative-cap", func(e []Endpoint) { e[1].MaxInFlight = -3 }, NewLoads(), "maxInFlight"},
		{"no-loads", func([]Endpoint) {}, nil, "Loads"},
	} {
		eps := fleet(3, equal)
		tc.edit(eps)
		_, err := NewTable(testConfig(), eps, tc.loads)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewTable error = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// Picks, starts and ends from many goroutines while tables are swapped must leave
// every counter at zero (run with -race to check the memory model too).
func TestConcurrentPicksBalanceCounters(t *testing.T) {
	loads := NewLoads()
	eps := fleet(32, skewed)
	var cur atomic.Pointer[Table]
	cur.Store(mustTable(t, testConfig(), eps, loads))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			dst := make([]int, 0, 3)
			var open []Ticket
			for i, k := range keys(5000, uint64(g)) {
				tb := cur.Load()
				r := tb.Pick(k, 1, 1, dst)
				open = append(open, tb.Start(r.Order[0], 1))
				if i%3 == 0 { // keep some in flight across swaps
					for _, tk := range open {
						tk.Done()
					}
					open = open[:0]
				}
			}
			for _, tk := range open {
				tk.Done()
			}
		})
	}
	for i := range 5 {
		next := slices.Clone(eps)
		next[i].Weight *= 2
		cur.Store(mustTable(t, testConfig(), next, loads))
	}
	wg.Wait()
	if total := loads.Total(); total != 0 {
		t.Fatalf("total in flight after every Done: %d, want 0", total)
	}
	for _, ep := range eps {
		if n := loads.InFlight(ep.Address); n != 0 {
			t.Fatalf("%s: %d in flight after every Done", ep.Address, n)
		}
	}
}

// Bounded loads weigh requests by their work: one long prompt fills an endpoint's share as
// many short ones would, and the next request for the same key spills; with the same
// number of short requests in flight it stays.
func TestBoundedLoadsWeighWork(t *testing.T) {
	cfg := testConfig()
	cfg.SpillFloor = 0
	const key = 0xfeed
	for _, tc := range []struct {
		name      string
		inFlight  []int64 // work of each request already on the key's primary
		elsewhere int64   // work in flight on the other endpoints
		spill     bool
	}{
		{"one long prompt among short ones", []int64{100_000}, 4 * 1_000, true},
		{"as many short requests", []int64{1_000}, 4 * 1_000, false},
	} {
		loads := NewLoads()
		tb := mustTable(t, cfg, fleet(4, equal), loads)
		primary := tb.Pick(key, 1, 1, nil).Order[0]
		var open []Ticket
		for _, w := range tc.inFlight {
			open = append(open, tb.Start(primary, w))
		}
		other := (primary + 1) % tb.Len()
		open = append(open, tb.Start(other, tc.elsewhere))
		if got := tb.Work(primary); got != tc.inFlight[0] {
			t.Fatalf("%s: Work(primary) = %d, want %d", tc.name, got, tc.inFlight[0])
		}
		// A move this costly keeps the least-work choice out of it: only the bound acts.
		r := tb.Pick(key, 1_000, 1_000_000, nil)
		if r.Spilled != tc.spill {
			t.Errorf("%s: spilled = %v, want %v (primary work %d of %d in flight, bound 1.25/4)",
				tc.name, r.Spilled, tc.spill, tb.Work(primary), loads.TotalWork())
		}
		for _, tk := range open {
			tk.Done()
		}
		if loads.Total() != 0 || loads.TotalWork() != 0 {
			t.Fatalf("%s: after every Done: %d requests and %d work in flight, want 0", tc.name, loads.Total(), loads.TotalWork())
		}
	}
}

// The least-work choice: past the floor, a key's primary is the returned endpoint that
// would hold the least work after taking the request, the others charged the move (the
// prefix they must recompute). A long prompt on the key's first endpoint sends the next
// long prompt to the key's second; a short one stays while moving costs more than the
// difference; under the floor nothing moves; and two sidecars with the same loads agree.
func TestLeastWorkChoice(t *testing.T) {
	cfg := testConfig()
	cfg.Epsilon = 10 // bounded loads out of the way: only the choice acts
	cfg.SpillFloor = 4_000
	const key = 0xc0ffee
	for _, tc := range []struct {
		name       string
		onPrimary  int64 // work already on the key's first endpoint
		work, move int64
		want       int // index into the key's unloaded order
	}{
		{"a longer prompt in flight, another arrives", 45_000, 41_000, 40_000, 1},
		{"moving costs more than the difference", 40_000, 1_100, 50_000, 0},
		{"under the floor", 3_999, 41_000, 40_000, 0},
		{"a tie keeps the key's first", 40_000, 1_000, 40_000, 0},
	} {
		loads := NewLoads()
		a := mustTable(t, cfg, fleet(4, equal), loads)
		b := mustTable(t, cfg, fleet(4, equal), NewLoads()) // another sidecar
		order := a.Pick(key, tc.work, tc.move, nil).Order
		tk := a.Start(order[0], tc.onPrimary)
		b.Start(order[0], tc.onPrimary)
		r := a.Pick(key, tc.work, tc.move, nil)
		if r.Order[0] != order[tc.want] {
			t.Errorf("%s: primary %d, want the key's choice %d (%d); order %v", tc.name, r.Order[0], tc.want, order[tc.want], r.Order)
		}
		if r.Spilled != (tc.want != 0) {
			t.Errorf("%s: Spilled = %v, want %v", tc.name, r.Spilled, tc.want != 0)
		}
		if rb := b.Pick(key, tc.work, tc.move, nil); !slices.Equal(rb.Order, r.Order) {
			t.Errorf("%s: another sidecar with the same loads picks %v, this one %v", tc.name, rb.Order, r.Order)
		}
		if tc.want != 0 && !slices.Equal(r.Order[1:], append([]int{order[0]}, order[2:len(r.Order)]...)) {
			t.Errorf("%s: fallbacks %v, want the key's first then its order: %v", tc.name, r.Order[1:], order)
		}
		tk.Done()
	}
}

// With no cache's size known, the choice weighs work against each endpoint's share: an
// endpoint with twice the weight takes twice the work before it looks as loaded.
func TestLeastWorkChoiceFollowsShares(t *testing.T) {
	cfg := testConfig()
	cfg.Epsilon, cfg.SpillFloor = 10, 1
	eps := fleet(2, func(i int) float64 { return float64(1 + i) }) // shares 1/3 and 2/3
	tb := mustTable(t, cfg, eps, NewLoads())
	heavy, light := 1, 0
	// 3,000 on the heavy one is 1,500 per unit of share; 1,000 on the light one is 1,000.
	tb.Start(heavy, 3_000)
	tb.Start(light, 1_000)
	for _, k := range keys(200, 3) {
		if r := tb.Pick(k, 100, 0, nil); r.Order[0] != light {
			t.Fatalf("key %#x: primary %d, want the light endpoint %d (less work per share)", k, r.Order[0], light)
		}
	}
}

// Work others were observed to hold counts in the least-work choice, as if this sidecar
// had sent it, but not in bounded loads; forgetting it restores the key's own order.
func TestObservedWorkInformsTheChoice(t *testing.T) {
	cfg := testConfig()
	cfg.SpillFloor = 4_000
	const key = 0xc0ffee
	loads := NewLoads()
	a := mustTable(t, cfg, fleet(4, equal), loads)
	order := a.Pick(key, 1_000, 1_000, nil).Order
	first := a.Endpoint(order[0]).Address

	// Another sidecar's long prompts on the key's first engine, as its queue showed them.
	loads.SetObserved(first, 45_000)
	if got := loads.Observed(first); got != 45_000 {
		t.Fatalf("Observed = %d, want 45000", got)
	}
	r := a.Pick(key, 1_000, 1_000, nil)
	if r.Order[0] != order[1] || !r.Spilled {
		t.Errorf("with 45k of others' work on the key's first engine the primary is %d (spilled %v), want the key's next, %d", r.Order[0], r.Spilled, order[1])
	}
	// Bounded loads do not count it: every engine is still within its bound (no
	// endpoint is listed after the within-bound ones out of the key's order).
	if !slices.Equal(r.Order[1:], append([]int{order[0]}, order[2:len(r.Order)]...)) {
		t.Errorf("order %v: want the key's first right behind the choice, then the key's order %v", r.Order, order)
	}
	// The same observation on the others as well: the key's first is no worse, and keeps it.
	for _, i := range order[1:] {
		loads.SetObserved(a.Endpoint(i).Address, 45_000)
	}
	if r := a.Pick(key, 1_000, 1_000, nil); r.Order[0] != order[0] || r.Spilled {
		t.Errorf("equal observed work everywhere: primary %d, want the key's first %d", r.Order[0], order[0])
	}
	for i := range a.Len() {
		loads.SetObserved(a.Endpoint(i).Address, 0)
	}
	if got := loads.Observed(first); got != 0 {
		t.Errorf("Observed after forgetting = %d", got)
	}
	// Observed work on an address no table holds is not kept as a counter.
	loads.SetObserved("10.9.9.9:8000", 0)
	if n := loads.Prune(a); n != 0 {
		t.Errorf("Prune forgot %d counters; none should exist beyond the table's", n)
	}
}

// The work the node's other sidecars hold in flight (SetPeers) counts in bounded loads
// as this process's own: an endpoint its peers have loaded past its bound is passed over
// though this process sent it nothing, and takes its keys back once they finish.
func TestPeersWorkCountsInBoundedLoads(t *testing.T) {
	cfg := testConfig()
	cfg.Fallbacks, cfg.Choices = 0, 1 // no least-work choice: what moves the key is the bound alone
	loads := NewLoads()
	tb := mustTable(t, cfg, fleet(4, equal), loads)
	dst := make([]int, 0, 4)
	const key = 0x1234_5678_9abc_def0
	first := tb.Pick(key, 100, 0, dst).Order[0]
	addr := tb.Endpoint(first).Address
	loads.SetPeers(map[string]int64{addr: 1 << 20}, 1<<20)
	if r := tb.Pick(key, 100, 0, dst); r.Order[0] == first || !r.Spilled {
		t.Errorf("the key stayed on %s, which holds its peers' 1M of work, all of the node's", addr)
	}
	if got := loads.Peers(addr); got != 1<<20 {
		t.Errorf("Peers(%s) = %d", addr, got)
	}
	loads.SetPeers(nil, 0)
	if r := tb.Pick(key, 100, 0, dst); r.Order[0] != first {
		t.Errorf("with the peers' work gone the key went to %s, want %s", tb.Endpoint(r.Order[0]).Address, addr)
	}
}

// The peers' work counts in the least-work choice too: with bounds so loose that no
// endpoint is ever over its own, a key still leaves its first endpoint for the next once
// its peers hold more there than moving costs.
func TestPeersWorkCountsInTheLeastWorkChoice(t *testing.T) {
	cfg := testConfig()
	cfg.Epsilon = 1000 // bounded loads never pass an endpoint over
	loads := NewLoads()
	tb := mustTable(t, cfg, fleet(4, equal), loads)
	dst := make([]int, 0, 4)
	const key = 0x0fed_cba9_8765_4321
	r := tb.Pick(key, 100, 500, dst)
	first, next := r.Order[0], r.Order[1]
	loads.SetPeers(map[string]int64{tb.Endpoint(first).Address: 1 << 20}, 1<<20)
	if got := tb.Pick(key, 100, 500, dst).Order[0]; got != next {
		t.Errorf("primary %s, want %s: the first holds its peers' 1M of work, moving costs 500", tb.Endpoint(got).Address, tb.Endpoint(next).Address)
	}
	// A counter made after the snapshot (an endpoint joining a table) starts with its share.
	late := Endpoint{Address: "10.9.9.9:8000", Engine: "late", Weight: 1}
	loads.SetPeers(map[string]int64{late.Address: 777}, 777)
	mustTable(t, cfg, append(fleet(4, equal), late), loads)
	if got := loads.Peers(late.Address); got != 777 {
		t.Errorf("an endpoint added after the peers' snapshot holds %d of their work, want 777", got)
	}
}

// The least-work choice weighs the key's first Choices endpoints, and the list it returns
// is cut to Fallbacks+1: with the key's first seven engines busy and its eighth idle, the
// eighth is the primary though a list of two would not have held it, and the key's first
// follows it. With Choices at Fallbacks+1 the choice stays among the first two.
func TestTheChoiceWeighsChoicesEnginesAndListsFallbacks(t *testing.T) {
	cfg := testConfig()
	cfg.Epsilon = 1000 // bounded loads never pass an endpoint over: the choice alone moves the key
	cfg.Fallbacks, cfg.Choices = 7, 8
	loads := NewLoads()
	eps := fleet(8, equal)
	all := mustTable(t, cfg, eps, loads)
	const key = 0x5eed_0000_1234_abcd
	order := all.Pick(key, 100, 0, nil).Order
	if len(order) != 8 {
		t.Fatalf("the full order has %d engines, want 8", len(order))
	}
	for j, i := range order[:7] {
		all.Start(i, 100_000+int64(j)*1000)
	}
	cfg.Fallbacks = 1
	tb := mustTable(t, cfg, eps, loads)
	r := tb.Pick(key, 100, 500, make([]int, 0, cfg.Choices))
	if want := []int{order[7], order[0]}; !slices.Equal(r.Order, want) || !r.Spilled {
		t.Errorf("order %v (spilled %v), want %v spilled: the idle eighth engine, then the key's first", r.Order, r.Spilled, want)
	}
	// A home beyond the list, on a light engine, keeps its key: the walk goes on to find
	// it though the key's first engine holds too little for the choice to be in play.
	light := NewLoads()
	lt := mustTable(t, cfg, eps, light)
	if got := lt.PickHome(key, 100, 500, order[6], nil).Order; len(got) != 2 || got[0] != order[6] {
		t.Errorf("home %d beyond the list: order %v, want the home first", order[6], got)
	}
	cfg.Choices = 2
	narrow := mustTable(t, cfg, eps, loads)
	if got := narrow.Pick(key, 100, 500, nil).Order; len(got) != 2 || got[0] == order[7] || got[1] == order[7] {
		t.Errorf("choices 2: order %v, want the key's first two engines only", got)
	}
}

// The least-work choice weighs each candidate's work relative to its KV cache when every
// candidate states one, and relative to its share of the table when one does not: an
// engine with a tenth of the share and a fifth of the work takes the request by its cache,
// and not by its share; a cache four times the size holds four times the work as lightly.
func TestTheChoiceWeighsWorkPerTokenOfCache(t *testing.T) {
	cfg := testConfig()
	cfg.Epsilon = 1000 // bounded loads never pass an endpoint over: the choice alone moves the key
	cfg.Fallbacks, cfg.Choices = 1, 2
	weights := []float64{9, 1}
	eps := fleet(2, func(i int) float64 { return weights[i] })
	probe := mustTable(t, cfg, eps, NewLoads())
	var key uint64
	for _, k := range keys(1000, 9) {
		if probe.Endpoint(probe.Pick(k, 1, 0, nil).Order[0]).Weight == 9 {
			key = k
			break
		}
	}
	pick := func(bigCache, smallCache int64) string {
		loads := NewLoads()
		tb := mustTable(t, cfg, eps, loads)
		big, _ := tb.Lookup(eps[0].Address)
		small, _ := tb.Lookup(eps[1].Address)
		tb.Start(big, 50_000)
		tb.Start(small, 10_000)
		for i, kc := range map[int]int64{big: bigCache, small: smallCache} {
			if kc > 0 {
				observeKV(loads, tb, i, 0, kc)
			}
		}
		return tb.Endpoint(tb.Pick(key, 1_000, 2_000, nil).Order[0]).Engine
	}
	// By cache: 51k of 100k against 13k of 100k. By share: 51k / 0.9 against 13k / 0.1.
	if got := pick(100_000, 100_000); got != eps[1].Engine {
		t.Errorf("equal caches: primary %s, want %s, the one holding a fifth of the work", got, eps[1].Engine)
	}
	if got := pick(100_000, 0); got != eps[0].Engine {
		t.Errorf("one cache unknown: primary %s, want %s, by the shares", got, eps[0].Engine)
	}
	if got := pick(400_000, 100_000); got != eps[0].Engine {
		t.Errorf("a cache four times the size: primary %s, want %s (51k of 400k against 13k of 100k)", got, eps[0].Engine)
	}
}
