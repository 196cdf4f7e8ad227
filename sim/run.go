package sim

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
)

const (
	tickPeriod   = 250 * time.Millisecond // policy ticks and scrapes (the sidecar's penalty interval)
	samplePeriod = time.Second            // weight samples
	// drainLimit bounds how long after the last arrival a run keeps going; requests still
	// unfinished then count as failed.
	drainLimit = 2 * time.Hour
)

type reqStatus uint8

const (
	pending reqStatus = iota
	completed
	shed
	failed
)

// reqState is one request's progress through a run.
type reqState struct {
	r          *Request
	route      Route
	attempt    int // index in route.Engines of the current attempt
	engine     int
	er         engine.Request
	status     reqStatus
	firstToken time.Duration // at the client
	finish     time.Duration // at the client
	lastToken  time.Duration // at the engine, for inter-token gaps
	hitBlocks  int
	missed     bool // known to miss the SLO
	queued     bool // its engine could not admit it on arrival (engine.Admits), last attempt
}

// slot is one engine of the fleet and what the run knows about it.
type slot struct {
	eng      *engine.Engine
	region   int
	up       bool
	stepping bool
	gen      uint32 // bumped when the engine goes down, to drop its pending step
	active   map[*engine.Request]*reqState
	kvBuf    []engine.KVEvent // events not yet sent on
}

// view is the engine's scraped gauges and counters (without the histograms of Stats); a
// down engine states nothing.
func (s *slot) view() EngineView {
	v := EngineView{Up: s.up}
	if s.up {
		v.Running, v.Waiting, v.KVUsage = s.eng.Running(), s.eng.Waiting(), s.eng.KVUsage()
		v.PrefixQueries, v.PrefixHits = s.eng.PrefixCounters()
		v.GenerationTokens, v.PromptTokens = s.eng.GenerationTokens(), s.eng.PromptTokens()
		v.Finished = s.eng.Finished()
	}
	return v
}

// run simulates one policy over one workload.
type run struct {
	cfg      *Config
	w        *Workload
	policy   Policy
	name     string
	now      time.Duration
	events   eventHeap
	slots    []*slot
	states   []reqState
	cur      *slot // the slot whose EndStep is running, for the Observer methods
	view     View
	rec      recorder
	progress *atomic.Int64 // virtual nanoseconds done, read by the progress reporter
	kvSub    KVEventSubscriber
	kvDirty  []int // slots with buffered KV events
	scraper  Scraper
	scrape   View // the light view Scrape gets
}

// feeds returns what optional feeds policy p subscribes to.
func feeds(p Policy) (KVEventSubscriber, Scraper) {
	kv, _ := p.(KVEventSubscriber)
	sc, _ := p.(Scraper)
	if w, ok := p.(interface {
		wants() (kv bool, scrape time.Duration)
	}); ok {
		wantKV, every := w.wants()
		if !wantKV {
			kv = nil
		}
		if every <= 0 {
			sc = nil
		}
	}
	if sc != nil && sc.ScrapePeriod() <= 0 {
		sc = nil
	}
	return kv, sc
}

func newRun(cfg *Config, w *Workload, name string, progress *atomic.Int64) (*run, error) {
	shape := fleetShape{clusters: len(cfg.Regions), engines: cfg.engines()}
	p, err := newPolicy(name, shape, cfg, w)
	if err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, w: w, policy: p, name: name, progress: progress}
	r.kvSub, r.scraper = feeds(p)
	for e := range shape.engines {
		eng, err := engine.New(cfg.Engine)
		if err != nil {
			return nil, err
		}
		s := &slot{eng: eng, region: e / cfg.EnginesPerRegion, up: true,
			active: make(map[*engine.Request]*reqState)}
		r.slots = append(r.slots, s)
		r.subscribe(e)
	}
	r.view = View{Engines: make([]EngineView, shape.engines), Capacity: w.Capacity / float64(shape.engines)}
	for c := range shape.clusters {
		row := make([]time.Duration, shape.engines)
		for e, s := range r.slots {
			row[e] = cfg.RTT[c][s.region]
		}
		r.view.RTT = append(r.view.RTT, row)
	}
	for _, s := range r.slots {
		r.view.Region = append(r.view.Region, s.region)
	}
	r.states = make([]reqState, len(w.Requests))
	r.rec = newRecorder(shape, cfg.SLO, w.Span)
	r.scrape = View{Engines: make([]EngineView, shape.engines), RTT: r.view.RTT, Region: r.view.Region,
		Capacity: r.view.Capacity}
	return r, nil
}

// subscribe buffers engine e's KV events for the policy, if it wants them.
func (r *run) subscribe(e int) {
	if r.kvSub == nil {
		return
	}
	s := r.slots[e]
	s.eng.SetKVEvents(func(ev engine.KVEvent) {
		if len(s.kvBuf) == 0 {
			r.kvDirty = append(r.kvDirty, e)
		}
		s.kvBuf = append(s.kvBuf, ev)
	})
}

