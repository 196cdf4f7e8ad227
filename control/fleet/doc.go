// Package fleet loads and validates the fleet file: the YAML description of the data-plane
// clusters (Envoy node ids), the engines behind them, the network distance between the two,
// and optional static weights.
//
// The pipeline is strict and fixed: decode with unknown fields rejected, apply defaults,
// Validate, then use. Validation never changes a value; every error names the file, the
// field path and the reason. A *Fleet returned by Load or Parse is valid and must be treated
// as immutable: callers share it across goroutines without copying.
package fleet
