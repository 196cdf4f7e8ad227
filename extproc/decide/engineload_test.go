package decide

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"
	"github.com/meridian-router/meridian/extproc/picker"

	"github.com/meridian-router/meridian/extproc/outcome"
)

// requests is a scrape that states only the engine's queue (no KV cache gauges).
func requests(n float64) enginemetrics.Load {
	return enginemetrics.Load{Running: n, KVUsage: math.NaN()}
}

// An engine's scraped queue beyond the core's own requests is other routers' work, at the
// mean work of the core's own requests; a failed scrape (NaN) or a queue no longer than
// the core's own forgets it. The scraped targets are the engines with a share and a URL.
func TestObserveEngineLoadCountsOnlyOthersWork(t *testing.T) {
	c, _ := newTestCore(t)
	v := twoModels(nil)
	mv := v.Models["a"]
	for i := range mv.Endpoints {
		mv.Endpoints[i].MetricsURL = "http://" + mv.Endpoints[i].Address + "/metrics"
	}
	mv.Endpoints[3].Priority = 1 // failover: no share, not scraped
	v.Models["a"] = mv
	if err := c.Update(v); err != nil {
		t.Fatal(err)
	}
	targets := c.LoadTargets(nil)
	if len(targets) != 3 || targets[0].Address != "127.0.0.1:8000" || targets[0].MetricsURL != "http://127.0.0.1:8000/metrics" {
		t.Fatalf("targets %+v: want a0..a2 with their URLs (a3 is failover, model b has no URLs)", targets)
	}

	// Before the core has sent anything, others' requests count as short ones.
	c.ObserveEngineLoad("127.0.0.1:8000", requests(3))
	if got := c.ObservedLoad()["a0"]; got != 3*DefaultDecodeWork {
		t.Errorf("3 requests observed with none of ours: %d work, want 3 x decode work %d", got, 3*DefaultDecodeWork)
	}

	d := c.Route(Request{Model: "a", Key: 7, BodyBytes: 4000 * BytesPerToken}, make([]int, 0, 8))
	if d.Verdict != Steer {
		t.Fatalf("verdict %v", d.Verdict)
	}
	var addr string
	for _, ep := range v.Models["a"].Endpoints {
		if ep.Engine == d.Engine {
			addr = ep.Address
		}
	}
	ours := int64(4000 + DefaultDecodeWork)
	c.ObserveEngineLoad(addr, requests(5)) // ours and four others
	if got := c.ObservedLoad()[d.Engine]; got != 4*ours {
		t.Errorf("engine holds 5 requests, one of them ours: observed %d, want 4 x our mean work %d", got, 4*ours)
	}
	c.ObserveEngineLoad(addr, requests(1))
	if got, ok := c.ObservedLoad()[d.Engine]; ok {
		t.Errorf("the engine holds only our request; observed %d for others", got)
	}
	c.ObserveEngineLoad(addr, requests(6))
	c.ForgetEngineLoad(addr)
	if got, ok := c.ObservedLoad()[d.Engine]; ok {
		t.Errorf("a failed scrape must forget the observation; still %d", got)
	}
	// The mean outlives the core's last request: with none in flight, others still count
	// at it, not at a short request's work.
	c.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addr, Status: 200, Attempts: 1})
	if n := c.InFlightTotal(); n != 0 {
		t.Fatalf("%d in flight after the outcome", n)
	}
	c.ObserveEngineLoad(addr, requests(2))
	if got := c.ObservedLoad()[d.Engine]; got != 2*ours {
		t.Errorf("after our request ended: observed %d, want 2 x the last mean %d", got, 2*ours)
	}
}

