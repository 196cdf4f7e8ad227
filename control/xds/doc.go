// Package xds turns routing plans into per-node xDS snapshots and serves them over ADS.
//
// One snapshot per Envoy node id (a data-plane cluster). Every published change takes a new
// version from one counter, used for all resource types of that snapshot. A plan is checked
// before anything is published (weights >= 1, every referenced cluster exists, addresses
// parse); a plan that fails the check is refused and the last good snapshots stay in place.
// Nodes whose resources did not change keep their version, so their Envoys see no update.
//
// Publisher is safe for concurrent use; Publish calls are serialized.
package xds
