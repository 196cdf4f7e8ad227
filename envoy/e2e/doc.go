// Package e2e holds the end-to-end tests that run the real system: a real Envoy, the control
// server, sidecars and mock engines as separate processes on 127.0.0.1. Run them with
// `go test ./envoy/e2e -run TestE2E`. With CI=true a missing Envoy fails them.
package e2e
