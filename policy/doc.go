// Package policy holds what the control server tells every sidecar beyond the EDS weights,
// in the form both sides compute with: the retry budget curve and the shed fractions, and
// their conversion from the meridian.v1.Policy message. It sits below control/ and extproc/,
// which both import it, so the control server's state page and the sidecar do the same
// arithmetic from one copy.
//
// Values are plain and immutable; Validate changes nothing and names each field by the
// YAML path an operator writes (retry.max_retries_idle, ...).
package policy
