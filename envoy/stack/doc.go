// Package stack starts a whole meridian system on this machine for tests, benchmarks and the
// demo: the control server, one Envoy and one sidecar per data-plane node, and mock engines,
// each a real process on 127.0.0.1 with its own free port and log file.
//
// Processes keep their ports across Stop and Start, so a test can kill a component and bring
// it back where the others expect it. Close stops everything the stack started.
package stack
