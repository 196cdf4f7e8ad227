// Package xdsclient subscribes to the control server over ADS with the node id of the Envoy
// the sidecar serves, so the sidecar holds the same clusters and endpoint weights as its
// Envoy. It asks for every cluster (CDS, wildcard) and then for their assignments (EDS), ACKs
// what it can use and NACKs what it cannot, and reconnects with backoff when the stream
// breaks. While disconnected it keeps the last view: the data plane routes on cached state.
//
// Each complete view is handed to the OnUpdate callback as a new immutable *View.
package xdsclient
