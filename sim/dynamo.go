package sim

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// NVIDIA Dynamo's KV router (python -m dynamo.frontend --router-mode kv) with its defaults.
// Read from github.com/ai-dynamo/dynamo:
//   - lib/kv-router/src/scheduling/selector/default.rs (commit 07a6c9ce): a worker's cost
//     is prefill_load_scale x max(raw_prefill_blocks - overlap_credit_blocks, 0) +
//     decode_blocks (+ decode_active_request_weight x active requests), where
//     raw_prefill_blocks is the worker's active prompt tokens plus this request's, over
//     the block size, overlap_credit_blocks is overlap_score_credit x the blocks the
//     worker has cached (from its KV events), and decode_blocks is the worker's active
//     blocks plus the request's; the lowest cost wins, ties at random, and a non-zero
//     router_temperature would sample a softmax instead;
//   - lib/kv-router/src/scheduling/config.rs (commit 0243c51b): overlap_score_credit 1.0,
//     prefill_load_scale 1.0, router_temperature 0.0, use_kv_events true,
//     router_replica_sync false, router_track_active_blocks true,
//     router_track_output_blocks false, router_assume_kv_reuse true,
//     router_track_prefill_tokens true; overlap_score_credit_decay and
//     decode_active_request_weight default to 0 (off);
//   - the router design and operations docs (docs.nvidia.com/dynamo, v1.7.0, "Router
//     Design" and "Router Operations"): active blocks are tracked by each router from its
//     own requests (added at routing, prompt tokens leaving the prefill load at the first
//     token, blocks freed at completion); cached blocks come from the workers' KV Stored
//     and Removed events, which every router replica consumes into its own radix tree, so
//     replicas share the prefix view. Without router_replica_sync (off by default) they
//     do not share their active-block state.
//
// Blocks are vLLM's 16 tokens (Dynamo's vLLM default). The router-side queue
// (router_queue_threshold 16, which holds requests while every worker has more than 16 x
// max_num_batched_tokens of prompt tokens pending) is not modelled.
const (
	dynamoOverlapCredit    = 1.0
	dynamoPrefillLoadScale = 1.0
	dynamoBlockTokens      = 16
)

// dynamo is one KV-router replica over one pool's engines.
type dynamo struct {
	health
	rng     *rand.Rand
	cached  []blockSet       // from KV events
	prefill []int            // active prompt tokens still to prefill, per engine
	active  []map[uint64]int // active prompt blocks (trace blocks) with their request counts
	anon    []int            // active 16-token blocks of requests without block hashes
	reqs    map[int]*dynamoReq
	cost    []float64
	order   []int
}

// dynamoReq is what a replica tracks of a request it routed.
type dynamoReq struct {
	engine    int
	prefill   int // tokens counted in prefill[engine], until the first token
	anon      int
	blocks    []uint64
	prefilled bool
}

var _ KVEventSubscriber = (*dynamo)(nil)

func newDynamo(f fleetShape, env poolEnv) *dynamo {
	p := &dynamo{health: newHealth(f, env.cfg.Retries), rng: rand.New(rand.NewPCG(env.seed, 0xd1a0)),
		prefill: make([]int, f.engines), anon: make([]int, f.engines), reqs: map[int]*dynamoReq{},
		cost: make([]float64, f.engines)}
	for range f.engines {
		p.cached = append(p.cached, blockSet{})
		p.active = append(p.active, map[uint64]int{})
	}
	return p
}

// overlapTokens is how many of r's prompt tokens engine e has cached, by its KV events.
func (p *dynamo) overlapTokens(e int, r *Request) int {
	return min(p.cached[e].leading(r.Blocks)*trace.BlockTokens, r.InputTokens)
}

// anonBlocks is r's 16-token blocks when it has no block hashes.
func anonBlocks(r *Request) int {
	if len(r.Blocks) > 0 {
		return 0
	}
	return (r.InputTokens + dynamoBlockTokens - 1) / dynamoBlockTokens
}

// Cost is Dynamo's cost of sending r to engine e, in 16-token blocks.
func (p *dynamo) Cost(e int, r *Request) float64 {
	raw := float64(p.prefill[e]+r.InputTokens) / dynamoBlockTokens
	credit := dynamoOverlapCredit * float64(p.overlapTokens(e, r)) / dynamoBlockTokens
	decode := len(p.active[e])
	for _, h := range r.Blocks {
		if p.active[e][h] == 0 {
			decode++
		}
	}
	decodeBlocks := float64(decode*trace.BlockTokens/dynamoBlockTokens + p.anon[e] + anonBlocks(r))
	return dynamoPrefillLoadScale*max(raw-credit, 0) + decodeBlocks
}

func (p *dynamo) Route(_ time.Duration, r *Request) Route {
	p.order = p.upByCost(p.order, p.cost, func(e int) float64 { return p.Cost(e, r) })
	// Lowest cost first; among equal lowest costs one at random (router_temperature 0).
	p.rng.Shuffle(len(p.order), func(i, j int) { p.order[i], p.order[j] = p.order[j], p.order[i] })
	byCost(p.order, p.cost)
	return p.route(slices.Clone(p.order))
}

func (p *dynamo) Observe(_ time.Duration, o Outcome) {
	r := o.Request
	switch o.Kind {
	case Sent:
		p.release(r.ID)
		q := &dynamoReq{engine: o.Engine, prefill: r.InputTokens - p.overlapTokens(o.Engine, r), anon: anonBlocks(r), blocks: r.Blocks}
		p.reqs[r.ID] = q
		p.prefill[o.Engine] += q.prefill
		p.anon[o.Engine] += q.anon
		for _, h := range r.Blocks {
			p.active[o.Engine][h]++
		}
	case FirstToken:
		if q := p.reqs[r.ID]; q != nil && !q.prefilled {
			q.prefilled = true
			p.prefill[q.engine] -= q.prefill
		}
	case Done, Failed:
		p.release(r.ID)
	}
}

// release forgets request id's active load.
func (p *dynamo) release(id int) {
	q := p.reqs[id]
	if q == nil {
		return
	}
	delete(p.reqs, id)
	if !q.prefilled {
		p.prefill[q.engine] -= q.prefill
	}
	p.anon[q.engine] -= q.anon
	act := p.active[q.engine]
	for _, h := range q.blocks {
		if act[h]--; act[h] == 0 {
			delete(act, h)
		}
	}
}

func (p *dynamo) Tick(_ time.Duration, v *View) { p.tick(v) }

func (p *dynamo) KVEvents(_ time.Duration, e int, events []engine.KVEvent) { p.cached[e].apply(events) }

func (p *dynamo) Weights(_ int, dst []float64) { p.uniform(dst) }
