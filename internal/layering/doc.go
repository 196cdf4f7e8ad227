// Package layering holds the test that enforces meridian's package layering:
// no package under control/ imports extproc/ or envoy/, and no package under
// extproc/ imports control/ or envoy/, directly or through another package.
// The rule is read from `go list -deps`, so it covers every import path the
// Go tool would build. The packages under envoy/ (the real-Envoy harness and
// suites), examples/ and sim/ are outside the rule and may import anything.
//
// The package has no code of its own; `go test ./internal/layering` is the check.
package layering
