package decide

import (
	"log/slog"
	"testing"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"
	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/guard/guardtest"
	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/picker"
)

// placementCore is a core on the sidecar's defaults with model "a" on a0..a3, past its
// warm-up.
func placementCore(t *testing.T) *Core {
	t.Helper()
	c, clk := newPlacementCore(t)
	clk.Advance(homeWarmup)
	return c
}

// newPlacementCore is placementCore just made, and its clock.
func newPlacementCore(t *testing.T) (*Core, *guardtest.Clock) {
	t.Helper()
	return newPlacementCoreWith(t, nil)
}

// placementCoreWith is placementCore with its configuration changed by edit.
func placementCoreWith(t *testing.T, edit func(*Config)) *Core {
	t.Helper()
	c, clk := newPlacementCoreWith(t, edit)
	clk.Advance(homeWarmup)
	return c
}

func newPlacementCoreWith(t *testing.T, edit func(*Config)) (*Core, *guardtest.Clock) {
	t.Helper()
	pk := picker.DefaultConfig()
	pk.Buckets = 1 << 10
	clk := guardtest.NewClock()
	cfg := Config{Picker: pk, Outliers: guard.DefaultOutlierConfig(), Retry: guard.DefaultRetryConfig(),
		Shed: guard.DefaultShedConfig(), Fallbacks: pk.Fallbacks, DecodeWork: DefaultDecodeWork,
		MoveFactor: DefaultMoveFactor, PrefillWeight: DefaultPrefillWeight, Log: slog.New(slog.DiscardHandler)}
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Update(twoModels(nil)); err != nil {
		t.Fatal(err)
	}
	return c, clk
}

const placementPrompt = 4000 // tokens: a request's work is 4000 + DefaultDecodeWork

func route(t *testing.T, c *Core, key uint64) Decision {
	t.Helper()
	d := c.Route(Request{Model: "a", Key: key, BodyBytes: placementPrompt * BytesPerToken}, make([]int, 0, 8))
	if d.Verdict != Steer {
		t.Fatalf("verdict %v", d.Verdict)
	}
	return d
}

func addrOf(engine string) string {
	for _, ep := range twoModels(nil).Models["a"].Endpoints {
		if ep.Engine == engine {
			return ep.Address
		}
	}
	return ""
}

// A key one sidecar placed off its consistent-hash order reaches a peer as a placement;
// the peer then sends the key's next request where the first went, and a peer that did
// not hear of it follows the key's order. Adopted placements are not sent on again.
func TestPlacementsLetPeersFollowAKeysEngine(t *testing.T) {
	a, b, deaf := placementCore(t), placementCore(t), placementCore(t)
	const key = 0xabcdef0123456789
	first := route(t, deaf, key).Engine // the key's first engine, on an idle core

	// On a, the key's first engine is busy with others' work: a new key goes elsewhere.
	a.ObserveEngineLoad(addrOf(first), requests(10))
	placed := route(t, a, key).Engine
	if placed == first {
		t.Fatalf("a placed the new key on its busy first engine %s", first)
	}
	ps := a.AppendPlacements(nil)
	if len(ps) != 1 || ps[0].Key != picker.KeyBits(key) || ps[0].Address != addrOf(placed) {
		t.Fatalf("a's placements %+v, want the key on %s (%s)", ps, placed, addrOf(placed))
	}
	if again := a.AppendPlacements(nil); len(again) != 0 {
		t.Errorf("a second drain repeats %+v", again)
	}
	if n := b.AdoptPlacements(append(ps, Placement{Key: 1 << 20, Address: "10.9.9.9:1"})); n != 1 {
		t.Errorf("b adopted %d placements, want 1 (the unknown address is ignored)", n)
	}
	if got := route(t, b, key).Engine; got != placed {
		t.Errorf("b sent the key's next request to %s, want %s where a placed it", got, placed)
	}
	if echo := b.AppendPlacements(nil); len(echo) != 0 {
		t.Errorf("b sends on what it adopted: %+v", echo)
	}
	if got := route(t, deaf, key).Engine; got != first {
		t.Errorf("a core without the placement sent the key to %s, want its first %s", got, first)
	}
}

// A key no sidecar has placed has no cache to lose: the least-work choice moves it off a
// busy engine for free. A key placed there before is charged MoveFactor prompts to leave,
// so under the same load it stays with its context.
func TestAHomelessKeyMovesFreelyAHomedKeyStays(t *testing.T) {
	homed, fresh := placementCore(t), placementCore(t)
	const key, other = 0x1234567890abcdef, 0x0fedcba987654321
	d := route(t, homed, key)
	first := d.Engine
	homed.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addrOf(first), Status: 200, Attempts: 1})
	// fresh routes another key once, so both price others' requests at the same mean work.
	d2 := route(t, fresh, other)
	fresh.Outcome(outcome.Record{Ticket: d2.Ticket, Upstream: addrOf(d2.Engine), Status: 200, Attempts: 1})

	// Two other routers' requests on the key's first engine: 2 x 5024 of work, past the
	// spill floor (6144) but less than a move's 3 x 4000 more than an idle engine.
	for _, c := range []*Core{homed, fresh} {
		c.ObserveEngineLoad(addrOf(first), requests(2))
	}
	if got := route(t, homed, key).Engine; got != first {
		t.Errorf("the homed key left its engine %s for %s: a move costs more than the load it avoids", first, got)
	}
	if got := route(t, fresh, key); got.Engine == first || !got.Spilled {
		t.Errorf("the homeless key stayed on the busy %s (spilled %v): it has no cache to lose there", got.Engine, got.Spilled)
	}
}

