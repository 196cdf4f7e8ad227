// Package guard holds the sidecar's local guards: the protections that must react
// faster than the control server's solve loop. All of them decide from local state
// only and never call the control server.
//
//   - Outliers turns per-engine outcomes (errors, time to first token, inter-token
//     latency) into multiplicative weight penalties in (0, 1] for engines that are
//     outliers against their peers (median + k·MAD), which decay back with a half-life.
//   - Retries turns the control server's retry budget and the current utilization into
//     a per-request retry allowance, capped by a token bucket on the retry ratio.
//   - Shedder decides which requests to refuse with 503 when the control server asks
//     for a shed fraction or when every candidate engine is at its local limit,
//     lowest priority first and no more than needed.
//
// # Invariants
//
//   - Every type is safe for concurrent use; none starts a goroutine.
//   - Time comes only from the injected Clock, so tests and the simulator run them on
//     virtual time.
//   - Configs are validated, never repaired: New* returns an error naming the field.
//   - Published snapshots (Penalties) are immutable; readers never lock.
//   - Nothing here knows about gRPC, Envoy or HTTP; the proto helpers in policy.go only
//     convert the control server's Policy messages into these plain types.
package guard
