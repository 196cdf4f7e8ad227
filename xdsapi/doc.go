// Package xdsapi builds the Envoy resources meridian serves over xDS (clusters, endpoint
// assignments, the route table) and reads them back on the sidecar's side, so that the
// encoding of engines into EDS and the header and metadata names of the endpoint-picker
// protocol live in one place.
//
// Invariants of what it builds:
//   - Every model has one cluster, named by ClusterName, using the override_host load
//     balancing policy (Envoy 1.35+) with a Maglev fallback over the same EDS weights, so a
//     request that the sidecar did not steer still gets the global split.
//   - Every LbEndpoint it emits has load_balancing_weight >= 1 (Envoy NACKs 0). An engine that
//     must get no traffic from a node is left out of that node's assignment.
//   - Engine identity travels as endpoint metadata under the "meridian" namespace.
package xdsapi
