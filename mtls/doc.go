// Package mtls is meridian's mutual TLS: the identities peers prove, certificates and keys
// read from files and reloaded when they change, and the TLS configurations and gRPC
// credentials the control server, the sidecar and their clients use.
//
// Identities are SPIFFE-style URI SANs in the trust domain "meridian":
//
//	spiffe://meridian/control                 the control server
//	spiffe://meridian/node/<node-id>/sidecar  a sidecar serving node <node-id>
//	spiffe://meridian/node/<node-id>/envoy    an Envoy of node <node-id>
//
// A certificate names exactly one identity. Authorization (which identity may do what) is
// the caller's: the control server lets a node's sidecar report only for that node, and a
// node's Envoy or sidecar fetch only that node's resources (control/server).
//
// Invariants: a Source always holds a certificate, key and CA that parsed and match; a
// reload that fails (a half-written file, a key that does not match) is logged and the
// last good material stays. Connections already established keep the certificate they
// were made with; every new handshake uses the current one, so rotation drops no stream.
package mtls
