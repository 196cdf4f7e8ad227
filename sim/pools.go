package sim

import (
	"fmt"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
)

// poolEnv is what a router replica is built with besides its pool's shape.
type poolEnv struct {
	cfg *Config
	// seed is the replica's own seed, for policies that break ties at random.
	seed uint64
}

// replicaBuilder builds one router replica for a pool of f.engines engines entered by
// f.clusters clusters, in the pool's own (local) indices.
type replicaBuilder func(f fleetShape, env poolEnv) (Policy, error)

// pooled deploys a router the way its users do (Config.Deployment): one pool per region
// (or one global pool), each of Config.Replicas independent replicas of the router, every
// replica built by the same builder and seeing only its pool's engines, in local indices.
// A request goes to replica Request.Replica of its cluster's pool. Each replica keeps its
// own state: a router that synchronizes its replicas has to model that itself.
//
// pooled translates between the run's global indices and the pool's: requests (their
// Cluster), routes, outcomes, scrapes and KV events.
type pooled struct {
	shape      fleetShape
	pools      []*pool
	poolOf     []int     // cluster -> pool
	localOf    []int     // cluster -> its index in its pool
	enginePool []int     // engine -> pool, -1 if none
	engineAt   []int     // engine -> its index in its pool
	locals     []Request // by request ID: the request as its pool sees it
	localSet   []bool    // whether locals[ID] is filled
	wbuf       []float64 // scratch for Weights
	subs       [][]KVEventSubscriber
	scrapers   [][]Scraper
	scrapeEach time.Duration // the replicas' scrape period, 0 if none scrapes
}

// pool is one router pool: its engines and clusters, and its replicas.
type pool struct {
	engines  []int // local -> global engine
	clusters []int // local -> global cluster
	replicas []Policy
	view     View
}

var (
	_ Policy            = (*pooled)(nil)
	_ KVEventSubscriber = (*pooled)(nil)
	_ Scraper           = (*pooled)(nil)
)

// newPooled deploys the router build makes over fleet f as cfg says.
func newPooled(f fleetShape, cfg *Config, build replicaBuilder) (Policy, error) {
	p := &pooled{shape: f, poolOf: make([]int, f.clusters), localOf: make([]int, f.clusters),
		enginePool: make([]int, f.engines), engineAt: make([]int, f.engines), wbuf: make([]float64, f.engines)}
	for e := range p.enginePool {
		p.enginePool[e] = -1
	}
	if cfg.deployment() == DeployGlobal {
		pl := &pool{}
		for c := range f.clusters {
			pl.clusters = append(pl.clusters, c)
		}
		for e := range f.engines {
			pl.engines = append(pl.engines, e)
		}
		p.pools = []*pool{pl}
	} else {
		// Region r holds cluster r and engines r*EnginesPerRegion ... (see Config.Regions).
		for c := range f.clusters {
			pl := &pool{clusters: []int{c}}
			for e := range f.engines {
				if e/cfg.EnginesPerRegion == c {
					pl.engines = append(pl.engines, e)
				}
			}
			p.pools = append(p.pools, pl)
		}
	}
	for i, pl := range p.pools {
		for lc, c := range pl.clusters {
			p.poolOf[c], p.localOf[c] = i, lc
		}
		for le, e := range pl.engines {
			p.enginePool[e], p.engineAt[e] = i, le
		}
		shape := fleetShape{clusters: len(pl.clusters), engines: len(pl.engines)}
		var subs []KVEventSubscriber
		var scrapers []Scraper
		for k := range cfg.replicas() {
			rep, err := build(shape, poolEnv{cfg: cfg, seed: mix(uint64(i)<<16|uint64(k), cfg.Seed^0x9001)})
			if err != nil {
				return nil, fmt.Errorf("pool %d replica %d: %w", i, k, err)
			}
			pl.replicas = append(pl.replicas, rep)
			if s, ok := rep.(KVEventSubscriber); ok {
				subs = append(subs, s)
			}
			if s, ok := rep.(Scraper); ok {
				if p.scrapeEach != 0 && s.ScrapePeriod() != p.scrapeEach {
					return nil, fmt.Errorf("replicas scrape every %v and %v", p.scrapeEach, s.ScrapePeriod())
				}
				p.scrapeEach = s.ScrapePeriod()
				scrapers = append(scrapers, s)
			}
		}
		p.subs = append(p.subs, subs)
		p.scrapers = append(p.scrapers, scrapers)
	}
	return p, nil
}

