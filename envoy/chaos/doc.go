// Package chaos is meridian's reliability suite: each TestChaos... test starts the real
// system on 127.0.0.1 (control server, Envoy, sidecar, mock engines; see envoy/stack),
// drives a bounded open-loop load through Envoy, breaks one thing (a process killed or
// frozen, an engine slowed, overload, hostile input, a bad fleet file) and asserts figures:
// failures, attempts per request, how fast the router reacts and recovers.
//
// Invariants of the suite:
//   - Every load loop is bounded in requests and time, and every request in time.
//   - Each test owns its stack; a failed test keeps its logs and prints where.
//   - Tests run one after another: the figures are latencies on a shared machine.
//   - With MERIDIAN_CHAOS_FIGURES=path, every measured figure is appended to path as a
//     JSON line {"test", "figure", "value"}; docs/reliability.md is built from them.
package chaos
