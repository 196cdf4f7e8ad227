package sim

import (
	"fmt"
	"sort"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-router/meridian/extproc/decide"
	"github.com/meridian-router/meridian/extproc/request"
	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// Request is one request as the policies see it. Read-only.
type Request struct {
	ID      int
	Cluster int
	Arrival time.Duration
	// InputTokens and OutputTokens are the prompt and output lengths.
	InputTokens, OutputTokens int
	// Blocks are the prompt's prefix-chained block hashes (nil when the trace has none).
	Blocks []uint64
	// Key is the prefix key the consistent-hashing baselines hash on, as a ring hash over a
	// client's prefix header would: the chained block hash at one fixed depth, the first
	// rung of the sidecar's key ladder (see ladder), so every request sharing that prefix
	// shares it. Requests without blocks get a unique key.
	Key uint64
	// LadderKey is meridian's routing key, the deepest rung of the sidecar's key ladder the
	// prompt fills (request.KeyDepth), and ParentKey the rung above it (0 when LadderKey is
	// on the first rung or below it), which meridian's sidecars look up when LadderKey has
	// no home. Requests without blocks have LadderKey = Key.
	LadderKey, ParentKey uint64
	// Marks are the sidecar's prefix marks of the prompt (extproc/request's Marks): the
	// chained hash at every multiple of the ladder's first rung, each taken at the trace
	// block it ends in, as the keys are. Nil when the trace has no blocks or the sidecar's
	// parser takes no marks (request.Options.Marks; the sidecar's always does).
	Marks []uint64
	// Replica is the router replica of the request's pool that receives it, drawn per
	// request (seeded) in [0, Config.Replicas): a load balancer in front of the replicas.
	Replica int
}

// Workload is the arrivals every policy of a run replays, with what the scenario does.
type Workload struct {
	Requests []Request
	// Capacity is the fleet's capacity in requests/s: engines / mean cold service time.
	Capacity float64
	// ColdService is the trace's mean engine time per request with no prefix-cache hit
	// (engine.Config.ServiceSeconds), and PrefillShare the part of it spent in prefill: what
	// an operator's capacity figure for the fleet file would be derived from.
	ColdService, PrefillShare float64
	// Load is the offered load as a fraction of Capacity (1.5 for Overload).
	Load float64
	// Span is the time from the first to the last arrival.
	Span time.Duration
	// UpperBound is the prefix-cache hit rate an infinite cache shared by every engine
	// would reach on these requests (trace.Stats.HitRateUpperBound).
	UpperBound float64
	// Actions are the scenario's changes to the fleet, in time order.
	Actions []Action
}

// Action is a scenario change to the fleet at a point in time.
type Action struct {
	At time.Duration
	// Engines are the engines affected.
	Engines []int
	// Up sets the engines up or down; Slowdown, when non-zero, sets their step multiplier.
	Up       bool
	Slowdown float64
}

// coldService returns the mean service seconds of reqs with no cache hit and the share of
// it spent in prefill.
func coldService(cfg engine.Config, reqs []trace.Request) (mean, prefillShare float64) {
	total, prefill := 0.0, 0.0
	for _, r := range reqs {
		total += cfg.ServiceSeconds(r.InputTokens, max(r.OutputTokens, 1))
		prefill += float64(r.InputTokens) / cfg.PrefillTokensPerSec
	}
	return total / float64(len(reqs)), prefill / total
}

// BuildWorkload rescales the trace to the offered load, assigns each request to a region
// and applies the scenario. It is deterministic in c.Seed.
func BuildWorkload(c *Config) (*Workload, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	w := &Workload{Load: c.Load}
	if c.Scenario == Overload {
		w.Load = overloadFactor
	}
	w.ColdService, w.PrefillShare = coldService(c.Engine, c.Trace)
	w.Capacity = float64(c.engines()) / w.ColdService
	scaled, err := trace.WithRate(c.Trace, w.Load*w.Capacity)
	if err != nil {
		return nil, fmt.Errorf("rescale the trace to %.2f x capacity: %w", w.Load, err)
	}
	w.Span = scaled[len(scaled)-1].Arrival
	lad := c.ladder()
	for i, r := range scaled {
		w.Requests = append(w.Requests, c.newRequest(i, r, lad))
	}
	if c.Scenario == Step {
		w.Requests = c.addStep(w.Requests, scaled, w.Span, lad)
	}
	w.Actions = c.actions(w.Span)
	w.UpperBound = upperBound(w.Requests)
	return w, nil
}

func (c *Config) newRequest(id int, r trace.Request, lad keyLadder) Request {
	req := Request{ID: id, Arrival: r.Arrival, InputTokens: r.InputTokens,
		OutputTokens: max(r.OutputTokens, 1), Blocks: r.HashIDs}
	conv := uint64(id) | 1<<63
	req.Key = mix(conv, c.Seed)
	req.LadderKey = req.Key
	if len(r.HashIDs) > 0 {
		conv = r.HashIDs[0]
		req.Key, req.LadderKey, req.ParentKey = c.prefixKeys(r.HashIDs, r.InputTokens, lad)
		req.Marks = c.prefixMarks(r.HashIDs, r.InputTokens, lad)
	}
	if r.Conversation != 0 {
		conv = r.Conversation
	}
	// A conversation (same first block, or the session the trace names) always enters
	// through the same region.
	req.Cluster = int(mix(conv, c.Seed^0x5eed) % uint64(len(c.Regions)))
	req.Replica = c.replicaOf(id)
	return req
}

// addStep doubles region 0's demand in the middle third: for each of its requests there,
// another request of the trace, relabelled so its blocks are new conversations, arrives
// within the same inter-arrival gap.
func (c *Config) addStep(reqs []Request, scaled []trace.Request, span time.Duration, lad keyLadder) []Request {
	from, to := span/3, 2*span/3
	n := len(scaled)
	gap := time.Duration(float64(span) / float64(n) * float64(len(c.Regions)))
	extra := []Request{}
	for _, r := range reqs {
		if r.Cluster != 0 || r.Arrival < from || r.Arrival >= to {
			continue
		}
		src := scaled[(r.ID+n/2)%n]
		e := Request{ID: len(reqs) + len(extra), Cluster: 0,
			Arrival:     r.Arrival + time.Duration(mix(uint64(r.ID), c.Seed)%uint64(max(gap, 1))),
			InputTokens: src.InputTokens, OutputTokens: max(src.OutputTokens, 1)}
		if len(src.HashIDs) > 0 {
			e.Blocks = make([]uint64, len(src.HashIDs))
			for i, h := range src.HashIDs {
				e.Blocks[i] = h | 1<<62 // a new user population with the same structure
			}
			e.Key, e.LadderKey, e.ParentKey = c.prefixKeys(e.Blocks, e.InputTokens, lad)
			e.Marks = c.prefixMarks(e.Blocks, e.InputTokens, lad)
		} else {
			e.Key = mix(uint64(e.ID)|1<<63, c.Seed)
			e.LadderKey = e.Key
		}
		e.Replica = c.replicaOf(e.ID)
		extra = append(extra, e)
	}
	out := append(reqs, extra...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Arrival < out[j].Arrival })
	for i := range out {
		out[i].ID = i
	}
	return out
}

