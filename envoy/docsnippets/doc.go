// Package docsnippets holds the tests that load every configuration snippet in the user
// documentation (docs/integration.md, docs/operations.md, docs/architecture.md), so the
// docs cannot drift from what Envoy and meridian accept.
//
// A snippet is a fenced ```yaml or ```json block whose info string names what it is:
//
//   - an Envoy message type (`yaml envoy.config.cluster.v3.Cluster`): decoded strictly
//     against the Envoy v1.40 protos and checked with their validation rules; a
//     Bootstrap is also run through `envoy --mode validate`;
//   - `meridian.fleet`: parsed and validated as a fleet file;
//   - `meridian.sidecar`: loaded as the sidecar's --config file;
//   - `inference.networking.k8s.io/v1.InferencePool`: decoded strictly into the v1 fields.
//
// A yaml or json block without a kind fails the tests: it would be a snippet nothing loads.
// Other blocks (```text diagrams, shell commands) are not configuration.
package docsnippets
