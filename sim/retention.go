package sim

import (
	"math"

	"github.com/meridian-router/meridian/sim/engine"
)

// Home retention: how much of a prompt the engine its routing key last went to still holds
// when the key's next request arrives, by how much that engine has written into its KV cache
// since. It measures the premise of meridian's homes (picker.Homes): a home keeps a key
// until its engine has written a cache's worth of tokens since the placement, on the
// grounds that LRU eviction has taken the context by then and not before. The key is the
// one meridian's sidecars route by (Request.LadderKey, or its parent when the key itself
// has not been seen, as decide.Core looks them up); the measure is the same for every
// policy, as it is of the engines' caches, not of meridian's state.

// retentionStep is the width of a bucket, as a share of the engine's KV cache written
// since the key's previous request reached it; the last bucket holds everything from
// retentionBuckets-1 steps up.
const (
	retentionStep    = 0.25
	retentionBuckets = 9
)

// RetentionBucket is one band of Result.HomeRetention.
type RetentionBucket struct {
	// WritesFrom and WritesTo bound the tokens the engine wrote into its KV cache between
	// the key's previous request reaching it and this one arriving, as a share of the
	// cache; WritesTo is omitted on the last band, which is open.
	WritesFrom float64 `json:"writes_from"`
	WritesTo   float64 `json:"writes_to,omitempty"`
	// Requests is how many requests found their key's previous engine in the band.
	Requests int `json:"requests"`
	// PromptCached is the mean share of their prompts' blocks that engine held, counted
	// from the first block to the first missing one (what a prefix cache can serve).
	PromptCached float64 `json:"prompt_cached"`
	// Returned is the share of them the policy sent to that engine again.
	Returned float64 `json:"returned"`
}

type retentionPlace struct {
	engine  int
	written uint64
}

// retention accumulates Result.HomeRetention over a run.
type retention struct {
	last        map[uint64]retentionPlace
	n, returned [retentionBuckets]int
	cached      [retentionBuckets]float64
}

// written is the tokens eng has written into its KV cache: the prompt tokens its prefix
// cache did not hold plus the tokens it generated (enginemetrics.Load.KVWritten's sum).
func written(eng *engine.Engine) uint64 {
	q, h := eng.PrefixCounters()
	return q - h + eng.GenerationTokens()
}

// observe records request r reaching engine e (engines[e]): before the engine has looked
// at its prompt, what the key's previous engine holds of it.
func (rt *retention) observe(r *Request, e int, engines []*slot) {
	if len(r.Blocks) == 0 {
		return
	}
	if rt.last == nil {
		rt.last = map[uint64]retentionPlace{}
	}
	prev, ok := rt.last[r.LadderKey]
	if !ok && r.ParentKey != 0 {
		prev, ok = rt.last[r.ParentKey]
	}
	if ok {
		eng := engines[prev.engine].eng
		cfg := eng.Config()
		capacity := float64(cfg.KVBlocks * cfg.BlockTokens)
		since := float64(written(eng) - prev.written)
		b := min(int(since/capacity/retentionStep), retentionBuckets-1)
		held := 0
		for _, h := range r.Blocks {
			if !eng.Cached(h) {
				break
			}
			held++
		}
		rt.n[b]++
		rt.cached[b] += float64(held) / float64(len(r.Blocks))
		if prev.engine == e {
			rt.returned[b]++
		}
	}
	rt.last[r.LadderKey] = retentionPlace{engine: e, written: written(engines[e].eng)}
}

// result returns the bands that saw requests, in order.
func (rt *retention) result() []RetentionBucket {
	var out []RetentionBucket
	for b := range retentionBuckets {
		if rt.n[b] == 0 {
			continue
		}
		rb := RetentionBucket{WritesFrom: float64(b) * retentionStep, Requests: rt.n[b],
			PromptCached: rt.cached[b] / float64(rt.n[b]), Returned: float64(rt.returned[b]) / float64(rt.n[b])}
		if b < retentionBuckets-1 {
			rb.WritesTo = float64(b+1) * retentionStep
		}
		out = append(out, rb)
	}
	return out
}

// poolRetention pools the runs' home-retention bands: each band's requests summed, its
// shares weighted by them.
func poolRetention(rs []Result) []RetentionBucket {
	var rt retention
	for _, r := range rs {
		for _, b := range r.HomeRetention {
			i, n := int(math.Round(b.WritesFrom/retentionStep)), float64(b.Requests)
			rt.n[i] += b.Requests
			rt.cached[i] += b.PromptCached * n
			rt.returned[i] += int(math.Round(b.Returned * n))
		}
	}
	return rt.result()
}