// wants says which of the optional feeds the replicas subscribe to.
func (p *pooled) wants() (kv bool, scrape time.Duration) {
	for _, s := range p.subs {
		kv = kv || len(s) > 0
	}
	return kv, p.scrapeEach
}

// local returns r as its pool sees it, and the replica that serves it.
func (p *pooled) local(r *Request) (*Request, *pool, Policy) {
	for len(p.locals) <= r.ID {
		p.locals = append(p.locals, Request{})
		p.localSet = append(p.localSet, false)
	}
	lr := &p.locals[r.ID]
	if !p.localSet[r.ID] {
		*lr = *r
		lr.Cluster = p.localOf[r.Cluster]
		p.localSet[r.ID] = true
	}
	pl := p.pools[p.poolOf[r.Cluster]]
	return lr, pl, pl.replicas[r.Replica%len(pl.replicas)]
}

func (p *pooled) Route(now time.Duration, r *Request) Route {
	lr, pl, rep := p.local(r)
	route := rep.Route(now, lr)
	out := make([]int, len(route.Engines))
	for i, le := range route.Engines {
		out[i] = pl.engines[le]
	}
	route.Engines = out
	return route
}

func (p *pooled) Observe(now time.Duration, o Outcome) {
	lr, pl, rep := p.local(o.Request)
	if i := p.enginePool[o.Engine]; i < 0 || p.pools[i] != pl {
		return // not an engine of this pool: no route of its sends there
	}
	o.Request, o.Engine = lr, p.engineAt[o.Engine]
	rep.Observe(now, o)
}

func (p *pooled) Tick(now time.Duration, v *View) {
	for _, pl := range p.pools {
		p.fill(pl, v)
		for _, rep := range pl.replicas {
			rep.Tick(now, &pl.view)
		}
	}
}

// ScrapePeriod is the replicas' scrape period (zero: they do not scrape).
func (p *pooled) ScrapePeriod() time.Duration { return p.scrapeEach }

// Scrape hands each pool's part of the scrape to the replicas that scrape.
func (p *pooled) Scrape(now time.Duration, v *View) {
	for i, pl := range p.pools {
		if len(p.scrapers[i]) == 0 {
			continue
		}
		p.fill(pl, v)
		for _, s := range p.scrapers[i] {
			s.Scrape(now, &pl.view)
		}
	}
}

// fill copies the pool's part of v into the pool's view.
func (p *pooled) fill(pl *pool, v *View) {
	if pl.view.Engines == nil {
		pl.view = View{Engines: make([]EngineView, len(pl.engines)), Capacity: v.Capacity}
		for _, c := range pl.clusters {
			row := make([]time.Duration, len(pl.engines))
			for le, e := range pl.engines {
				row[le] = v.RTT[c][e]
			}
			pl.view.RTT = append(pl.view.RTT, row)
		}
		for _, e := range pl.engines {
			pl.view.Region = append(pl.view.Region, v.Region[e])
		}
	}
	for le, e := range pl.engines {
		pl.view.Engines[le] = v.Engines[e]
	}
}

// Weights averages cluster c's replicas' shares over its pool's engines.
func (p *pooled) Weights(c int, dst []float64) {
	clear(dst)
	pl := p.pools[p.poolOf[c]]
	buf := p.wbuf[:len(pl.engines)]
	for _, rep := range pl.replicas {
		rep.Weights(p.localOf[c], buf)
		for le, e := range pl.engines {
			dst[e] += buf[le] / float64(len(pl.replicas))
		}
	}
}

// KVEvents hands engine e's events to every replica of its pool: each subscribes to the
// engines' event streams itself.
func (p *pooled) KVEvents(now time.Duration, e int, events []engine.KVEvent) {
	i := p.enginePool[e]
	if i < 0 {
		return
	}
	for _, s := range p.subs[i] {
		s.KVEvents(now, p.engineAt[e], events)
	}
}