// A core in its first minute (a sidecar just restarted, its homes forgotten) takes an
// unknown key to be at home on its first engine, where the key order placed it before the
// restart: under the load that moves a homeless key on a warm core, it stays.
func TestANewCoreKeepsUnknownKeysOnTheirFirstEngine(t *testing.T) {
	probe := placementCore(t)
	const key, other = 0x1234567890abcdef, 0x0fedcba987654321
	first := route(t, probe, key).Engine
	c, clk := newPlacementCore(t)
	d := route(t, c, other) // prices others' requests at the same mean as the warm cores'
	c.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addrOf(d.Engine), Status: 200, Attempts: 1})
	c.ObserveEngineLoad(addrOf(first), requests(2))
	clk.Advance(homeWarmup - time.Second)
	if got := route(t, c, key).Engine; got != first {
		t.Errorf("a core 59 s old moved an unknown key off its first engine %s to %s", first, got)
	}
}

// A new core whose first look at the engines shows empty caches (the fleet starts, or the
// engines restarted too) has nothing to keep unknown keys near: it places them by load from
// its first request on, and a later look at a cache that has filled since changes nothing.
// One engine that had written into its cache at the first look keeps the warm-up.
func TestANewCoreOverColdCachesPlacesUnknownKeysByLoad(t *testing.T) {
	probe := placementCore(t)
	const key, other = 0x1234567890abcdef, 0x0fedcba987654321
	first := route(t, probe, key).Engine
	newCore := func(written float64) *Core {
		c, _ := newPlacementCore(t)
		for _, ep := range twoModels(nil).Models["a"].Endpoints {
			w := 0.0
			if ep.Engine == first {
				w = written
			}
			c.ObserveEngineLoad(ep.Address, cacheWrites(0, w, 100_000))
		}
		d := route(t, c, other) // prices others' requests as in the test above
		c.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addrOf(d.Engine), Status: 200, Attempts: 1})
		c.ObserveEngineLoad(addrOf(first), cacheWrites(2, written+10_000, 100_000)) // the load that moves a homeless key
		return c
	}
	if got := route(t, newCore(0), key).Engine; got == first {
		t.Errorf("over cold caches, a new core kept an unknown key on its loaded first engine %s", first)
	}
	if got := route(t, newCore(50_000), key).Engine; got != first {
		t.Errorf("over a warm cache, a new core moved an unknown key off its first engine %s to %s", first, got)
	}
}

// A request a new core steers before its first scrape writes into the caches of a fleet
// that started cold: a first look that finds no more written than the core has sent
// anywhere is still a cold fleet, and one that finds more is warm (others wrote it).
func TestANewCoresOwnWritesDoNotWarmTheCaches(t *testing.T) {
	probe := placementCore(t)
	const key, other = 0x1234567890abcdef, 0x0fedcba987654321
	first := route(t, probe, key).Engine
	own := float64(placementPrompt + DefaultDecodeWork)
	newCore := func(written float64) *Core {
		c, _ := newPlacementCore(t)
		d := route(t, c, other) // before any scrape: the core's own write
		c.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addrOf(d.Engine), Status: 200, Attempts: 1})
		for _, ep := range twoModels(nil).Models["a"].Endpoints {
			w := 0.0
			if ep.Engine == d.Engine {
				w = written
			}
			c.ObserveEngineLoad(ep.Address, cacheWrites(0, w, 100_000))
		}
		c.ObserveEngineLoad(addrOf(first), cacheWrites(2, written+10_000, 100_000)) // the load that moves a homeless key
		return c
	}
	if got := route(t, newCore(own), key).Engine; got == first {
		t.Errorf("its own request's writes made a new core take the caches for warm: it kept an unknown key on its loaded first engine %s", first)
	}
	if got := route(t, newCore(own+50_000), key).Engine; got != first {
		t.Errorf("over caches others wrote, a new core moved an unknown key off its first engine %s to %s", first, got)
	}
}