// An engine that states its KV cache's use and capacity is weighed by the tokens it holds
// (plus its waiting requests at the core's mean work), less the core's own work there:
// one long prompt of another router's outweighs several short ones.
func TestObserveEngineLoadWeighsTheTokensHeld(t *testing.T) {
	c := placementCore(t)
	d := route(t, c, 7) // ours: 4000 + decode work
	ours := float64(placementPrompt + DefaultDecodeWork)
	addr := addrOf(d.Engine)
	// 100k tokens of cache, a quarter held, two waiting.
	c.ObserveEngineLoad(addr, enginemetrics.Load{Running: 2, Waiting: 2, KVUsage: 0.25, KVTokens: 100_000})
	if got, want := c.ObservedLoad()[d.Engine], int64(25_000+2*ours-ours); got != want {
		t.Errorf("observed %d, want the 25k tokens held + 2 waiting x our mean %v - our own %v = %d", got, ours, ours, want)
	}
	// The same two requests without the KV gauges count at our mean each, one of them ours.
	c.ObserveEngineLoad(addr, requests(2))
	if got, want := c.ObservedLoad()[d.Engine], int64(ours); got != want {
		t.Errorf("without KV gauges: observed %d, want one request at our mean %d", got, want)
	}
	// A cache that holds less than our own request's work: nobody else's.
	c.ObserveEngineLoad(addr, enginemetrics.Load{Running: 1, KVUsage: 0.01, KVTokens: 100_000})
	if got, ok := c.ObservedLoad()[d.Engine]; ok {
		t.Errorf("1k tokens held, ours alone is 5k: observed %d for others", got)
	}
}

// routedEngine routes a request on c (a placement core) and returns the engine it went
// to: its address, model a's table and the engine's index there.
func routedEngine(t *testing.T, c *Core) (string, *picker.Table, int) {
	t.Helper()
	d := route(t, c, 7)
	addr := addrOf(d.Engine)
	table := c.routing.Load().models["a"].table
	i, ok := table.Lookup(addr)
	if !ok {
		t.Fatalf("%s is not in model a's table", addr)
	}
	return addr, table, i
}

// The tokens a scrape finds held for running requests, and those its waiting requests
// will take, bound the room the picker sees for a prompt there (picker.Table.Room), and a
// failed scrape forgets them.
func TestObserveEngineLoadStatesTheRoomLeft(t *testing.T) {
	c := placementCore(t)
	addr, table, i := routedEngine(t, c)
	c.ObserveEngineLoad(addr, enginemetrics.Load{Running: 2, KVUsage: 0.6, KVTokens: 100_000})
	if !table.Room(i, 40_000) || table.Room(i, 40_001) {
		t.Errorf("60k of 100k held: room for 40k %v, for 40,001 %v; want true, false", table.Room(i, 40_000), table.Room(i, 40_001))
	}
	// Two requests waiting take their blocks first, each at the mean prompt of the
	// requests the core routed (one, of placementPrompt tokens).
	c.ObserveEngineLoad(addr, enginemetrics.Load{Running: 2, Waiting: 2, KVUsage: 0.6, KVTokens: 100_000})
	if left := int64(40_000 - 2*placementPrompt); !table.Room(i, left) || table.Room(i, left+1) {
		t.Errorf("60k of 100k held, two %d-token prompts waiting: room for %d %v, for %d %v; want true, false",
			placementPrompt, left, table.Room(i, left), left+1, table.Room(i, left+1))
	}
	c.ForgetEngineLoad(addr)
	c.loads.SetKVWritten(addr, 0, 100_000) // the cache's size known again, nothing held observed since
	if !table.Room(i, 100_000) {
		t.Errorf("after a failed scrape the held tokens still bound the room")
	}
}

