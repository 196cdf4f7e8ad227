// Package decide is the sidecar's decision core, free of any transport: given a parsed
// request (model, prefix key, priority, prompt size) and the node's current view, Route
// returns a Decision (the ordered engines, the retry grant, a shed verdict with its reason,
// an in-flight ticket). Outcome takes what the proxy reports of each finished request;
// BuildReport and ApplyPolicy are the two halves of the exchange with the control server.
// Time comes from an injected guard.Clock. The ext_proc server (extproc/server) translates
// Envoy's messages into these calls, and the simulator (sim) drives the same core on
// virtual time, so a simulated decision is the product's decision.
//
// # Model
//
// The routing snapshot is the node's EDS view with every weight multiplied by the local
// outlier penalty, one extproc/picker table per model (weighted rendezvous hashing with
// bounded loads). Failover engines (EDS priority 1: no share, may be retried) follow the
// picked ones in the destination list. The Config.OverflowEngines nearest of them that
// the outlier guard does not penalize are also the table's overflow endpoints: a request
// the picked engine would queue goes to the emptiest of them (picker.Config.OverflowAt;
// Decision.Overflowed), listed once, first. What the sidecar scrapes of each engine's queue
// (LoadTargets: those with a share and the overflow ones; ObserveEngineLoad: the tokens its
// KV cache holds, the uncached tokens of its prompts in prefill Config.PrefillWeight times
// more and its waiting requests, or its
// running plus waiting requests, beyond the core's own and its peers') counts as
// other routers' work in the picker's least-work choice. The node's other sidecars send
// their requests in flight every few milliseconds (SetPeerInFlight; AppendInFlight is
// this core's half): the picker counts them with the core's own, in bounded loads and the
// least-work choice, as one sidecar seeing all of the node's traffic would. A request is
// shed when every candidate is at its local cap (or past the share of it its priority may use: the top 20% of each cap is held
// back from the lowest class, less for higher ones), or by the control server's shed
// fraction for the model (guard.Shedder), which takes only requests whose picked engine
// would hold more than Config.QuotaAt of its KV cache in work or held requests waiting at
// its last scrape (Decision.QuotaHeld marks the others), each weighed by its work (prompt
// tokens plus Config.DecodeWork) under the shed config's ByWork. The retry grant is the policy's utilization
// curve, cut to the credits of a token bucket; with no budget, a request may still move
// once if it never reached an engine (RetryOnUnsent), which adds no load anywhere.
//
// A snapshot is rebuilt for each new view and for each change of the published penalties
// (at most once per guard.OutlierConfig.PublishInterval; see guard's doc). A rebuild keeps
// the table of every model whose endpoints, weights and caps did not change: NewTable is a
// function of its inputs, so the kept table ranks every key as a new one would, and a
// penalty on one engine costs only the tables of the models that engine serves.
// TablesBuilt counts the tables built, by cause.
//
// # State, writers and synchronization
//
// Route is the request path: it takes no lock shared by all requests.
//
//	state                         written by                     read by          synchronized by
//	routing snapshot              Update, RefreshPenalties        Route, Outcome   atomic.Pointer; rebuilds serialized by rebuildMu (off the request path)
//	per-engine in-flight counts   Route (start), Outcome/EndStream/Expire (done)  Route (bounded loads)  atomics in picker.Loads, padded per engine
//	per-engine observed work      ObserveEngineLoad (the engine-load scrape)     Route (least-work choice)  atomics in picker.Loads (the map under its mutex, off the request path)
//	each key's last engine        Route (Remember), AdoptPlacements (peers')  Route (PickHome)  atomic words in picker.Homes, one per slot
//	prefix marks pinned in flight  Route (Pin), Outcome/EndStream/Expire (the ticket's Done)  Route (the room check)  CAS on words in picker.Pins, one per slot
//	caches warm at the start      ObserveEngineLoad (first look) Route (warmingUp) atomic.Int32; the engines looked at under firstLooksMu
//	changed homes, for peers      Route (Remember's journal)     AppendPlacements  an atomic cursor and ring in picker.Homes; the drain under drainMu
//	mean work of routed requests  Route (two atomic adds)        ObserveEngineLoad  atomics; the mean under meanMu (off the request path)
//	engines' prefill and finish counters  ObserveEngineLoad (engineCounters)  ObserveEngineLoad  countersMu (off the request path)
//	peers' requests in flight     SetPeerInFlight, DropPeer      Route (picker.Loads' peer work), ObserveEngineLoad  peersMu for the snapshots; atomics in picker.Loads
//	per-model arrival counters    Route                          BuildReport      atomic.Int64 (Swap at each report)
//	per-model shed state          Route (Decide), ApplyPolicy    Route            the model's own mutex (guard.ModelShedder)
//	retry credits and curve       Route (Allow), Outcome (Spent), ApplyPolicy    Route  CAS on a float64's bits; atomic.Pointer for the curve
//	planned utilization           ApplyPolicy                    Route            atomic.Uint64 (float64 bits)
//	in-flight tickets             Route (put), Outcome, EndStream, Expire         Outcome  16 shards by ticket sequence, each with its own mutex
//	request-id index, finished    Route (put), Outcome           Outcome          16 shards by FNV-1a of the id, each with its own mutex
//	outlier statistics            Outcome                        RefreshPenalties  guard.Outliers' mutex (outcome path only)
//	outcome-silence counters      Route, Outcome                 OutcomeSilence   atomics
//
// RefreshPenalties reads the current view, and Update the current penalties, under
// rebuildMu, so neither rebuild undoes the other.
//
// The model-state registry (statesMu) is touched only when a snapshot is built and when a
// report is cut; snapshots carry pointers to each model's state, so the request path never
// looks it up.
//
// # Invariants
//
//   - Every ticket's in-flight count, and the prefix marks it pins, are released exactly
//     once, by whichever of stream end, outcome and expiry comes first.
//   - A view that cannot be built is refused; the current snapshot stays.
//   - A policy part that fails validation is refused; the rest applies.
//   - Draining and zero-weight endpoints are never listed: Envoy's override_host does not
//     check health.
package decide
