package sim

import (
	"slices"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// The llm-d router's endpoint picker (EPP), as its default configuration ships. Read from
// github.com/llm-d/llm-d-router:
//   - pkg/epp/config/loader/defaults.go (commit 0b59e4ed): the default scheduling profile
//     is queue-scorer weight 2, kv-cache-utilization-scorer weight 2, prefix-cache-scorer
//     weight 3, and a max-score-picker;
//   - pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue.go (commit 2342697f):
//     waiting-queue depth min-max normalized over the endpoints with metrics, the shortest
//     scoring 1, all-equal queues scoring 1, endpoints without metrics unscored;
//   - .../scorer/kvcacheutilization/README.md (commit e05ae34e): 1 - KV-cache usage;
//   - .../scorer/prefix/README.md (commit 068b68d0): matched blocks over the prompt's
//     blocks (prefixLengthWeight 0 by default);
//   - .../requestcontrol/dataproducer/approximateprefix/plugin.go (commit 09a534fc): the
//     approximate producer hashes the prompt in blocks of at least 64 tokens (vLLM's 16 is
//     raised to minBlockSizeTokens 64), caps the match at maxPrefixTokensToMatch 131072
//     tokens, matches greedily (for each block in order, every endpoint indexed with it
//     gains one, stopping at the first block no endpoint has), and after each pick records
//     the request's blocks for the chosen endpoint only, in a per-endpoint LRU whose
//     capacity is autotuned to the endpoint's num_gpu_blocks (its vLLM 16-token blocks);
//   - .../dataproducer/preciseprefixcache/README.md (commit 0539d49a): the precise producer
//     indexes the engines' KV events (in llm-d-kv-cache's default blocks of 16 tokens,
//     vLLM's block size), scores
//     each endpoint by its consecutive cached blocks from the prompt's start, and every
//     EPP replica subscribes to the engines and builds its own index; speculative
//     indexing is off by default;
//   - .../scheduling/picker/maxscore/picker.go (commit 0fa77a00): highest total score
//     first, ties rotated round robin;
//   - the EPP's --refresh-metrics-interval defaults to 50 ms.
//
// Each EPP replica keeps its own approximate index (nothing synchronizes them by default);
// every replica scrapes the same engines.
const (
	llmdQueueWeight       = 2.0
	llmdKVUsageWeight     = 2.0
	llmdPrefixWeight      = 3.0
	llmdApproxBlockTokens = 64
	llmdPreciseBlockToks  = 16
	llmdMaxPrefixTokens   = 131072
	llmdScrapePeriod      = 50 * time.Millisecond
	// vllmBlockTokens is vLLM's KV block size, which num_gpu_blocks counts.
	vllmBlockTokens = 16
)

// llmd is one EPP replica over one pool's engines, with the approximate prefix producer
// (precise false) or the precise one fed by KV events (precise true).
type llmd struct {
	health
	precise   bool
	idxTokens int // the index's block size in tokens
	maxBlocks int // the match cap, in trace blocks
	approx    []*hashLRU
	cached    []blockSet
	waiting   []int
	kvUsage   []float64
	scraped   []bool
	matched   []int
	score     []float64
	order     []int
	rotations int
}

var (
	_ KVEventSubscriber = (*llmd)(nil)
	_ Scraper           = (*llmd)(nil)
)

func newLLMD(f fleetShape, env poolEnv, precise bool) *llmd {
	p := &llmd{health: newHealth(f, env.cfg.Retries), precise: precise, idxTokens: llmdApproxBlockTokens,
		maxBlocks: llmdMaxPrefixTokens / trace.BlockTokens, waiting: make([]int, f.engines),
		kvUsage: make([]float64, f.engines), scraped: make([]bool, f.engines), matched: make([]int, f.engines),
		score: make([]float64, f.engines)}
	if precise {
		p.idxTokens = llmdPreciseBlockToks
		for range f.engines {
			p.cached = append(p.cached, blockSet{})
		}
	} else {
		// autoTune: the LRU holds num_gpu_blocks entries of idxTokens tokens each, counted
		// here in the trace's blocks.
		entries := env.cfg.Engine.KVBlocks * env.cfg.Engine.BlockTokens / vllmBlockTokens
		capacity := max(1, entries*llmdApproxBlockTokens/trace.BlockTokens)
		for range f.engines {
			p.approx = append(p.approx, newHashLRU(capacity))
		}
	}
	return p
}

func (p *llmd) Route(_ time.Duration, r *Request) Route {
	blocks := r.Blocks[:min(len(r.Blocks), p.maxBlocks)]
	p.match(blocks)
	total := min(r.InputTokens, llmdMaxPrefixTokens) / p.idxTokens // full index blocks only
	qmin, qmax, any := 0, 0, false
	for e := range p.f.engines {
		if p.up[e] && p.scraped[e] {
			if !any || p.waiting[e] < qmin {
				qmin = p.waiting[e]
			}
			if !any || p.waiting[e] > qmax {
				qmax = p.waiting[e]
			}
			any = true
		}
	}
	p.order = p.order[:0]
	for e := range p.f.engines {
		if !p.up[e] {
			continue
		}
		s := 0.0
		if p.scraped[e] {
			q := 1.0
			if qmax > qmin {
				q = float64(qmax-p.waiting[e]) / float64(qmax-qmin)
			}
			s += llmdQueueWeight*q + llmdKVUsageWeight*(1-p.kvUsage[e])
		}
		if total > 0 {
			m := min(p.matched[e]*trace.BlockTokens/p.idxTokens, total)
			s += llmdPrefixWeight * float64(m) / float64(total)
		}
		p.score[e] = s
		p.order = append(p.order, e)
	}
	p.pick()
	if !p.precise && len(p.order) > 0 {
		for _, h := range blocks {
			p.approx[p.order[0]].add(h)
		}
	}
	return p.route(slices.Clone(p.order))
}

// match sets p.matched[e] to the prompt blocks endpoint e is credited with.
func (p *llmd) match(blocks []uint64) {
	clear(p.matched)
	if p.precise {
		for e := range p.f.engines {
			p.matched[e] = p.cached[e].leading(blocks)
		}
		return
	}
	for _, h := range blocks {
		found := false
		for e, idx := range p.approx {
			if idx.contains(h) {
				p.matched[e]++
				found = true
			}
		}
		if !found {
			return
		}
	}
}

// pick orders p.order by score, highest first, rotating each tier of equal scores by a
// counter so ties go round robin.
func (p *llmd) pick() {
	slices.SortStableFunc(p.order, func(a, b int) int {
		switch {
		case p.score[a] > p.score[b]:
			return -1
		case p.score[a] < p.score[b]:
			return 1
		}
		return 0
	})
	if n := tieLen(p.order, p.score); n > 1 {
		k := p.rotations % n
		slices.Reverse(p.order[:k])
		slices.Reverse(p.order[k:n])
		slices.Reverse(p.order[:n])
	}
	p.rotations++
}

// tieLen is how many leading engines of order share the first one's score.
func tieLen(order []int, score []float64) int {
	n := 0
	for n < len(order) && score[order[n]] == score[order[0]] {
		n++
	}
	return n
}

func (p *llmd) Observe(time.Duration, Outcome) {}

func (p *llmd) Tick(now time.Duration, v *View) {
	p.tick(v)
	p.Scrape(now, v)
}

// ScrapePeriod is the EPP's default --refresh-metrics-interval.
func (p *llmd) ScrapePeriod() time.Duration { return llmdScrapePeriod }

// Scrape reads the endpoints' waiting queues and KV-cache usage.
func (p *llmd) Scrape(_ time.Duration, v *View) {
	for e, ev := range v.Engines {
		p.scraped[e] = ev.Up
		p.waiting[e], p.kvUsage[e] = ev.Waiting, ev.KVUsage
	}
}

// KVEvents feeds the precise index; the approximate producer does not subscribe.
func (p *llmd) KVEvents(_ time.Duration, e int, events []engine.KVEvent) {
	if p.precise {
		p.cached[e].apply(events)
	}
}

func (p *llmd) Weights(_ int, dst []float64) { p.uniform(dst) }
