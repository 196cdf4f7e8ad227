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
// request (or sheds it), Observe learns each attempt's outcome, and Tick, every second of
// virtual time, sees the engines' scraped signals (up, running, waiting, KV usage) as a
// health checker and a metrics scraper would. Baseline policies live here; the meridian
// policy runs the real control/solver and extproc code.
//
// # Measures
//
// TTFT and end-to-end latency are measured at the client: they include the network
// round trip to the engine that served the request and any failed attempts before it.
// kv_hit_rate is prompt blocks served from an engine's prefix cache over all prompt block
// references, the same ratio as trace.Stats.HitRateUpperBound (an infinite cache shared by
// every engine), so the two are directly comparable.
package sim
