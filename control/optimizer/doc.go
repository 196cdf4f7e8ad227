// Package optimizer runs one control period: it turns the fleet file and what the fleet
// reported (demand, engine curves, penalties, suspect engines) into a solver.Problem, solves
// it, and turns the solution into quantized EDS weights per node and model and a Policy
// (shed fractions, retry budget, planned utilization) per node.
//
// It is the anti-oscillation layer above the LP's own movement term: a new split is only
// published when some (node, model) share moved by more than Config.MinShareChange, because
// every published change rebuilds Envoy's hash tables and moves keys, which costs KV-cache
// locality. Between publications the previous weights stay, and the previous solution is the
// next solve's reference point. A share the new split ends is the exception: it is taken
// away at once whatever its size, alone (the weights in force minus that share), so that a
// sliver of spill does not stay once demand has gone home, nor a share on an engine that
// turned suspect or ineligible. And no published share moves by more than
// Config.MaxShareStep in one period while the engines that had a share stay eligible and
// not suspect: a larger move of the LP's solution is published in steps toward it, so a
// vertex jump between near-equal engines becomes a gradual shift that caches and bounded
// loads follow, while a failing engine is still dropped at once.
//
// An Optimizer is not safe for concurrent use: one control loop owns it.
package optimizer