// The rate an engine finishes requests at (vllm:request_success_total), smoothed over
// finishWindow, times the tokens a running request holds on average is the tokens per
// second its running requests free (picker.Table.Freed, for a home's wait for room); an
// engine that runs nothing frees none, one that states no finishes is not judged (-1), and
// a failed scrape forgets the rate.
func TestObserveEngineLoadStatesTheTokensFreed(t *testing.T) {
	c, clk := newPlacementCore(t)
	clk.Advance(homeWarmup)
	addr, table, i := routedEngine(t, c)
	load := func(finished float64) enginemetrics.Load { // 4 running, 80k held: 20k each
		return enginemetrics.Load{Running: 4, KVUsage: 0.8, KVTokens: 100_000, Finished: finished}
	}
	c.ObserveEngineLoad(addr, load(100))
	if got := table.Freed(i); got != 0 {
		t.Errorf("after one scrape: freed %d tokens/s, want 0 (no rate yet)", got)
	}
	// 2 finishes a second for a minute: the smoothed rate is 2/s, 40k tokens/s.
	for s := 1; s <= 60; s++ {
		clk.Advance(time.Second)
		c.ObserveEngineLoad(addr, load(100+2*float64(s)))
	}
	if got := table.Freed(i); got < 39_900 || got > 40_000 {
		t.Errorf("2 finishes a second of requests holding 20k each: freed %d tokens/s, want about 40,000", got)
	}
	// None for a finish window: the rate decays to 1/e of it.
	clk.Advance(finishWindow)
	c.ObserveEngineLoad(addr, load(220))
	if got, want := float64(table.Freed(i)), 40_000/math.E; math.Abs(got-want) > 100 {
		t.Errorf("after %s without a finish: freed %v tokens/s, want about %v", finishWindow, got, want)
	}
	nothing := load(220)
	nothing.Running, nothing.KVUsage = 0, 0
	c.ObserveEngineLoad(addr, nothing)
	if got := table.Freed(i); got != 0 {
		t.Errorf("running nothing: freed %d tokens/s, want 0", got)
	}
	c.ObserveEngineLoad(addr, load(math.NaN()))
	if got := table.Freed(i); got != -1 {
		t.Errorf("an engine that states no finishes: freed %d tokens/s, want -1 (not stated)", got)
	}
	c.ObserveEngineLoad(addr, load(230))
	c.ForgetEngineLoad(addr)
	clk.Advance(time.Second)
	c.ObserveEngineLoad(addr, load(240))
	if got := table.Freed(i); got != 0 {
		t.Errorf("the first scrape after a failed one: freed %d tokens/s, want 0 (the rate forgotten)", got)
	}
}

