// Package bootstrap renders the Envoy bootstrap for one meridian node from the embedded
// template envoy.yaml.tmpl. Params.Validate checks every value before rendering, so a
// rendered file only fails Envoy's validation if the template itself is wrong (which
// TestEnvoyValidates checks with a real Envoy).
package bootstrap
