package sim

import (
	"math"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// anchorEnv is a replica environment on the calibrated A100 engine, no retries.
func anchorEnv() poolEnv {
	return poolEnv{cfg: &Config{Engine: engine.A100Llama8B(trace.BlockTokens)}, seed: 1}
}

// req is a request of n whole trace blocks starting at hash first.
func req(id int, first uint64, n int) *Request {
	r := &Request{ID: id, InputTokens: n * trace.BlockTokens, OutputTokens: 10}
	for i := range n {
		r.Blocks = append(r.Blocks, first+uint64(i))
	}
	return r
}

func sent(p Policy, r *Request, e int) { p.Observe(0, Outcome{Kind: Sent, Request: r, Engine: e}) }

func TestSGLangBalanceThresholdFlipsToShortestQueue(t *testing.T) {
	tests := []struct {
		name         string
		load0, load1 int
		want         int
	}{
		// max - min = 60 <= 64: balanced, so the full prefix match on engine 0 wins.
		{"abs threshold not crossed", 70, 10, 0},
		// max - min = 90 > 64 and 100 > 1.5 x 10: imbalanced, shortest queue.
		{"both thresholds crossed", 100, 10, 1},
		// max - min = 70 > 64 but 300 <= 1.5 x 230: still balanced.
		{"rel threshold not crossed", 300, 230, 0},
	}
	for _, tc := range tests {
		p := newSGLang(fleetShape{clusters: 1, engines: 2}, anchorEnv())
		p.insert(0, 0, req(0, 100, 4)) // engine 0's tree holds the prompt, engine 1's nothing
		p.load[0], p.load[1] = tc.load0, tc.load1
		if got := p.Route(time.Second, req(1, 100, 4)).Engines[0]; got != tc.want {
			t.Errorf("%s (loads %d, %d): routed to %d, want %d", tc.name, tc.load0, tc.load1, got, tc.want)
		}
	}
}

func TestSGLangCacheThreshold(t *testing.T) {
	p := newSGLang(fleetShape{clusters: 1, engines: 2}, anchorEnv())
	p.insert(0, 0, req(0, 100, 1)) // engine 0: the prompt's first block ...
	p.insert(0, 0, req(1, 200, 3)) // ... and 3 other blocks: 2048 tokens
	p.insert(0, 1, req(2, 900, 2)) // engine 1: 1024 tokens
	// One block of four matches on engine 0: 25% <= cache_threshold 0.3, so the request
	// goes to the smallest tree, engine 1.
	if got := p.Route(time.Second, req(3, 100, 4)).Engines[0]; got != 1 {
		t.Errorf("25%% match: routed to %d, want the smallest tree, 1", got)
	}
	// Engine 1 now holds 6 blocks, engine 0 four. Two of three blocks (67%) match on
	// engine 1: it wins though its tree is bigger; a prompt matching nowhere goes to 0.
	if got := p.Route(time.Second, req(4, 900, 3)).Engines[0]; got != 1 {
		t.Errorf("2-of-3 match on engine 1: routed to %d", got)
	}
	if got := p.Route(time.Second, req(5, 5000, 2)).Engines[0]; got != 0 {
		t.Errorf("no match: routed to %d, want the smallest tree, 0", got)
	}
	// Loads are the router's own requests in flight.
	r := req(6, 7000, 1)
	sent(p, r, 1)
	if p.load[1] != 1 {
		t.Errorf("load after a send: %v", p.load)
	}
	p.Observe(0, Outcome{Kind: Done, Request: r, Engine: 1})
	if p.load[1] != 0 || len(p.sent) != 0 {
		t.Errorf("load after a finished request: %v, %v", p.load, p.sent)
	}
}

func TestSGLangEvictsLeastRecentlyUsedLeaves(t *testing.T) {
	p := newSGLang(fleetShape{clusters: 1, engines: 1}, anchorEnv())
	p.insert(1, 0, req(0, 100, 3)) // 100 -> 101 -> 102 at t=1
	p.insert(2, 0, req(1, 100, 1)) // 100 refreshed at t=2
	p.trees[0].evict(2 * trace.BlockTokens)
	if _, ok := p.trees[0].nodes[102]; ok || p.trees[0].tokens != 2*trace.BlockTokens {
		t.Errorf("after eviction to 2 blocks: %v, %d tokens", p.trees[0].nodes, p.trees[0].tokens)
	}
	if _, ok := p.trees[0].nodes[100]; !ok {
		t.Error("the recently used root was evicted")
	}
}

func TestDynamoOverlapWinsUntilDecodeLoadOutweighsIt(t *testing.T) {
	p := newDynamo(fleetShape{clusters: 1, engines: 2}, anchorEnv())
	// Engine 0 reported 4 blocks of the 5-block prompt as stored.
	var evs []engine.KVEvent
	for h := uint64(100); h < 104; h++ {
		evs = append(evs, engine.KVEvent{Kind: engine.BlockStored, Hash: h})
	}
	p.KVEvents(0, 0, evs)
	prompt := req(1, 100, 5) // 2560 tokens = 160 vLLM blocks
	// Engine 0: prefill (2560 - 2048)/16 = 32, decode 5 x 32 = 160: cost 192.
	// Engine 1: prefill 2560/16 = 160, decode 160: cost 320.
	if c0, c1 := p.Cost(0, prompt), p.Cost(1, prompt); c0 != 192 || c1 != 320 {
		t.Fatalf("costs %v, %v; want 192, 320", c0, c1)
	}
	if got := p.Route(0, prompt).Engines[0]; got != 0 {
		t.Fatalf("routed to %d, want the engine with the overlap", got)
	}
	// A 3-block request of other blocks in flight on engine 0 adds 1536/16 = 96 prefill
	// and 96 decode blocks: 192 + 192 = 384 > 320, so engine 1 wins.
	other := req(2, 500, 3)
	sent(p, other, 0)
	if c0 := p.Cost(0, prompt); c0 != 384 {
		t.Fatalf("loaded cost %v, want 384", c0)
	}
	if got := p.Route(0, prompt).Engines[0]; got != 1 {
		t.Errorf("routed to %d with engine 0 loaded, want 1", got)
	}
	// Its first token ends its prefill load (decode blocks stay): 288 < 320, back to 0.
	p.Observe(0, Outcome{Kind: FirstToken, Request: other, Engine: 0})
	if got := p.Route(0, prompt).Engines[0]; got != 0 {
		t.Errorf("routed to %d after the other request's prefill, want 0", got)
	}
	// Completion frees its blocks; eviction events remove the overlap.
	p.Observe(0, Outcome{Kind: Done, Request: other, Engine: 0})
	if c0 := p.Cost(0, prompt); c0 != 192 {
		t.Errorf("cost after completion %v, want 192", c0)
	}
	p.KVEvents(0, 0, []engine.KVEvent{{Kind: engine.AllBlocksCleared}})
	if c0 := p.Cost(0, prompt); c0 != 320 {
		t.Errorf("cost after AllBlocksCleared %v, want 320", c0)
	}
}

func TestLLMDWeightedScore(t *testing.T) {
	scrape := func(p *llmd, waiting [2]int, kv [2]float64) {
		v := &View{Engines: []EngineView{{Up: true, Waiting: waiting[0], KVUsage: kv[0]},
			{Up: true, Waiting: waiting[1], KVUsage: kv[1]}}}
		p.Scrape(0, v)
	}
	p := newLLMD(fleetShape{clusters: 1, engines: 2}, anchorEnv(), false)
	prompt := req(1, 100, 4)
	for _, h := range prompt.Blocks {
		p.approx[0].add(h) // engine 0 has served this prefix
	}
	// Engine 0: queue 2 x 0 + KV 2 x (1 - 0.9) + prefix 3 x 1 = 3.2.
	// Engine 1: queue 2 x 1 + KV 2 x (1 - 0.1) + prefix 0 = 3.8.
	scrape(p, [2]int{10, 0}, [2]float64{0.9, 0.1})
	if got := p.Route(0, prompt).Engines[0]; got != 1 {
		t.Errorf("3.2 vs 3.8: routed to %d, want 1", got)
	}
	if math.Abs(p.score[0]-3.2) > 1e-9 || math.Abs(p.score[1]-3.8) > 1e-9 {
		t.Errorf("scores %v, want [3.2 3.8]", p.score)
	}
	// With engine 0 at KV usage 0.5 instead: 0 + 1.0 + 3 = 4.0 > 3.8, so the prefix wins.
	p = newLLMD(fleetShape{clusters: 1, engines: 2}, anchorEnv(), false)
	for _, h := range prompt.Blocks {
		p.approx[0].add(h)
	}
	scrape(p, [2]int{10, 0}, [2]float64{0.5, 0.1})
	if got := p.Route(0, prompt).Engines[0]; got != 0 {
		t.Errorf("4.0 vs 3.8: routed to %d, want 0", got)
	}
	// Its own decision fed the approximate index: a new prompt routed to engine 1 is
	// matched there next time.
	fresh := req(2, 900, 2)
	scrape(p, [2]int{5, 0}, [2]float64{0.5, 0.5})
	first := p.Route(0, fresh).Engines[0]
	if first != 1 || !p.approx[1].contains(900) || p.approx[0].contains(900) {
		t.Errorf("fresh prompt to %d; index has it on 1: %v, on 0: %v", first, p.approx[1].contains(900), p.approx[0].contains(900))
	}
}

func TestLLMDPreciseUsesKVEventsOnly(t *testing.T) {
	p := newLLMD(fleetShape{clusters: 1, engines: 2}, anchorEnv(), true)
	p.Scrape(0, &View{Engines: []EngineView{{Up: true}, {Up: true}}})
	prompt := req(1, 100, 2)
	// Equal scores: ties rotate, so two routes visit both engines.
	a, b := p.Route(0, prompt).Engines[0], p.Route(0, prompt).Engines[0]
	if a == b {
		t.Errorf("ties did not rotate: %d then %d", a, b)
	}
	// Routing taught the precise index nothing; a stored event does.
	p.KVEvents(0, 1, []engine.KVEvent{{Kind: engine.BlockStored, Hash: 100}, {Kind: engine.BlockStored, Hash: 101}})
	for range 3 {
		if got := p.Route(0, prompt).Engines[0]; got != 1 {
			t.Fatalf("routed to %d, want engine 1, which reported the blocks", got)
		}
	}
	// 2 blocks of 512 tokens = 64 of 16 tokens, all matched: prefix score 3.
	if p.score[1]-p.score[0] != llmdPrefixWeight {
		t.Errorf("scores %v: prefix term %v, want %v", p.score, p.score[1]-p.score[0], llmdPrefixWeight)
	}
	p.KVEvents(0, 1, []engine.KVEvent{{Kind: engine.BlockRemoved, Hash: 100}})
	if p.match(prompt.Blocks); p.matched[1] != 0 {
		t.Errorf("match after the first block's removal: %d, want 0", p.matched[1])
	}
}

func TestHashLRUEvictsLeastRecentlyUsed(t *testing.T) {
	l := newHashLRU(2)
	l.add(1)
	l.add(2)
	l.add(1) // 2 is now the oldest
	l.add(3)
	if !l.contains(1) || l.contains(2) || !l.contains(3) {
		t.Errorf("after 1, 2, 1, 3 in a 2-entry LRU: 1 %v, 2 %v, 3 %v", l.contains(1), l.contains(2), l.contains(3))
	}
}

func TestKVEventsReachSubscribersAfterTheDelay(t *testing.T) {
	hit := func(delay time.Duration) float64 {
		cfg := testSimConfig(t, conversationTrace(400, 6), Steady)
		cfg.Policies, cfg.KVEventDelay = []string{"llm-d-precise"}, delay
		res, _, err := Run(t.Context(), cfg, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		return res[0].KVHitRate
	}
	// Events that never arrive leave the precise scorer blind to every cache.
	prompt, never := hit(10*time.Millisecond), hit(24*time.Hour)
	t.Logf("hit rate %.3f with events, %.3f without", prompt, never)
	if !(prompt > never+0.05) {
		t.Errorf("hit rate with events after 10 ms %.3f, never %.3f", prompt, never)
	}
}

// The oracle sends a request where its prefill would end first: to the engine that caches
// its prompt, until the prefill queued there outweighs the prefill it saves; and a request
// it sent leaves that queue at its first token.
func TestOracleWeighsCachedPrefixAgainstQueuedPrefill(t *testing.T) {
	p := newOracle(fleetShape{clusters: 1, engines: 2}, anchorEnv())
	var stored []engine.KVEvent
	for h := uint64(100); h < 108; h++ {
		stored = append(stored, engine.KVEvent{Kind: engine.BlockStored, Hash: h})
	}
	p.KVEvents(0, 0, stored) // engine 0 caches all 8 blocks of the prompt (4096 tokens)
	if got := p.Route(time.Second, req(1, 100, 8)).Engines[0]; got != 0 {
		t.Fatalf("nothing queued: routed to %d, want the engine with the prompt cached, 0", got)
	}
	// 3 blocks (1536 tokens) queued on engine 0 cost less than the 4095 it saves...
	q := req(2, 500, 3)
	sent(p, q, 0)
	if got := p.Route(time.Second, req(3, 100, 8)).Engines[0]; got != 0 {
		t.Errorf("1536 tokens queued on the cached engine: routed to %d, want 0", got)
	}
	// ... 10 more (5120) cost more.
	big := req(4, 900, 10)
	sent(p, big, 0)
	if got := p.Route(time.Second, req(5, 100, 8)).Engines[0]; got != 1 {
		t.Errorf("6656 tokens queued on the cached engine: routed to %d, want the idle one, 1", got)
	}
	p.Observe(0, Outcome{Kind: FirstToken, Request: big, Engine: 0})
	if got := p.Route(time.Second, req(6, 100, 8)).Engines[0]; got != 0 {
		t.Errorf("the long prompt past its first token: routed to %d, want 0 again", got)
	}
	if p.decode[0] != 1 || math.Abs(p.pending[0]-1536) > 1e-9 {
		t.Errorf("engine 0: %d decoding, %v tokens pending; want 1 and 1536", p.decode[0], p.pending[0])
	}
}