// Prompts in prefill (looked up, no first token yet) weigh their uncached tokens
// PrefillWeight times on top of the cache they hold, counted from what the counters said
// when the engine was last idle, less the share of its lookups the prefix cache served
// since the previous scrape (halved toward the one before); an engine without
// vllm:prompt_tokens_total is weighed as before, and a failed scrape forgets the idle mark.
func TestObserveEngineLoadWeighsPromptsInPrefill(t *testing.T) {
	c := placementCore(t)
	d := route(t, c, 7)
	ours := float64(placementPrompt + DefaultDecodeWork)
	addr := addrOf(d.Engine)
	w := float64(DefaultPrefillWeight)
	nan := math.NaN()
	load := func(running, queries, hits, prompts float64) enginemetrics.Load {
		return enginemetrics.Load{Running: running, KVUsage: 0.25, KVTokens: 100_000,
			PrefixQueries: queries, PromptTokens: prompts, PrefixHits: hits, GenerationTokens: 0}
	}
	observed := func() float64 { return float64(c.ObservedLoad()[d.Engine]) }
	// Idle, with 3,000 prompt tokens looked up twice in the counters' past.
	c.ObserveEngineLoad(addr, load(0, 53_000, 0, 50_000))
	// Then 20k tokens scheduled, none found cached, 12k of them past their first token:
	// 8k in prefill.
	c.ObserveEngineLoad(addr, load(3, 73_000, 0, 62_000))
	if got, want := observed(), 25_000+w*8_000-ours; got != want {
		t.Errorf("observed %v, want 25k held + %v x 8k in prefill - our own %v = %v", got, w, ours, want)
	}
	// 10k more scheduled, all found cached; 2k more answered: 16k in prefill, of which
	// the engine's cache serves half (the 10k of 10k since the last scrape, halved toward
	// the 0 of 20k before, the first share measured).
	c.ObserveEngineLoad(addr, load(3, 83_000, 10_000, 64_000))
	if got, want := observed(), 25_000+w*16_000*0.5-ours; got != want {
		t.Errorf("half the lookups cached: observed %v, want 25k held + %v x 16k x 0.5 - our own = %v", got, w, want)
	}
	c.ObserveEngineLoad(addr, load(3, 83_000, 10_000, nan))
	if got, want := observed(), 25_000-ours; got != want {
		t.Errorf("without the prompt counter: observed %v, want 25k held - our own = %v", got, want)
	}
	// After a failed scrape the idle mark and the cache's share are gone: the whole
	// difference counts until the engine is seen idle again.
	c.ForgetEngineLoad(addr)
	c.ObserveEngineLoad(addr, load(3, 73_000, 0, 62_000))
	if got, want := observed(), 25_000+w*11_000-ours; got != want {
		t.Errorf("after a failed scrape: observed %v, want 25k held + %v x 11k - our own = %v", got, w, want)
	}
	// The first share measured after it is taken as it is, not halved toward nothing: 10k
	// more scheduled, all found cached, and the engine's prefill is all cache.
	c.ObserveEngineLoad(addr, load(3, 83_000, 10_000, 64_000))
	if got, want := observed(), 25_000-ours; got != want {
		t.Errorf("first share after a failed scrape, all cached: observed %v, want 25k held - our own = %v", got, want)
	}
	// With PrefillWeight 0 prompts in prefill weigh only what they hold.
	flat := placementCoreWith(t, func(cfg *Config) { cfg.PrefillWeight = 0 })
	fd := route(t, flat, 7)
	flat.ObserveEngineLoad(addrOf(fd.Engine), load(0, 53_000, 0, 50_000))
	flat.ObserveEngineLoad(addrOf(fd.Engine), load(3, 73_000, 0, 62_000))
	if got, want := float64(flat.ObservedLoad()[fd.Engine]), 25_000-ours; got != want {
		t.Errorf("prefill weight 0: observed %v, want 25k held - our own = %v", got, want)
	}
}

// With Config.MarkTokens, the prefix marks of a request the core steers count as pinned
// on its engine while it is in flight, so that a prompt opening with the same prefix needs
// room there only for the rest of it; the request's end releases them. Without it the
// core keeps no pins.
func TestRoutedRequestsPinTheirMarksUntilTheyEnd(t *testing.T) {
	c := placementCoreWith(t, func(cfg *Config) { cfg.MarkTokens = 1_000 })
	marks := make([]uint64, 20)
	for i := range marks {
		marks[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	d := c.Route(Request{Model: "a", Key: 11, BodyBytes: 20_000 * BytesPerToken, Marks: marks}, make([]int, 0, 8))
	if d.Verdict != Steer {
		t.Fatalf("verdict %v", d.Verdict)
	}
	addr := addrOf(d.Engine)
	table := c.routing.Load().models["a"].table
	i, _ := table.Lookup(addr)
	if got := c.pins.Pinned(table, i, marks); got != len(marks) {
		t.Errorf("in flight: %d of its %d marks pinned on %s", got, len(marks), d.Engine)
	}
	if got := c.pins.Pinned(table, i, marks[:5]); got != 5 {
		t.Errorf("a prompt of its first 5 marks: %d pinned, want 5", got)
	}
	c.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addr, Status: 200, Attempts: 1})
	if got := c.pins.Pinned(table, i, marks); got != 0 {
		t.Errorf("after its outcome: %d marks still pinned", got)
	}
	off := placementCore(t)
	if off.pins != nil {
		t.Errorf("a core without MarkTokens keeps pins")
	}
	bad := off.cfg
	bad.MarkTokens = -1
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "mark tokens") {
		t.Errorf("negative mark tokens: %v, want an error naming them", err)
	}
}