// flushKV sends the events buffered while handling one event on their way.
func (r *run) flushKV() {
	for _, e := range r.kvDirty {
		s := r.slots[e]
		r.events.push(event{at: r.now + r.cfg.KVEventDelay, kind: evKV, engine: e, kv: s.kvBuf})
		s.kvBuf = nil
	}
	r.kvDirty = r.kvDirty[:0]
}

func (r *run) rtt(c, e int) time.Duration { return r.view.RTT[c][e] }

// simulate processes every event; it returns ctx's error if ctx ends first.
func (r *run) simulate(ctx context.Context) error {
	// The first tick comes first: a sidecar serves only once it has its first weights.
	r.events.push(event{at: 0, kind: evTick})
	r.events.push(event{at: 0, kind: evSample})
	if r.scraper != nil {
		r.events.push(event{at: 0, kind: evScrape})
	}
	for i := range r.w.Requests {
		r.states[i].r = &r.w.Requests[i]
		r.events.push(event{at: r.w.Requests[i].Arrival, kind: evArrival, req: &r.states[i]})
	}
	for i, a := range r.w.Actions {
		r.events.push(event{at: a.At, kind: evScenario, action: i})
	}
	deadline := r.w.Span + drainLimit
	for n := 0; r.events.len() > 0; n++ {
		ev := r.events.pop()
		if ev.at > deadline {
			break
		}
		r.now = ev.at
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			r.progress.Store(int64(r.now))
		}
		r.handle(ev)
		r.flushKV()
		if r.done() {
			break
		}
		if r.cfg.StopBelow > 0 && r.rec.certainlyBelow(r.cfg.StopBelow, len(r.states)) {
			r.rec.stopped = true
			break
		}
	}
	r.progress.Store(int64(r.w.Span))
	return nil
}

// done reports whether nothing is left but ticks and samples.
func (r *run) done() bool { return r.rec.finished == len(r.states) }

func (r *run) handle(ev event) {
	switch ev.kind {
	case evArrival:
		r.arrive(ev.req)
	case evDeliver:
		r.deliver(ev.req, ev.engine)
	case evStepEnd:
		if s := r.slots[ev.engine]; s.gen == ev.gen {
			s.stepping = false
			r.cur = s
			s.eng.EndStep(r.now, r)
			r.cur = nil
			r.kick(ev.engine)
		}
	case evFail, evRefused:
		r.failAttempt(ev.req, ev.engine, ev.kind == evRefused)
	case evTick:
		r.tick()
		r.events.push(event{at: r.now + tickPeriod, kind: evTick})
	case evSample:
		r.rec.sample(r.now, r.policy)
		r.events.push(event{at: r.now + samplePeriod, kind: evSample})
	case evScenario:
		r.apply(r.w.Actions[ev.action])
	case evKV:
		r.kvSub.KVEvents(r.now, ev.engine, ev.kv)
	case evScrape:
		for e, s := range r.slots {
			r.scrape.Engines[e] = s.view()
		}
		r.scraper.Scrape(r.now, &r.scrape)
		r.events.push(event{at: r.now + r.scraper.ScrapePeriod(), kind: evScrape})
	}
}

func (r *run) arrive(st *reqState) {
	st.route = r.policy.Route(r.now, st.r)
	if len(st.route.Engines) == 0 {
		r.end(st, shed)
		return
	}
	r.send(st, 0)
}

func (r *run) send(st *reqState, attempt int) {
	st.attempt, st.engine = attempt, st.route.Engines[attempt]
	r.policy.Observe(r.now, Outcome{Kind: Sent, Request: st.r, Engine: st.engine})
	r.events.push(event{at: r.now + r.rtt(st.r.Cluster, st.engine)/2, kind: evDeliver, req: st, engine: st.engine})
}