// Others' requests are priced at the mean work of the requests the core steered, which
// outlives the requests in flight.
func TestRequestWorkIsTheMeanOfRecentRequests(t *testing.T) {
	c := placementCore(t)
	if got := c.requestWork(); got != DefaultDecodeWork {
		t.Errorf("before any request: %v, want the decode work %d", got, DefaultDecodeWork)
	}
	for i := range 10 {
		d := route(t, c, uint64(i)<<32)
		c.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addrOf(d.Engine), Status: 200, Attempts: 1})
	}
	if got, want := c.requestWork(), float64(placementPrompt+DefaultDecodeWork); got != want {
		t.Errorf("after ten equal requests: %v, want %v", got, want)
	}
	// Requests twice as large pull the mean towards them, over a few hundred requests.
	for i := range 256 {
		d := c.Route(Request{Model: "a", Key: uint64(i) << 40, BodyBytes: 2 * placementPrompt * BytesPerToken}, make([]int, 0, 8))
		c.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addrOf(d.Engine), Status: 200, Attempts: 1})
	}
	small, large := float64(placementPrompt+DefaultDecodeWork), float64(2*placementPrompt+DefaultDecodeWork)
	if got := c.requestWork(); !(got > small+0.5*(large-small) && got < large) {
		t.Errorf("after 256 larger requests: %v, want between the midpoint %v and %v", got, (small+large)/2, large)
	}
}

// cacheWrites is a scrape of an engine with n other requests running whose KV cache of
// capacity tokens has taken written tokens since it started.
func cacheWrites(n, written, capacity float64) enginemetrics.Load {
	l := requests(n)
	l.KVTokens, l.PrefixQueries, l.PrefixHits, l.GenerationTokens = capacity, written, 0, 0
	return l
}

// A key's home expires once its engine has written more than its cache holds since the
// key's request went there: the context is evicted, so under a load that keeps a homed key
// in place, the key now moves as a homeless one. A peer that adopted the placement
// carries its stamp and expires it at the same point.
func TestAHomeExpiresWhenItsEngineCacheTurnsOver(t *testing.T) {
	homed, peer := placementCore(t), placementCore(t)
	const key, capacity = 0x1234567890abcdef, 100_000
	first := route(t, placementCore(t), key).Engine
	for _, c := range []*Core{homed, peer} {
		c.ObserveEngineLoad(addrOf(first), cacheWrites(0, 1_000_000, capacity))
	}
	d := route(t, homed, key)
	if d.Engine != first {
		t.Fatalf("an idle fleet sent the key to %s, want its first engine %s", d.Engine, first)
	}
	homed.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addrOf(first), Status: 200, Attempts: 1})
	ps := homed.AppendPlacements(nil)
	if len(ps) != 1 || ps[0].KVStamp != 1_000_000+1 {
		t.Fatalf("placements %+v, want the key stamped at the 1,000,000 writes when it was placed (+1)", ps)
	}
	peer.AdoptPlacements(ps)
	// Two other routers' requests there (as in TestAHomelessKeyMovesFreelyAHomedKeyStays)
	// and exactly a cache's worth of writes since the placement: the home holds.
	for _, c := range []*Core{homed, peer} {
		c.ObserveEngineLoad(addrOf(first), cacheWrites(2, 1_000_000+capacity, capacity))
	}
	if got := route(t, peer, key).Engine; got != first {
		t.Errorf("the peer moved the key off its warm home %s to %s", first, got)
	}
	for _, c := range []*Core{homed, peer} {
		c.ObserveEngineLoad(addrOf(first), cacheWrites(2, 1_000_000+capacity+1, capacity))
	}
	if got := route(t, homed, key); got.Engine == first || !got.Spilled {
		t.Errorf("the key stayed on %s (spilled %v) after its cache turned over", got.Engine, got.Spilled)
	}
}

// A conversation whose prompt crossed a rung of the key ladder has a new key with no home
// yet; its parent key (the previous turn's) has one, and the request goes there, to its
// context, not to the new key's first engine. Without the parent it would go to the first.
func TestAKeyWithoutAHomeFollowsItsParent(t *testing.T) {
	c, fresh := placementCore(t), placementCore(t)
	const parent = 0xabcdef0123456789
	first := route(t, fresh, parent).Engine
	c.ObserveEngineLoad(addrOf(first), requests(10))
	placed := route(t, c, parent).Engine // moved off its busy first engine
	if placed == first {
		t.Fatalf("the parent key stayed on its busy first engine %s", first)
	}
	c.ObserveEngineLoad(addrOf(first), requests(0))
	key := uint64(0x1111111111110000)
	for ; route(t, fresh, key).Engine == placed; key += 1 << 16 {
	}
	newKey := route(t, fresh, key).Engine
	d := c.Route(Request{Model: "a", Key: key, ParentKey: parent, BodyBytes: placementPrompt * BytesPerToken}, make([]int, 0, 8))
	if d.Engine != placed {
		t.Errorf("the new key went to %s, want %s where its parent's context is (its own first engine is %s)", d.Engine, placed, newKey)
	}
	if got := route(t, c, key).Engine; got != placed {
		t.Errorf("the key's next request went to %s, want %s: the key is at home there now", got, placed)
	}
}
