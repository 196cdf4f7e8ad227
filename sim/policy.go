package sim

import (
	"fmt"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
)

// Policy routes requests for the whole fleet of proxies. A run calls it from one goroutine.
type Policy interface {
	// Route returns the engines to try for r, in order, and how many attempts after the
	// first may be made. No engines means shed: the proxy answers 503 at once.
	Route(now time.Duration, r *Request) Route
	// Observe learns what happened to an attempt.
	Observe(now time.Duration, o Outcome)
	// Tick runs every 250 ms of virtual time with the freshly scraped engine signals.
	Tick(now time.Duration, v *View)
	// Weights writes cluster c's intended traffic share per engine into dst (summing to 1,
	// or all zero when the policy has none), for plots and churn.
	Weights(c int, dst []float64)
}

// KVEventSubscriber is implemented by policies that index the engines' caches from their
// KV-cache events, as vLLM publishes them. The run delivers each engine's events in order,
// Config.KVEventDelay after they happened, to the policy's KVEvents.
type KVEventSubscriber interface {
	KVEvents(now time.Duration, engine int, events []engine.KVEvent)
}

// Scraper is implemented by policies that scrape the engines' metrics more often than
// they Tick. The run calls Scrape every ScrapePeriod with the engines' up state, batch,
// queue and KV usage (EngineView without Stats or prefix counters).
type Scraper interface {
	ScrapePeriod() time.Duration
	Scrape(now time.Duration, v *View)
}

// Route is a policy's answer for one request.
type Route struct {
	Engines []int
	Retries int
	// UnsentOnly limits the retries to attempts that never reached an engine (a refused
	// connection), as Envoy's retry_on "connect-failure,refused-stream" does.
	UnsentOnly bool
	// ShedReason, for a route without engines, says why the request was refused (for
	// meridian, the sidecar's verdict: shed_quota, shed_limit, no_engine); results count
	// sheds by it. Empty when the policy does not say.
	ShedReason string
}

// OutcomeKind says which point of an attempt an Outcome reports.
type OutcomeKind uint8

const (
	// Sent: the attempt left the proxy for Engine.
	Sent OutcomeKind = iota
	// FirstToken: the first token reached the proxy; TTFT is set.
	FirstToken
	// Done: the last token reached the proxy; the attempt succeeded.
	Done
	// Failed: the attempt failed (engine down, connection reset, request refused).
	Failed
)

// Outcome reports one step of one attempt.
type Outcome struct {
	Kind    OutcomeKind
	Request *Request
	Engine  int
	// TTFT is measured at the proxy from the request's arrival, for FirstToken.
	TTFT time.Duration
	// CachedBlocks is how many prompt blocks the engine found cached, for FirstToken.
	CachedBlocks int
	// ITL is the attempt's mean inter-token latency, for Done (0 for one-token answers).
	ITL time.Duration
	// Final is set on a Failed outcome after which the request is not retried: it ended.
	Final bool
	// Rejected is set on a Failed outcome the engine answered as a bad request (vLLM's
	// 400: the prompt and output do not fit its KV cache): the request's fault, not the
	// engine's, so health and latency signals must not count it.
	Rejected bool
}

// View is what a policy can see of the fleet at a tick: a scrape of every engine.
type View struct {
	Engines []EngineView
	// RTT[c][e] is the round trip from cluster c to engine e.
	RTT [][]time.Duration
	// Region[e] is engine e's region (and the index of that region's cluster).
	Region []int
	// Capacity is one engine's cold capacity in requests/s (see Capacity).
	Capacity float64
}

// EngineView is one engine's scraped signals. A down engine has Up false and zero values.
type EngineView struct {
	Up               bool
	Running, Waiting int
	KVUsage          float64
	// PrefixQueries and PrefixHits are the engine's cumulative counters (tokens).
	PrefixQueries, PrefixHits uint64
	// Stats is the engine's full /metrics state, histograms included (zero when down).
	Stats engine.Stats
}

// PolicyNames lists the policies a run can compare, in report order.
var PolicyNames = []string{"round-robin", "least-request", "prefix-hash", "p-controller",
	"llm-d", "llm-d-precise", "dynamo", "sglang", "meridian", "meridian-defaults"}

// newPolicy builds the named policy for a fleet of engines across clusters. Every policy
// but meridian's is deployed by newPooled as Config.Deployment says; meridian is one
// control server and Config.Replicas sidecars per region, and models that itself.
func newPolicy(name string, f fleetShape, cfg *Config, w *Workload) (Policy, error) {
	switch name {
	case "meridian":
		return newMeridian(f, cfg, w, fleetTuning(w))
	case "meridian-defaults":
		return newMeridian(f, cfg, w, defaultTuning(w))
	}
	build, ok := builderFor(name)
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (known: %v)", name, PolicyNames)
	}
	return newPooled(f, cfg, build)
}

// builderFor returns the builder of one router replica of a pooled policy.
func builderFor(name string) (replicaBuilder, bool) {
	switch name {
	case "round-robin":
		return func(f fleetShape, env poolEnv) (Policy, error) { return newRoundRobin(f, env.cfg.Retries), nil }, true
	case "least-request":
		return func(f fleetShape, env poolEnv) (Policy, error) { return newLeastRequest(f, env.cfg.Retries), nil }, true
	case "prefix-hash":
		return func(f fleetShape, env poolEnv) (Policy, error) { return newPrefixHash(f, env.cfg.Retries), nil }, true
	case "p-controller":
		return func(f fleetShape, env poolEnv) (Policy, error) { return newPController(f, env.cfg.Retries), nil }, true
	case "llm-d":
		return func(f fleetShape, env poolEnv) (Policy, error) { return newLLMD(f, env, false), nil }, true
	case "llm-d-precise":
		return func(f fleetShape, env poolEnv) (Policy, error) { return newLLMD(f, env, true), nil }, true
	case "dynamo":
		return func(f fleetShape, env poolEnv) (Policy, error) { return newDynamo(f, env), nil }, true
	case "sglang":
		return func(f fleetShape, env poolEnv) (Policy, error) { return newSGLang(f, env), nil }, true
	}
	return nil, false
}

// fleetShape is what policies know of the fleet when they are built.
type fleetShape struct {
	clusters, engines int
}
