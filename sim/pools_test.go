package sim

import (
	"slices"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// recorder policy: remembers what it was given, in its pool's indices.
type spyPolicy struct {
	f        fleetShape
	routed   []Request
	observed []Outcome
	ticks    int
	engines  int
	kv       []int
}

func (s *spyPolicy) Route(_ time.Duration, r *Request) Route {
	s.routed = append(s.routed, *r)
	all := make([]int, s.f.engines)
	for e := range all {
		all[e] = e
	}
	return Route{Engines: all}
}
func (s *spyPolicy) Observe(_ time.Duration, o Outcome) { s.observed = append(s.observed, o) }
func (s *spyPolicy) Tick(_ time.Duration, v *View)      { s.ticks++; s.engines = len(v.Engines) }
func (s *spyPolicy) Weights(_ int, dst []float64) {
	for e := range dst {
		dst[e] = 1 / float64(len(dst))
	}
}
func (s *spyPolicy) KVEvents(_ time.Duration, e int, _ []engine.KVEvent) { s.kv = append(s.kv, e) }

func TestRegionPoolsKeepTrafficInRegionAndReplicasApart(t *testing.T) {
	cfg := &Config{Regions: DefaultRegions, EnginesPerRegion: 2, Replicas: 2, Deployment: DeployRegion}
	var spies []*spyPolicy
	p, err := newPooled(fleetShape{clusters: 3, engines: 6}, cfg, func(f fleetShape, _ poolEnv) (Policy, error) {
		s := &spyPolicy{f: f}
		spies = append(spies, s)
		return s, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(spies) != 6 {
		t.Fatalf("%d replicas for 3 regions x 2", len(spies))
	}
	// Region 1's second replica (spy 3) gets a request of cluster 1, replica 1, and routes
	// it only to region 1's engines 2 and 3.
	r := &Request{ID: 0, Cluster: 1, Replica: 1}
	route := p.Route(0, r)
	if len(route.Engines) != 2 || route.Engines[0] != 2 || route.Engines[1] != 3 {
		t.Errorf("route %v, want region 1's engines [2 3]", route.Engines)
	}
	if len(spies[3].routed) != 1 || spies[3].routed[0].Cluster != 0 || len(spies[2].routed) != 0 {
		t.Errorf("replica 1 of region 1 saw %v; replica 0 saw %v", spies[3].routed, spies[2].routed)
	}
	p.Observe(0, Outcome{Kind: Sent, Request: r, Engine: 3})
	if o := spies[3].observed; len(o) != 1 || o[0].Engine != 1 || o[0].Request.Cluster != 0 {
		t.Errorf("outcome as the replica saw it: %+v", o)
	}
	v := &View{Engines: make([]EngineView, 6), RTT: make([][]time.Duration, 3), Region: []int{0, 0, 1, 1, 2, 2}}
	for c := range v.RTT {
		v.RTT[c] = make([]time.Duration, 6)
	}
	p.Tick(0, v)
	for i, s := range spies {
		if s.ticks != 1 || s.engines != 2 {
			t.Errorf("replica %d: %d ticks over %d engines", i, s.ticks, s.engines)
		}
	}
	p.(KVEventSubscriber).KVEvents(0, 5, nil)
	if len(spies[4].kv) != 1 || spies[4].kv[0] != 1 || len(spies[5].kv) != 1 || len(spies[0].kv) != 0 {
		t.Errorf("engine 5's events reached %v %v (region 2) and %v (region 0)", spies[4].kv, spies[5].kv, spies[0].kv)
	}
	w := make([]float64, 6)
	p.Weights(2, w)
	if w[4] != 0.5 || w[5] != 0.5 || w[0] != 0 {
		t.Errorf("cluster 2's weights %v", w)
	}
}

func TestGlobalPoolIsOneReplicaOverEveryEngine(t *testing.T) {
	cfg := &Config{Regions: DefaultRegions, EnginesPerRegion: 2, Deployment: DeployGlobal}
	n := 0
	p, err := newPooled(fleetShape{clusters: 3, engines: 6}, cfg, func(f fleetShape, _ poolEnv) (Policy, error) {
		n++
		if f.clusters != 3 || f.engines != 6 {
			t.Errorf("global replica built for %+v", f)
		}
		return &spyPolicy{f: f}, nil
	})
	if err != nil || n != 1 {
		t.Fatalf("%d replicas, %v", n, err)
	}
	if route := p.Route(0, &Request{Cluster: 2}); len(route.Engines) != 6 {
		t.Errorf("global route %v", route.Engines)
	}
}

func TestReplicasAreDrawnPerRequest(t *testing.T) {
	cfg := testSimConfig(t, conversationTrace(400, 5), Steady)
	cfg.Deployment, cfg.Replicas = DeployRegion, 4
	w, err := BuildWorkload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, 4)
	for _, r := range w.Requests {
		counts[r.Replica]++
	}
	for k, n := range counts {
		if n < 60 || n > 140 {
			t.Errorf("replica %d got %d of 400 requests", k, n)
		}
	}
	// A global deployment has one replica; more is an error, not ignored.
	cfg.Deployment = DeployGlobal
	if err := cfg.Validate(); err == nil {
		t.Error("global deployment with 4 replicas accepted")
	}
}

func TestAnchorsRunUnderBothDeployments(t *testing.T) {
	for _, dep := range Deployments {
		cfg := testSimConfig(t, conversationTrace(300, 4), Steady)
		cfg.Policies = []string{"llm-d", "llm-d-precise", "dynamo", "sglang"}
		cfg.Deployment, cfg.Replicas = dep, 2
		if dep == DeployGlobal {
			cfg.Replicas = 1
		}
		cfg.SLO = DefaultSLO()
		cfg.KVEventDelay = 50 * time.Millisecond
		res, _, err := Run(t.Context(), cfg, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Completed != r.Requests || r.KVHitRate <= 0 || r.SLOAttainment <= 0 || r.SLOAttainment > 1 {
				t.Errorf("%s %s: %d of %d completed, hit rate %v, attainment %v", dep, r.Policy,
					r.Completed, r.Requests, r.KVHitRate, r.SLOAttainment)
			}
		}
	}
}

// A session trace's turns all share their first blocks (a system prompt every session
// sends); the session each turn belongs to, not its first block, picks its region.
func TestASessionEntersThroughOneRegion(t *testing.T) {
	var reqs []trace.Request
	for i := range 300 {
		reqs = append(reqs, trace.Request{Arrival: time.Duration(i) * time.Second, InputTokens: 1024, OutputTokens: 10,
			HashIDs: []uint64{0, uint64(1 + i)}, Conversation: uint64(1 + i%30)})
	}
	cfg := testSimConfig(t, conversationTrace(10, 1), Steady)
	cfg.Trace = reqs
	w, err := BuildWorkload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	region := map[uint64]int{}
	perRegion := make([]int, len(cfg.Regions))
	for i, r := range w.Requests {
		c := reqs[i].Conversation
		if got, ok := region[c]; ok && got != r.Cluster {
			t.Fatalf("session %d enters through regions %d and %d", c, got, r.Cluster)
		}
		region[c] = r.Cluster
		perRegion[r.Cluster]++
	}
	for k, n := range perRegion {
		if n == 0 {
			t.Errorf("no session enters through region %d (%v): they all share their first block", k, perRegion)
		}
	}
}

// Sessions whose prompts all open with one long shared system prompt get keys of their
// own from the key ladder (the fixed 4 KiB key of before was the system prompt's, one for
// all), and each turn keeps its previous turn's key or names it as its parent.
func TestTheKeyLadderKeysSessionsApart(t *testing.T) {
	const sessions, turns, shared = 30, 12, 40 // blocks of trace.BlockTokens tokens
	var reqs []trace.Request
	next := uint64(1000)
	prompts := make([][]uint64, sessions)
	for s := range prompts {
		for b := range shared {
			prompts[s] = append(prompts[s], uint64(b))
		}
		for range 60 {
			prompts[s] = append(prompts[s], next)
			next++
		}
	}
	for turn := range turns {
		for s := range sessions {
			for range 1 + (s+turn)%7 { // each turn adds its answer and a new message
				prompts[s] = append(prompts[s], next)
				next++
			}
			reqs = append(reqs, trace.Request{Arrival: time.Duration(len(reqs)) * time.Second, InputTokens: len(prompts[s]) * trace.BlockTokens,
				OutputTokens: 10, HashIDs: slices.Clone(prompts[s]), Conversation: uint64(1 + s)})
		}
	}
	cfg := testSimConfig(t, conversationTrace(10, 1), Steady)
	cfg.Trace = reqs
	w, err := BuildWorkload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prev, crossed := map[int]uint64{}, 0
	for i, r := range w.Requests {
		s, turn := i%sessions, i/sessions
		if turn > 0 && r.LadderKey != prev[s] {
			if r.ParentKey != prev[s] {
				t.Fatalf("session %d turn %d: key %x parent %x, neither its previous turn's %x", s, turn, r.LadderKey, r.ParentKey, prev[s])
			}
			crossed++
		}
		prev[s] = r.LadderKey
		if turn == turns-1 {
			for o := range s {
				if prev[o] == r.LadderKey {
					t.Fatalf("sessions %d and %d share the key %x", o, s, r.LadderKey)
				}
			}
		}
	}
	if crossed == 0 {
		t.Error("no session crossed a rung: the test does not exercise the parent key")
	}
	// The baselines' key is the ladder's first rung, fixed: inside the shared prompt.
	if a, b := w.Requests[0].Key, w.Requests[len(w.Requests)-1].Key; a != b {
		t.Errorf("the fixed 4 KiB key differs between sessions (%x, %x): the test's shared prefix is too short", a, b)
	}
}
