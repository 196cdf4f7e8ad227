// Package server runs the control server: the ADS endpoint Envoys and sidecars subscribe to,
// the fleet-file reload loop, and the HTTP endpoint for health, metrics and introspection.
//
// A fleet file that fails validation never replaces the one in use: the server logs the error,
// counts it in meridian_control_fleet_reload_errors_total, and keeps serving its last good
// snapshots. Envoy NACKs are logged and counted in meridian_control_xds_nacks_total.
package server
