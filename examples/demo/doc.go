// Command demo runs the whole meridian system on this machine and plays a scripted story
// through it: the control server, two data-plane clusters (Envoy + sidecar each) and six
// mock engines in two regions (examples/demo/fleet.yaml), with inter-region latency,
// driven by the SSE load generator (examples/loadgen/load). It draws a live one-screen
// summary and ends with a report. `make demo` runs it through scripts/demo.sh.
//
// The story's five phases (steady, surge, slow engine, overload, recovery) share --duration;
// their request rates are fractions of each region's local capacity, so the story fits any
// fleet file with two clusters.
//
// Invariants:
//   - Everything the report says about the system is read from the system: weights, penalties
//     and shed fractions from the control server's /debug/state, retries from Envoy's stats,
//     latencies and who served each request from the clients' answers. When the system did
//     not react (no solver, no penalty), the report says so; it never assumes.
//   - Every process the demo starts is stopped when it returns, including on SIGINT/SIGTERM,
//     after which it still prints the report of what ran and exits 130.
//   - Traffic is bounded: dispatch stops at --duration, and every request at 20 s.
//   - Inter-region latency is emulated at the engines (stack.DelayByRegion) from the fleet
//     file's rtt_ms, and the demo says so at start; see network.go for why not tc netem.
package main
