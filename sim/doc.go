// Package sim is a discrete-event simulator of an LLM inference fleet: R regions, each with
// one data-plane cluster (the proxies where requests enter) and N engines modelled by
// sim/engine, joined by an RTT matrix. It replays a request trace (sim/trace) under a
// scenario and compares routing policies on the same arrivals and the same fleet.
//
// # Time
//
// Everything runs on virtual time: a run is a heap of timestamped events (arrivals, a
// request reaching an engine, engine steps ending, errors coming back, policy ticks,
// scenario changes), processed in time order, ties broken by insertion order. No goroutine
// sleeps, so a run is deterministic: the same Config gives the same Results, bit for bit.
// Policies run in parallel goroutines, each on its own copy of the fleet.
//
// # What a policy sees
//
// A Policy is what one fleet of proxies does: Route orders the engines to try for a
// request (or sheds it), Observe learns each attempt's outcome, and Tick, every 250 ms of
// virtual time, sees the engines' scraped signals (up, running, waiting, KV usage) as a
// health checker and a metrics scraper would. A policy that scrapes more often implements
// Scraper; one that indexes the engines' caches from their KV events (BlockStored,
// BlockRemoved, as vLLM publishes them) implements KVEventSubscriber and gets each
// engine's events Config.KVEventDelay after they happened. Baseline policies live here;
// the meridian policy runs the real control/solver and extproc code.
//
// # Deployment
//
// The open routers' algorithms (llm-d, llm-d-precise, dynamo, sglang; each file cites the
// source it follows) and the simple baselines run as their users deploy them (pools.go):
// under DeployRegion one router pool per region, routing only to that region's engines,
// with Config.Replicas replicas that each keep their own state; a request goes to the
// replica Request.Replica of its region, drawn per request. DeployGlobal is one pool over
// every engine with one replica. meridian is not pooled: it is one control server and
// Config.Replicas sidecars per region, and reads Request.Replica itself; the sidecars of a
// region send each other their requests in flight every peers.interval, as the sidecar's
// peer exchange does within a region (extproc/server's peers.go).
//
// # Capacity
//
// RunCapacity finds, per policy and deployment, the highest offered rate at which a
// target fraction of requests meet Config.SLO (TTFT within a fixed allowance plus a
// per-prompt-token one, and a bound on mean inter-token latency; shed and failed requests
// miss), by a bounded search over the rate (doubling or halving to a bracket, then
// narrowing it where the attainment crosses the target), running independent
// runs on a pool of workers. A run stops as soon as its attainment cannot reach the
// target (Config.StopBelow).
//
// # Measures
//
// TTFT and end-to-end latency are measured at the client: they include the network
// round trip to the engine that served the request and any failed attempts before it.
// kv_hit_rate is prompt blocks served from an engine's prefix cache over all prompt block
// references, the same ratio as trace.Stats.HitRateUpperBound (an infinite cache shared by
// every engine), so the two are directly comparable.
package sim
