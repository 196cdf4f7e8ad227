// Package server is the sidecar's ext_proc service: for each request Envoy sends it the
// headers and (the first bytes of) the body; it answers with the ordered endpoint list in
// x-gateway-destination-endpoint and the envoy.lb metadata, or with an immediate error.
//
// The hot path reads one immutable routing snapshot through an atomic pointer. Snapshots are
// built off the hot path, from xDS views, by Update. A stream never blocks on another stream.
package server
