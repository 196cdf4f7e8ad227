package sim

import (
	"context"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meridian-router/meridian/control/xds"
	"github.com/meridian-router/meridian/enginemetrics"
	"github.com/meridian-router/meridian/extproc/decide"
	"github.com/meridian-router/meridian/extproc/request"
	"github.com/meridian-router/meridian/extproc/server"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
	"github.com/meridian-router/meridian/xdsapi"
)

// One request sequence goes through the real ext_proc server (over loopback gRPC, as Envoy
// sends it) and through the simulator's meridian adapter, each holding the same node view:
// every decision, the ordered endpoint list and the retry grant, is the same, before and
// after the same shed policy arrives. The requests stay in flight, so bounded loads spill
// some of them, on both sides alike.
func TestSidecarAndSimulatorDecideAlike(t *testing.T) {
	cfg := &Config{Regions: DefaultRegions, EnginesPerRegion: 3, RTT: DefaultRTT()}
	w := &Workload{ColdService: 2}
	m, err := newMeridian(fleetShape{clusters: 3, engines: 9}, cfg, w, defaultTuning(w))
	if err != nil {
		t.Fatal(err)
	}
	node := m.sidecars[0][0].node

	// The ext_proc server gets the view the simulator's sidecars of that node hold.
	plan, err := xds.BuildPlan(m.fleet, xds.SolvedWeights(m.fleet, nil))
	if err != nil {
		t.Fatal(err)
	}
	view := &xdsapi.View{Version: "1", Models: map[string]xdsapi.ModelView{}}
	for model, eps := range plan.Assignments[node] {
		view.Models[model] = xdsapi.ModelView{Name: model, Cluster: xdsapi.ClusterName(model), Endpoints: eps}
	}
	srv, err := server.NewWithClock(sidecarConfig(), &virtualClock{})
	if err != nil {
		t.Fatal(err)
	}
	srv.Update(view)
	proc := serveExtProc(t, srv)

	addrs := map[int]string{}
	for e, eng := range m.fleet.Engines {
		addrs[e] = eng.Address
	}
	policy := &meridianv1.Policy{Version: "p", Shed: []*meridianv1.ModelShed{{Model: meridianModel, Fraction: 0.4}},
		RetryBudget: &meridianv1.RetryBudget{MaxRetriesIdle: 1, GenerousBelow: 0.2, ZeroAt: 0.6, RetryOn: "5xx"}, Utilization: 0.3}
	opts := sidecarConfig().Request
	spread, steered, shed := map[string]bool{}, 0, 0
	for i := range 120 {
		if i == 80 {
			srv.ApplyPolicy(policy)
			if err := m.sidecars[0][0].core.ApplyPolicy(policy); err != nil {
				t.Fatal(err)
			}
		}
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"question %d"}]}`,
			meridianModel, strings.Repeat(fmt.Sprintf("tenant %d shares this system prompt. ", i%7), 200), i)
		var req request.Request
		if err := request.Parse(request.ChatCompletions, []byte(body), true, opts, &req); err != nil {
			t.Fatal(err)
		}

		dest, retries, status := proc(t, body)
		// The simulator sizes a request's body from its prompt tokens, the sidecar reads the
		// body it gets: the same size gives both the same bounded-load weight.
		r := m.Route(0, &Request{ID: i, Cluster: 0, LadderKey: req.Key, ParentKey: req.ParentKey, InputTokens: len(body) / decide.BytesPerToken})
		var simDest []string
		for _, e := range r.Engines {
			simDest = append(simDest, addrs[e])
		}
		if status != 0 {
			shed++
			if len(r.Engines) != 0 {
				t.Fatalf("request %d: the sidecar answered %d, the simulator routed to %v", i, status, simDest)
			}
			continue
		}
		steered++
		if got := strings.Join(simDest, ","); got != dest {
			t.Fatalf("request %d: sidecar %q, simulator %q", i, dest, got)
		}
		if retries != fmt.Sprint(r.Retries) {
			t.Fatalf("request %d: sidecar grants %s retries, simulator %d", i, retries, r.Retries)
		}
		spread[simDest[0]] = true
	}
	if shed == 0 || steered < 80 || len(spread) < 3 {
		t.Fatalf("the sequence did not exercise the core: %d steered to %d primaries, %d shed", steered, len(spread), shed)
	}
	t.Logf("%d decisions alike: %d steered over %d primaries, %d shed", steered+shed, steered, len(spread), shed)
}

// serveExtProc serves srv on loopback and returns a function that sends one buffered
// request through it, returning the destination header, x-envoy-max-retries, and the
// status of an immediate response (0 when steered). Streams stay open until the test
// ends, so each request stays in flight as Envoy would keep it.
func serveExtProc(t *testing.T, srv *server.Server) func(*testing.T, string) (string, string, int) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := extprocv3.NewExternalProcessorClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return func(t *testing.T, body string) (string, string, int) {
		st, err := client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		msgs := []*extprocv3.ProcessingRequest{
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{
				Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}}},
			{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}},
		}
		var last *extprocv3.ProcessingResponse
		for _, msg := range msgs {
			if err := st.Send(msg); err != nil {
				t.Fatal(err)
			}
			if last, err = st.Recv(); err != nil {
				t.Fatal(err)
			}
		}
		if ir := last.GetImmediateResponse(); ir != nil {
			return "", "", int(ir.GetStatus().GetCode())
		}
		var dest, retries string
		for _, h := range last.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
			switch h.GetHeader().GetKey() {
			case xdsapi.HeaderDestination:
				dest = string(h.GetHeader().GetRawValue())
			case "x-envoy-max-retries":
				retries = string(h.GetHeader().GetRawValue())
			}
		}
		return dest, retries, 0
	}
}

// The simulated sidecars of a cluster exchange placements as the control server relays
// them: a key one replica placed reaches the cluster's other replicas, and only them, and
// their next request for it goes where the first did.
func TestSimulatedSidecarsExchangePlacements(t *testing.T) {
	cfg := &Config{Regions: DefaultRegions, EnginesPerRegion: 3, RTT: DefaultRTT(), Replicas: 4}
	w := &Workload{ColdService: 2}
	m, err := newMeridian(fleetShape{clusters: 3, engines: 9}, cfg, w, defaultTuning(w))
	if err != nil {
		t.Fatal(err)
	}
	const key = 0x0123_4567_89ab_cdef
	idle, err := newMeridian(fleetShape{clusters: 3, engines: 9}, cfg, w, defaultTuning(w))
	if err != nil {
		t.Fatal(err)
	}
	usual := idle.Route(0, &Request{ID: 1, Cluster: 0, LadderKey: key, InputTokens: 4000}).Engines[0] // the key's first engine
	// Replica 0 sees others' work on the key's first engine, so it places the new key elsewhere.
	m.sidecars[0][0].core.ObserveEngineLoad(m.addrs[usual], enginemetrics.Load{Running: 10, KVUsage: math.NaN()})
	const warm = 2 * time.Minute // past the sidecars' warm-up, when unknown keys are placed freely
	first := m.Route(warm, &Request{ID: 1, Cluster: 0, Replica: 0, LadderKey: key, InputTokens: 4000})
	if first.Engines[0] == usual {
		t.Fatalf("replica 0 placed the new key on its busy first engine %d", usual)
	}
	if got := m.exchange(); got != 3 {
		t.Fatalf("%d placements adopted, want 3 (the cluster's other replicas)", got)
	}
	if got := m.exchange(); got != 0 {
		t.Errorf("a second exchange adopted %d placements, want none", got)
	}
	for rep := 1; rep < 4; rep++ {
		if r := m.Route(warm, &Request{ID: 1 + rep, Cluster: 0, Replica: rep, LadderKey: key, InputTokens: 4000}); r.Engines[0] != first.Engines[0] {
			t.Errorf("replica %d sent the key to engine %d, want %d where replica 0 placed it", rep, r.Engines[0], first.Engines[0])
		}
	}
}

// A request no engine's cache can hold is answered 400, as vLLM answers it: the sidecar
// logs it as the request's fault, so neither its report nor its penalties count it
// against the engine (a conversation of such prompts used to make its engine Failing and
// drop its share at once).
func TestRejectedRequestIsNotTheEnginesError(t *testing.T) {
	cfg := &Config{Regions: DefaultRegions, EnginesPerRegion: 3, RTT: DefaultRTT()}
	w := &Workload{ColdService: 2}
	m, err := newMeridian(fleetShape{clusters: 3, engines: 9}, cfg, w, defaultTuning(w))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		r := &Request{ID: i, Cluster: 0, LadderKey: 42, InputTokens: 200_000}
		rt := m.Route(0, r)
		m.Observe(0, Outcome{Kind: Sent, Request: r, Engine: rt.Engines[0]})
		m.Observe(0, Outcome{Kind: Failed, Request: r, Engine: rt.Engines[0], Final: true, Rejected: true})
	}
	core := m.sidecars[0][0].core
	if _, err := core.RefreshPenalties(); err != nil {
		t.Fatal(err)
	}
	rep := core.BuildReport("us-east", "s")
	for _, e := range rep.GetEngines() {
		if e.GetErrors() != 0 {
			t.Errorf("engine %s: %d errors reported for rejected requests, want 0", e.GetEngine(), e.GetErrors())
		}
	}
	if len(rep.GetEngines()) == 0 {
		t.Fatal("the report names no engine: the requests were not logged")
	}
}

// The simulated sidecars of a cluster send each other their requests in flight every
// peers.interval, and only within the cluster: a request one replica sent shows in its
// cluster's other replicas' snapshots at the next exchange and leaves at the one after it
// ends, while the engines are scraped on their own, slower, period.
func TestSimulatedSidecarsSendEachOtherTheirRequestsInFlight(t *testing.T) {
	cfg := &Config{Regions: DefaultRegions, EnginesPerRegion: 3, RTT: DefaultRTT(), Replicas: 3}
	w := &Workload{ColdService: 2}
	m, err := newMeridian(fleetShape{clusters: 3, engines: 9}, cfg, w, defaultTuning(w))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.ScrapePeriod(), m.cfg.PeerInterval; got != want || want >= m.cfg.EngineLoad.Interval {
		t.Fatalf("Scrape runs every %v, want the peer interval %v (under the engine scrape's %v)", got, want, m.cfg.EngineLoad.Interval)
	}
	var v View
	v.Engines = make([]EngineView, 9)
	for i := range v.Engines {
		v.Engines[i].Up = true
	}
	r := &Request{ID: 1, Cluster: 0, Replica: 0, LadderKey: 7, InputTokens: 4000}
	rt := m.Route(0, r)
	m.Observe(0, Outcome{Kind: Sent, Request: r, Engine: rt.Engines[0]})
	peerSees := func(rep int) int64 { return m.sidecars[0][rep].core.PeerInFlight()[m.names[rt.Engines[0]]] }
	if peerSees(1) != 0 {
		t.Fatal("replica 1 saw replica 0's request before any exchange")
	}
	m.Scrape(m.cfg.PeerInterval, &v)
	for rep := 1; rep < 3; rep++ {
		if got := peerSees(rep); got != 1 {
			t.Errorf("replica %d sees %d of its peer's requests on engine %d after an exchange, want 1", rep, got, rt.Engines[0])
		}
	}
	if got := m.sidecars[1][0].core.PeerInFlight(); len(got) != 0 {
		t.Errorf("a sidecar of another cluster sees %v: peers are the cluster's own", got)
	}
	m.Observe(2*m.cfg.PeerInterval, Outcome{Kind: Done, Request: r, Engine: rt.Engines[0], Final: true})
	m.Scrape(2*m.cfg.PeerInterval, &v)
	if got := peerSees(1); got != 0 {
		t.Errorf("replica 1 still sees %d requests after the request ended and an exchange", got)
	}
}

// With the peer exchange on, Scrape ticks on the common grid of the two periods and each
// keeps its own: the engines are scraped every engine_load.scrape_interval and the
// placements relayed every placements.exchange_interval, as with one sidecar per region.
func TestPeerExchangeKeepsTheScrapeAndPlacementPeriods(t *testing.T) {
	sc := sidecarConfig()
	sc.PeerInterval = 30 * time.Millisecond // not a divisor of the 50 ms scrape
	cfg := &Config{Regions: DefaultRegions, EnginesPerRegion: 3, RTT: DefaultRTT(), Replicas: 2, Sidecar: &sc}
	w := &Workload{ColdService: 2}
	m, err := newMeridian(fleetShape{clusters: 3, engines: 9}, cfg, w, defaultTuning(w))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.ScrapePeriod(); got != 10*time.Millisecond {
		t.Fatalf("Scrape every %v, want 10ms (the common grid of 50 and 30 ms)", got)
	}
	var v View
	v.Engines = make([]EngineView, 9)
	var scrapes, exchanges, peers []time.Duration
	for now := time.Duration(0); now <= 400*time.Millisecond; now += m.ScrapePeriod() {
		e, x, p := m.lastEngineScrape, m.lastExchange, m.lastPeers
		m.Scrape(now, &v)
		if m.lastEngineScrape != e {
			scrapes = append(scrapes, now)
		}
		if m.lastExchange != x {
			exchanges = append(exchanges, now)
		}
		if m.lastPeers != p {
			peers = append(peers, now)
		}
	}
	every := func(got []time.Duration, period time.Duration) bool {
		for i, at := range got {
			if at != time.Duration(i)*period {
				return false
			}
		}
		return len(got) > 1
	}
	if !every(scrapes, 50*time.Millisecond) || !every(exchanges, 200*time.Millisecond) || !every(peers, 30*time.Millisecond) {
		t.Errorf("engine scrapes at %v, placement exchanges at %v, peer exchanges at %v: want every 50, 200 and 30 ms", scrapes, exchanges, peers)
	}
}