// replicaOf draws the router replica of the request numbered id.
func (c *Config) replicaOf(id int) int {
	return int(mix(uint64(id), c.Seed^0x4e911ca) % uint64(c.replicas()))
}

func (c *Config) actions(span time.Duration) []Action {
	from, to := span/3, 2*span/3
	region0 := make([]int, c.EnginesPerRegion)
	for i := range region0 {
		region0[i] = i
	}
	switch c.Scenario {
	case Outage:
		return []Action{{At: from, Engines: region0, Up: false}, {At: to, Engines: region0, Up: true}}
	case SlowEngine:
		return []Action{{At: from, Engines: []int{0}, Up: true, Slowdown: slowFactor}}
	}
	return nil
}

func upperBound(reqs []Request) float64 {
	tr := make([]trace.Request, len(reqs))
	for i, r := range reqs {
		tr[i] = trace.Request{Arrival: r.Arrival, InputTokens: r.InputTokens, OutputTokens: r.OutputTokens, HashIDs: r.Blocks}
	}
	return trace.Summarize(tr).HitRateUpperBound
}

// keyLadder is the sidecar's key ladder (request.KeyDepth) in prompt tokens: its first
// rung and its last.
type keyLadder struct {
	first, last int
	marks       bool // the sidecar's parser takes prefix marks (request.Options.Marks)
}

// ladder is the key ladder of c.Sidecar when set (its first rung is also the baselines'
// Request.Key), of the shipped configuration otherwise: request.affinity_blocks and
// request.max_blocks blocks of block_bytes prompt bytes, at decide.BytesPerToken a token.
func (c *Config) ladder() keyLadder {
	cfg := sidecarConfig()
	if c.Sidecar != nil {
		cfg = *c.Sidecar
	}
	o := cfg.Request
	return keyLadder{first: o.KeyBlocks * o.BlockBytes / decide.BytesPerToken, last: o.MaxBlocks * o.BlockBytes / decide.BytesPerToken,
		marks: o.Marks}
}

// prefixKeys are the baselines' fixed-depth key, the sidecar's ladder key and its parent
// for a prompt of tokens tokens whose trace blocks are blocks (request.KeyDepth), each
// depth taken at the trace block it ends in (trace.BlockTokens tokens a block, at least
// the first).
func (c *Config) prefixKeys(blocks []uint64, tokens int, lad keyLadder) (fixed, key, parent uint64) {
	at := func(tokens int) uint64 { return c.chainAt(blocks, tokens) }
	depth, up := request.KeyDepth(tokens, lad.first, lad.last)
	if depth == 0 {
		whole := mix(blocks[len(blocks)-1], c.Seed) // shorter than the first rung: all of it
		return whole, whole, 0
	}
	fixed, key = at(lad.first), at(depth)
	if up > 0 && at(up) != key {
		parent = at(up)
	}
	return fixed, key, parent
}

// prefixMarks are the sidecar's marks for a prompt of tokens tokens whose trace blocks are
// blocks: the chain at every multiple of the ladder's first rung up to its last; none when
// the sidecar's parser takes none.
func (c *Config) prefixMarks(blocks []uint64, tokens int, lad keyLadder) []uint64 {
	if !lad.marks || lad.first < 1 {
		return nil
	}
	var marks []uint64
	for d := lad.first; d <= min(tokens, lad.last); d += lad.first {
		marks = append(marks, c.chainAt(blocks, d))
	}
	return marks
}

// chainAt is the prompt's chained hash at a depth of tokens tokens, taken at the trace
// block that depth ends in (trace.BlockTokens tokens a block, at least the first).
func (c *Config) chainAt(blocks []uint64, tokens int) uint64 {
	return mix(blocks[min(len(blocks), max(1, tokens/trace.BlockTokens))-1], c.Seed)
}

// mix hashes x with a seed into a well-spread 64-bit value.
func mix(x, seed uint64) uint64 {
	var b [16]byte
	for i := range 8 {
		b[i] = byte(x >> (8 * i))
		b[8+i] = byte(seed >> (8 * i))
	}
	return xxhash.Sum64(b[:])
}