func (r *run) deliver(st *reqState, e int) {
	s := r.slots[e]
	if !s.up {
		r.events.push(event{at: r.now + r.rtt(st.r.Cluster, e)/2, kind: evRefused, req: st, engine: e})
		return
	}
	r.rec.retention.observe(st.r, e, r.slots)
	st.er = engine.Request{ID: uint64(st.r.ID), PromptTokens: st.r.InputTokens,
		OutputTokens: st.r.OutputTokens, Blocks: st.r.Blocks}
	st.queued = !s.eng.Admits(&st.er)
	if err := s.eng.Enqueue(r.now, &st.er); err != nil {
		// Too large for any engine: retrying elsewhere cannot help.
		r.policy.Observe(r.now, Outcome{Kind: Failed, Request: st.r, Engine: e, Final: true, Rejected: true})
		r.rec.tooLarge += btoi(errors.Is(err, engine.ErrTooLarge))
		r.end(st, failed)
		return
	}
	s.active[&st.er] = st
	r.kick(e)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// kick starts a step on an idle engine that has work.
func (r *run) kick(e int) {
	s := r.slots[e]
	if s.stepping || !s.up {
		return
	}
	if d, ok := s.eng.StartStep(r.now); ok {
		s.stepping = true
		r.events.push(event{at: r.now + d, kind: evStepEnd, engine: e, gen: s.gen})
	}
}

// failAttempt handles an error that reached the proxy: retry on the next engine of the
// route if the grant allows (a route whose retries are for unsent attempts only retries a
// refused connection), else fail the request.
func (r *run) failAttempt(st *reqState, e int, refused bool) {
	next := st.attempt + 1
	retry := next <= st.route.Retries && next < len(st.route.Engines) && (refused || !st.route.UnsentOnly)
	r.policy.Observe(r.now, Outcome{Kind: Failed, Request: st.r, Engine: e, Final: !retry})
	if retry {
		r.rec.retries++
		r.send(st, next)
		return
	}
	r.end(st, failed)
}

func (r *run) end(st *reqState, status reqStatus) {
	st.status = status
	r.rec.finish(st)
}

// FirstToken, Token and Finished implement engine.Observer for the slot in r.cur.
func (r *run) FirstToken(er *engine.Request, at time.Duration) {
	st := r.cur.active[er]
	st.firstToken = at + r.rtt(st.r.Cluster, st.engine)/2
	st.lastToken = at
	st.hitBlocks = er.CachedBlocks
	if r.cfg.SLO.set() && st.firstToken-st.r.Arrival > r.cfg.SLO.TTFTLimit(st.r.InputTokens) {
		r.rec.miss(st)
		r.rec.missedTTFT++
	}
	r.policy.Observe(r.now, Outcome{Kind: FirstToken, Request: st.r, Engine: st.engine,
		TTFT: st.firstToken - st.r.Arrival, CachedBlocks: er.CachedBlocks})
}

func (r *run) Token(er *engine.Request, at time.Duration) {
	st := r.cur.active[er]
	r.rec.itl.observe((at - st.lastToken).Seconds())
	st.lastToken = at
}

func (r *run) Finished(er *engine.Request, at time.Duration) {
	st := r.cur.active[er]
	delete(r.cur.active, er)
	half := r.rtt(st.r.Cluster, st.engine) / 2
	st.finish = at + half
	var itl time.Duration
	if er.Generated > 1 {
		itl = (at - (st.firstToken - half)) / time.Duration(er.Generated-1)
	}
	if r.cfg.SLO.set() && itl > r.cfg.SLO.MaxITL && !st.missed {
		r.rec.miss(st)
		r.rec.missedITL++
	}
	r.policy.Observe(r.now, Outcome{Kind: Done, Request: st.r, Engine: st.engine, ITL: itl})
	r.end(st, completed)
}

func (r *run) tick() {
	for e, s := range r.slots {
		v := s.view()
		if s.up {
			v.Stats = s.eng.Stats()
		}
		r.view.Engines[e] = v
	}
	r.policy.Tick(r.now, &r.view)
}

// apply carries out a scenario action.
func (r *run) apply(a Action) {
	for _, e := range a.Engines {
		s := r.slots[e]
		switch {
		case !a.Up && s.up:
			r.down(e)
		case a.Up && !s.up:
			s.up = true
		}
		if a.Slowdown > 0 {
			_ = s.eng.SetSlowdown(a.Slowdown) // validated positive by construction
		}
	}
}

// down crashes engine e: requests still waiting for their first token fail over (their
// error reaches the proxy after half a round trip), streaming ones are lost, and the engine
// restarts later with an empty cache.
func (r *run) down(e int) {
	s := r.slots[e]
	s.up, s.stepping = false, false
	s.gen++
	lost := make([]*reqState, 0, len(s.active))
	for _, st := range s.active {
		lost = append(lost, st)
	}
	clear(s.active)
	// Map order is random; the run must not be.
	slices.SortFunc(lost, func(a, b *reqState) int { return a.r.ID - b.r.ID })
	for _, st := range lost {
		if st.er.Generated == 0 {
			r.events.push(event{at: r.now + r.rtt(st.r.Cluster, e)/2, kind: evFail, req: st, engine: e})
			continue
		}
		r.policy.Observe(r.now, Outcome{Kind: Failed, Request: st.r, Engine: e, Final: true})
		r.end(st, failed)
	}
	eng, _ := engine.New(r.cfg.Engine) // the config was validated when the run was built
	s.eng = eng
	if r.kvSub != nil {
		// The restarted engine's publisher starts with AllBlocksCleared, as vLLM's does.
		if len(s.kvBuf) == 0 {
			r.kvDirty = append(r.kvDirty, e)
		}
		s.kvBuf = append(s.kvBuf, engine.KVEvent{Kind: engine.AllBlocksCleared})
		r.subscribe(e)
	}
}
