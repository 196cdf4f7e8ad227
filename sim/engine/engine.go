package engine

import (
	"errors"
	"fmt"
	"time"
)

// ErrTooLarge is returned by Enqueue for a request whose prompt and output can never fit
// in the KV cache, however empty it is.
var ErrTooLarge = errors.New("request needs more KV blocks than the engine has")

// Request is one generation request. The caller sets the input fields before Enqueue and
// reads the rest after the engine reports it; the engine owns it in between.
type Request struct {
	// ID is the caller's identifier; the engine does not interpret it.
	ID uint64
	// PromptTokens and OutputTokens are the prompt length and the number of tokens to
	// generate (at least 1).
	PromptTokens int
	OutputTokens int
	// Blocks are the prefix-chained hashes of the prompt's blocks of Config.BlockTokens
	// tokens; the last one may cover a partial block. Nil means nothing is cacheable.
	Blocks []uint64

	// Arrived is when Enqueue was called. FirstToken and Finished are set when reached.
	Arrived, FirstToken, Finished time.Duration
	// CachedTokens and CachedBlocks are how many prompt tokens and leading Blocks were
	// served from the prefix cache, set at admission.
	CachedTokens, CachedBlocks int
	// Generated counts the output tokens produced so far.
	Generated int

	state     state
	prefilled int           // prompt tokens done, cached ones included
	hitBlocks int           // leading Blocks pinned from the cache at admission
	anon      int           // anonymous blocks held: missing prompt blocks, then output
	lastToken time.Duration // when the previous token was produced
	chunk     int           // prefill tokens scheduled in the current step
	decoding  bool          // decodes one token in the current step
}

type state uint8

const (
	stateNew state = iota
	stateWaiting
	stateRunning
	stateDone
)

// Observer receives what an EndStep produced, in batch order. Calls happen inside EndStep.
type Observer interface {
	// FirstToken reports that r's prefill finished and its first token exists.
	FirstToken(r *Request, at time.Duration)
	// Token reports each further output token of r.
	Token(r *Request, at time.Duration)
	// Finished reports that r produced its last token and left the engine.
	Finished(r *Request, at time.Duration)
}

// Engine is one simulated engine. See the package documentation for its invariants.
type Engine struct {
	cfg      Config
	cache    *prefixCache
	waiting  []*Request // FIFO
	running  []*Request // admission order
	inStep   bool
	slowdown float64
	stats    Stats
}

// New returns an idle engine with an empty cache.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Engine{cfg: cfg, cache: newPrefixCache(cfg.KVBlocks), slowdown: 1, stats: NewStats()}, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// SetSlowdown multiplies every later step's duration by f (>= 1 models a degraded GPU).
func (e *Engine) SetSlowdown(f float64) error {
	if !(f > 0) {
		return fmt.Errorf("slowdown %v: must be positive", f)
	}
	e.slowdown = f
	return nil
}

// blocksNeeded is the KV blocks r holds while running: its prompt and its whole output.
func (e *Engine) blocksNeeded(r *Request) int {
	total := (r.PromptTokens + r.OutputTokens + e.cfg.BlockTokens - 1) / e.cfg.BlockTokens
	return max(total, len(r.Blocks))
}

// Enqueue adds r to the waiting queue at time now. It does not start a step.
func (e *Engine) Enqueue(now time.Duration, r *Request) error {
	if r.PromptTokens < 1 || r.OutputTokens < 1 {
		return fmt.Errorf("request %d: prompt %d and output %d tokens must both be at least 1", r.ID, r.PromptTokens, r.OutputTokens)
	}
	if r.state != stateNew {
		return fmt.Errorf("request %d was already enqueued", r.ID)
	}
	if need := e.blocksNeeded(r); need > e.cfg.KVBlocks {
		return fmt.Errorf("request %d: %d blocks for %d prompt and %d output tokens, cache holds %d: %w",
			r.ID, need, r.PromptTokens, r.OutputTokens, e.cfg.KVBlocks, ErrTooLarge)
	}
	r.Arrived, r.state = now, stateWaiting
	e.waiting = append(e.waiting, r)
	return nil
}

