package sim

import (
	"cmp"
	"slices"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

// SGLang's cache-aware router (sgl-router, now SGLang Model Gateway) with its defaults.
// Read from github.com/sgl-project/sglang:
//   - sgl-router/src/policies/cache_aware.rs (commit 026f853b): each router keeps an
//     approximate radix tree of the request texts it sent to each worker, and its own
//     count of each worker's requests in flight (its load). The system is imbalanced when
//     max load - min load > balance_abs_threshold and max load > balance_rel_threshold x
//     min load; then the request goes to the least-loaded healthy worker (the shortest
//     queue). Otherwise the worker with the longest prefix match in the tree wins if the
//     match covers more than cache_threshold of the request's text, else the worker whose
//     tree is smallest (the most cache room). Either way the text is inserted into the
//     chosen worker's tree; a chosen worker that is unhealthy falls back to the first
//     healthy one. Every eviction_interval_secs the trees are trimmed, least recently
//     used leaves first, to max_tree_size characters per worker.
//   - sgl-router/src/main.rs (commit 0129b029): the defaults of the router a user launches
//     (cache_aware policy, cache_threshold 0.3, balance_abs_threshold 64,
//     balance_rel_threshold 1.5, eviction_interval 120 s, max_tree_size 67,108,864
//     characters). The library's CacheAwareConfig::default (0.5, 32, 1.1, 30 s, 10,000)
//     only applies when the policy is built from code.
//
// The trees here hold the trace's 512-token blocks rather than characters (a request
// without block hashes is one unique node of its length), at 4 characters a token for
// max_tree_size. Nothing synchronizes the trees or loads of several router replicas by
// default (the gateway's mesh/HA sync is opt-in). Health is what every policy here sees
// at each tick, not the router's 60 s health-check interval.
const (
	sglangCacheThreshold   = 0.3
	sglangBalanceAbs       = 64
	sglangBalanceRel       = 1.5
	sglangEvictionInterval = 120 * time.Second
	sglangMaxTreeChars     = 67_108_864
	sglangCharsPerToken    = 4
)

// sglang is one router replica over one pool's engines.
type sglang struct {
	health
	load      []int
	trees     []sgTree
	sent      map[int]int // request ID -> engine it is in flight on
	lastEvict time.Duration
	order     []int
}

// sgTree is one worker's approximate tree: the prompt blocks sent to it.
type sgTree struct {
	nodes  map[uint64]*sgNode
	tokens int
}

type sgNode struct {
	last   time.Duration
	depth  int
	tokens int
}

func newSGLang(f fleetShape, env poolEnv) *sglang {
	p := &sglang{health: newHealth(f, env.cfg.Retries), load: make([]int, f.engines), sent: map[int]int{}}
	for range f.engines {
		p.trees = append(p.trees, sgTree{nodes: map[uint64]*sgNode{}})
	}
	return p
}

// textBlocks calls fn for each node of r's text: its key and its length in tokens.
func textBlocks(r *Request, fn func(i int, key uint64, tokens int) bool) {
	if len(r.Blocks) == 0 {
		fn(0, mix(uint64(r.ID), 0x5c1a), r.InputTokens)
		return
	}
	for i, h := range r.Blocks {
		if !fn(i, h, min(trace.BlockTokens, r.InputTokens-i*trace.BlockTokens)) {
			return
		}
	}
}

// matched is how many leading tokens of r's text engine e's tree holds, and when its
// deepest matching node was last used.
func (p *sglang) matched(e int, r *Request) (tokens int, last time.Duration) {
	t := p.trees[e]
	textBlocks(r, func(_ int, key uint64, n int) bool {
		node, ok := t.nodes[key]
		if !ok {
			return false
		}
		tokens += max(n, 0)
		last = node.last
		return true
	})
	return tokens, last
}

func (p *sglang) Route(now time.Duration, r *Request) Route {
	chosen := p.choose(r)
	if chosen < 0 {
		return Route{}
	}
	if p.up[chosen] {
		p.insert(now, chosen, r)
	} else {
		chosen = slices.Index(p.up, true) // fall back to the first healthy worker
	}
	// Retries go to the least loaded of the others.
	p.order = append(p.order[:0], chosen)
	for e := range p.f.engines {
		if p.up[e] && e != chosen {
			p.order = append(p.order, e)
		}
	}
	slices.SortStableFunc(p.order[1:], func(a, b int) int { return p.load[a] - p.load[b] })
	return p.route(slices.Clone(p.order))
}

// choose is the cache-aware policy's pick, -1 when no worker is healthy.
func (p *sglang) choose(r *Request) int {
	if !slices.Contains(p.up, true) {
		return -1
	}
	maxLoad, minLoad := slices.Max(p.load), slices.Min(p.load)
	if maxLoad-minLoad > sglangBalanceAbs && float64(maxLoad) > float64(minLoad)*sglangBalanceRel {
		best := -1
		for e := range p.f.engines {
			if p.up[e] && (best < 0 || p.load[e] < p.load[best]) {
				best = e
			}
		}
		return best
	}
	best, bestTokens, bestLast := -1, 0, time.Duration(0)
	for e := range p.f.engines {
		n, last := p.matched(e, r)
		if n > bestTokens || (n == bestTokens && n > 0 && last > bestLast) {
			best, bestTokens, bestLast = e, n, last
		}
	}
	if r.InputTokens > 0 && float64(bestTokens)/float64(r.InputTokens) > sglangCacheThreshold {
		return best
	}
	smallest := 0
	for e := range p.f.engines {
		if p.trees[e].tokens < p.trees[smallest].tokens {
			smallest = e
		}
	}
	return smallest
}

// insert adds r's text to engine e's tree, refreshing the nodes it shares.
func (p *sglang) insert(now time.Duration, e int, r *Request) {
	t := &p.trees[e]
	textBlocks(r, func(i int, key uint64, n int) bool {
		if node, ok := t.nodes[key]; ok {
			node.last = now
			return true
		}
		t.nodes[key] = &sgNode{last: now, depth: i, tokens: n}
		t.tokens += n
		return true
	})
}

func (p *sglang) Observe(_ time.Duration, o Outcome) {
	switch o.Kind {
	case Sent:
		if e, ok := p.sent[o.Request.ID]; ok {
			p.load[e]--
		}
		p.sent[o.Request.ID] = o.Engine
		p.load[o.Engine]++
	case Done, Failed:
		if e, ok := p.sent[o.Request.ID]; ok {
			p.load[e]--
			delete(p.sent, o.Request.ID)
		}
	}
}

func (p *sglang) Tick(now time.Duration, v *View) {
	p.tick(v)
	if now-p.lastEvict >= sglangEvictionInterval {
		p.lastEvict = now
		for e := range p.trees {
			p.trees[e].evict(sglangMaxTreeChars / sglangCharsPerToken)
		}
	}
}

// evict drops least recently used leaves until the tree holds at most limit tokens. A
// node is used whenever a deeper one is, so by last use, deepest first, leaves go first.
func (t *sgTree) evict(limit int) {
	if t.tokens <= limit {
		return
	}
	type entry struct {
		key  uint64
		node *sgNode
	}
	all := make([]entry, 0, len(t.nodes))
	for k, n := range t.nodes {
		all = append(all, entry{k, n})
	}
	slices.SortFunc(all, func(a, b entry) int {
		if c := cmp.Compare(a.node.last, b.node.last); c != 0 {
			return c
		}
		if c := cmp.Compare(b.node.depth, a.node.depth); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	})
	for _, en := range all {
		if t.tokens <= limit {
			return
		}
		delete(t.nodes, en.key)
		t.tokens -= en.node.tokens
	}
}

func (p *sglang) Weights(_ int, dst []float64) { p.uniform(dst) }
