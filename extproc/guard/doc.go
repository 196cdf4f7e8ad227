// Package guard holds the sidecar's local guards: the protections that must react
// faster than the control server's solve loop. All of them decide from local state
// only and never call the control server.
//
//   - Outliers turns per-engine outcomes (errors, time to first token, inter-token
//     latency) into multiplicative weight penalties in (0, 1] for engines that are
//     outliers against their peers (median + k·MAD), which decay back with a half-life.
//     Published factors are rounded to OutlierConfig.Quantum and change at most once
//     per OutlierConfig.PublishInterval (see "Publishing" below).
//   - Retries turns the control server's retry budget and the current utilization into
//     a per-request retry allowance, capped by a token bucket on the retry ratio.
//   - Shedder decides which requests to refuse with 503 when the control server asks
//     for a shed fraction or when every candidate engine is at its local limit,
//     lowest priority first and no more than needed; within a class, a request's
//     chance is in proportion to its work (ShedConfig.ByWork), so the fraction's share
//     of the work is met by refusing the fewest requests.
//
// # Publishing
//
// Every change of the published factors (a new Penalties.Version) makes the sidecar
// rebuild the routing table of each model the changed engines serve, which costs tens of
// milliseconds of CPU at the picker's default size. The continuous factors move at every
// evaluation (every 250 ms in the sidecar) while an engine falls (halving every
// DropHalfLife) or recovers, so two rules bound the rebuilds:
//
//   - A factor is published rounded to a multiple of Quantum (0.05): a move within one
//     step is not a change. Down from 1 to MinFactor and back is at most 2 × 19 changes.
//   - Published factors change at most once per PublishInterval (1 s, one DropHalfLife).
//     A change after a quiet interval is published at the evaluation that makes it, so a
//     newly failing engine is cut at once; later ones wait out the interval and are then
//     published together at their current values, so none is lost and the published
//     factor of a falling engine is at most one DropHalfLife behind (at most twice the
//     continuous one).
//
// The statistics in a snapshot are always the current ones. Before these rules, a CPU
// profile of the sidecar at 200 req/s of 220 KB prompts spent 64% of its samples in table
// rebuilds, four a second while one engine's factor fell (docs/performance.md).
//
// # Invariants
//
//   - Every type is safe for concurrent use; none starts a goroutine.
//   - Time comes only from the injected Clock, so tests and the simulator run them on
//     virtual time.
//   - Configs are validated, never repaired: New* returns an error naming the field.
//   - Published snapshots (Penalties) are immutable; readers never lock.
//   - A published factor never changes without a new Version (an engine is forgotten
//     only once its factor of 1 was published).
//   - Nothing here knows about gRPC, Envoy or HTTP; the proto helpers in policy.go only
//     convert the control server's Policy messages into these plain types.
package guard
