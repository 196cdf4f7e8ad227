package sim

import (
	"slices"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// oracle is not a router anyone can deploy: it is a reference for what routing inside one
// pool can reach at all on a trace, so that a target above it is known to be out of reach.
// One replica per pool (run it with --replicas 1 and --kv-event-delay 0) that knows, the
// instant they change, every engine's cached prefix blocks (KV events with no delay) and
// every request's prefill still to run on it (it routed all of them, and hears each first
// token). It sends each request where its expected cost is least: the time until its own
// prefill ends there, (prefill queued + its uncached tokens) / prefill rate, plus
// oracleDecodeWeight x that prefill time for each request decoding there (the steps its
// chunks add to their inter-token latency). Greedy and myopic, so not a proof of optimality,
// but it has every fact the open routers approximate.
type oracle struct {
	health
	rate    float64    // prefill tokens per second
	cached  []blockSet // per engine, from KV events
	pending []float64  // per engine: uncached prompt tokens of routed requests before their first token
	decode  []int      // per engine: requests past their first token
	reqs    map[int]oreq
	order   []int
	costs   []float64 // per engine, the last Route's
}

// oracleDecodeWeight prices the delay a prefill adds to each request decoding on the same
// engine, as a share of that prefill's time. Of 0, 0.1, 0.3 and 1, 0.1 reached the highest
// capacity at the SLO on the Mooncake trace per region (H100 engines: 20.40, 21.30, 20.85,
// 19.96 req/s; A100: 4.08, 4.35, 4.35, 3.99).
const oracleDecodeWeight = 0.1

// oreq is what the oracle tracks of a request it routed.
type oreq struct {
	engine   int
	prefill  float64 // uncached tokens counted in pending, until the first token
	decoding bool
}

func newOracle(f fleetShape, env poolEnv) *oracle {
	p := &oracle{health: newHealth(f, env.cfg.Retries), rate: env.cfg.Engine.PrefillTokensPerSec,
		pending: make([]float64, f.engines), decode: make([]int, f.engines), reqs: map[int]oreq{},
		costs: make([]float64, f.engines)}
	for range f.engines {
		p.cached = append(p.cached, blockSet{})
	}
	return p
}

var _ KVEventSubscriber = (*oracle)(nil)

// uncached is how many of r's prompt tokens engine e has to compute.
func (p *oracle) uncached(e int, r *Request) float64 {
	return float64(r.InputTokens - min(p.cached[e].leading(r.Blocks)*trace.BlockTokens, r.InputTokens))
}

// cost is the oracle's expected cost of sending r to engine e, in seconds.
func (p *oracle) cost(e int, r *Request) float64 {
	own := p.uncached(e, r) / p.rate
	return p.pending[e]/p.rate + own + oracleDecodeWeight*own*float64(p.decode[e])
}

func (p *oracle) Route(_ time.Duration, r *Request) Route {
	p.order = p.upByCost(p.order, p.costs, func(e int) float64 { return p.cost(e, r) })
	byCost(p.order, p.costs)
	return p.route(slices.Clone(p.order))
}

func (p *oracle) Observe(_ time.Duration, o Outcome) {
	r := o.Request
	switch o.Kind {
	case Sent:
		p.release(r.ID)
		q := oreq{engine: o.Engine, prefill: p.uncached(o.Engine, r)}
		p.reqs[r.ID] = q
		p.pending[o.Engine] += q.prefill
	case FirstToken:
		if q, ok := p.reqs[r.ID]; ok && !q.decoding {
			p.pending[q.engine] -= q.prefill
			p.decode[q.engine]++
			q.decoding = true
			p.reqs[r.ID] = q
		}
	case Done, Failed:
		p.release(r.ID)
	}
}

// release forgets request id's load.
func (p *oracle) release(id int) {
	q, ok := p.reqs[id]
	if !ok {
		return
	}
	delete(p.reqs, id)
	if q.decoding {
		p.decode[q.engine]--
	} else {
		p.pending[q.engine] -= q.prefill
	}
}

func (p *oracle) Tick(_ time.Duration, v *View) { p.tick(v) }

func (p *oracle) KVEvents(_ time.Duration, e int, events []engine.KVEvent) { p.cached[e].apply(events) }

func (p *oracle) Weights(_ int, dst []float64) { p.uniform(dst) }
