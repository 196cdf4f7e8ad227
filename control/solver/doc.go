// Package solver is meridian's global optimizer: every control period it
// decides what share of each data-plane cluster's demand for each model goes
// to each engine, by solving a linear program on COIN-OR CLP
// (github.com/lanl/clp), not by a feedback loop.
//
// The model (design.md §4): minimize
//
//	Σ flow·RTT + Σ_e Cost_e(load_e) + M·Σ shed + μ·Σ |flow − prev flow|
//
// where Cost_e(λ) = λ·L_e(λ) is the engine's latency-seconds per second under
// load λ, convex and increasing, approximated by Params.Segments chords up to
// Params.RhoMax·capacity. Every (cluster, model) demand is routed or shed,
// only engines that serve the model and are healthy get flow, and no engine
// is planned above RhoMax·capacity. "A farther engine beats a nearby
// overloaded one" is not a rule here: it falls out of the marginal costs.
//
// Invariants that callers may rely on:
//   - Solve never modifies its Problem and returns a Solution that is never
//     modified afterwards; it can be read concurrently and passed back as the
//     next Problem.Prev (matched by names, so the fleet may change).
//   - Equal problems give identical solutions (CLP's dual simplex is
//     deterministic and every tie in this package breaks by index).
//   - Load[e] ≤ RhoMax·capacity (up to CLP's 1e-7 feasibility tolerance);
//     unhealthy or zero-capacity engines, and engines that do not serve a
//     model, get exactly zero of it.
//   - Shed is nonzero only when no routing to spare capacity exists: the shed
//     price is raised above any augmenting path's cost (Stats.ShedCost).
//   - Weights never returns 0 for an engine it keeps; 0 means leave it out.
//
// Speed: the LP is split into independent components (models linked by
// shared engines), and each is solved by column generation around a
// reference point (colgen.go): a greedy seed, then rounds that add only the
// left-out routes and cost pieces whose reduced cost is negative, each round
// starting from the last one's solution, with engine rows only where two
// routes meet. The result is the full LP's optimum, or within what two rounds
// in a row could not gain (1e-7 s per request/s of demand each) when the
// search tails off; docs/performance-solver.md has the measurements and the
// alternatives that lost.
package solver