// Abort removes r (waiting or running) and frees what it holds. Aborting during a step is
// allowed: r simply takes no part in EndStep. It reports whether r was in the engine.
func (e *Engine) Abort(r *Request) bool {
	switch r.state {
	case stateWaiting:
		e.waiting = removeReq(e.waiting, r)
	case stateRunning:
		e.running = removeReq(e.running, r)
		e.releaseBlocks(r)
	default:
		return false
	}
	r.state = stateDone
	return true
}

func removeReq(list []*Request, r *Request) []*Request {
	for i, x := range list {
		if x == r {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}

// Admits reports whether r, enqueued now, would be admitted without waiting on others: no
// request waits ahead of it, the running batch has a seat for it, and its KV blocks fit
// beside those the running requests hold (its cached prefix counting as hits), as admit
// would judge it now. A request that is not admitted at once waits for running requests
// to finish, however idle the rest of the fleet.
func (e *Engine) Admits(r *Request) bool {
	if len(e.waiting) > 0 {
		return false
	}
	_, _, ok := e.fits(r)
	return ok
}

// fits is admit's test for r at the head of the queue: the batch has a seat and r's KV
// blocks fit beside the running requests'. It returns the leading blocks of r's prompt the
// cache holds and the blocks r needs beyond them.
func (e *Engine) fits(r *Request) (hit, fresh int, ok bool) {
	if len(e.running) >= e.cfg.MaxNumSeqs {
		return 0, 0, false
	}
	hit, unpinned := e.cache.hits(r.Blocks)
	fresh = e.blocksNeeded(r) - hit
	return hit, fresh, e.cache.fits(unpinned, fresh)
}

// Busy reports whether the engine has work that a step could advance.
func (e *Engine) Busy() bool { return len(e.running) > 0 || len(e.waiting) > 0 }

// StartStep admits waiting requests that fit, schedules one step and returns its duration.
// ok is false when there is nothing to run (no running request and none admissible);
// then no step is in progress and EndStep must not be called.
func (e *Engine) StartStep(now time.Duration) (d time.Duration, ok bool) {
	if e.inStep {
		panic("engine: StartStep called during a step")
	}
	e.admit()
	budget := e.cfg.MaxBatchedTokens
	decodes, context, prefill := 0, 0, 0
	for _, r := range e.running {
		r.chunk, r.decoding = 0, false
		if r.prefilled == r.PromptTokens {
			r.decoding = true
			decodes++
			context += r.PromptTokens + r.Generated
			budget--
		}
	}
	for _, r := range e.running {
		if budget == 0 {
			break
		}
		if left := r.PromptTokens - r.prefilled; left > 0 {
			r.chunk = min(left, budget)
			budget -= r.chunk
			prefill += r.chunk
		}
	}
	if decodes == 0 && prefill == 0 {
		return 0, false
	}
	secs := e.cfg.StepBase.Seconds() + float64(decodes)*e.cfg.DecodeSeqCost.Seconds() +
		float64(context)/e.cfg.ContextTokensPerSec + float64(prefill)/e.cfg.PrefillTokensPerSec
	e.inStep = true
	e.stats.Steps++
	return time.Duration(secs * e.slowdown * float64(time.Second)), true
}

// admit moves waiting requests into the batch in FIFO order while the batch has room and
// their blocks fit. The head of the queue blocks those behind it, as in vLLM.
func (e *Engine) admit() {
	n := 0
	for _, r := range e.waiting {
		hit, fresh, ok := e.fits(r)
		if !ok {
			break
		}
		e.cache.pin(r.Blocks[:hit])
		e.cache.reserve(fresh)
		r.hitBlocks, r.anon, r.CachedBlocks = hit, fresh, hit
		r.CachedTokens = min(hit*e.cfg.BlockTokens, r.PromptTokens-1)
		r.prefilled = r.CachedTokens
		r.state = stateRunning
		e.stats.PrefixQueries += uint64(r.PromptTokens)
		e.stats.PrefixHits += uint64(r.CachedTokens)
		e.running = append(e.running, r)
		n++
	}
	clear(e.waiting[:n])
	e.waiting = e.waiting[n:]
}

// EndStep applies the step started by the last StartStep at time now and reports its
// output to obs (which may be nil).
func (e *Engine) EndStep(now time.Duration, obs Observer) {
	if !e.inStep {
		panic("engine: EndStep called without a step")
	}
	e.inStep = false
	kept := e.running[:0]
	for _, r := range e.running {
		done := false
		switch {
		case r.chunk > 0:
			r.prefilled += r.chunk
			if r.prefilled == r.PromptTokens {
				e.commitPrompt(r)
				r.Generated, r.FirstToken, r.lastToken = 1, now, now
				e.stats.PromptTokens += uint64(r.PromptTokens) // at the first token, as vLLM counts them
				e.stats.TTFT.Observe((now - r.Arrived).Seconds())
				if obs != nil {
					obs.FirstToken(r, now)
				}
				done = r.Generated == r.OutputTokens
			}
		case r.decoding:
			r.Generated++
			e.stats.ITL.Observe((now - r.lastToken).Seconds())
			r.lastToken = now
			if obs != nil {
				obs.Token(r, now)
			}
			done = r.Generated == r.OutputTokens
		}
		r.chunk, r.decoding = 0, false
		if done {
			e.finish(r, now, obs)
			continue
		}
		kept = append(kept, r)
	}
	clear(e.running[len(kept):])
	e.running = kept
}

// commitPrompt caches r's freshly computed prompt blocks.
func (e *Engine) commitPrompt(r *Request) {
	fresh := r.Blocks[r.hitBlocks:]
	e.cache.commit(fresh)
	r.anon -= len(fresh)
	r.hitBlocks = len(r.Blocks)
}

func (e *Engine) finish(r *Request, now time.Duration, obs Observer) {
	r.Finished, r.state = now, stateDone
	e.releaseBlocks(r)
	e.stats.E2E.Observe((now - r.Arrived).Seconds())
	e.stats.Finished++
	e.stats.GenerationTokens += uint64(r.Generated)
	if obs != nil {
		obs.Finished(r, now)
	}
}

func (e *Engine) releaseBlocks(r *Request) {
	e.cache.release(r.Blocks[:r.hitBlocks], r.anon)
	r.hitBlocks, r.anon = 0, 0
}

// Running and Waiting are the current batch and queue sizes.
func (e *Engine) Running() int { return len(e.running) }

// Waiting is the number of requests queued for admission.
func (e *Engine) Waiting() int { return len(e.waiting) }

// KVUsage is the fraction of KV blocks held by running requests (vLLM's kv_cache_usage_perc,
// which does not count cached blocks that nothing references).
func (e *Engine) KVUsage() float64 {
	return float64(e.cache.pinned+e.cache.anon) / float64(e.cfg.KVBlocks)
}

// GenerationTokens is the tokens generated by the requests that have finished
// (vllm:generation_tokens_total).
func (e *Engine) GenerationTokens() uint64 { return e.stats.GenerationTokens }

// PromptTokens is the prompt tokens of the requests past their first token
// (vllm:prompt_tokens_total; see Stats.PromptTokens).
func (e *Engine) PromptTokens() uint64 { return e.stats.PromptTokens }

// Finished is the requests the engine has finished (vllm:request_success_total; see
// Stats.Finished).
func (e *Engine) Finished() uint64 { return e.stats.Finished }

// Cached reports whether the block hash h is in the prefix cache.
func (e *Engine) Cached(h uint64) bool { return e.cache.contains(h) }

// PrefixCounters returns the cumulative prefix-cache queries and hits, in prompt tokens,
// without copying histograms as Stats does.
func (e *Engine) PrefixCounters() (queries, hits uint64) {
	return e.stats.PrefixQueries, e.stats.PrefixHits
}

// Stats returns a copy of the engine's counters and histograms.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.TTFT, s.ITL, s.E2E = s.TTFT.clone(), s.ITL.clone(), s.E2E.clone()
	s.Running, s.Waiting, s.KVUsage = e.Running(), e.Waiting(), e.KVUsage()
	return s
}
