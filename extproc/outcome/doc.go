// Package outcome learns how each request ended, without putting the sidecar on the
// response path: Envoy sends its access log entries over gRPC (the Access Log Service) to
// the sidecar when each request completes, and Receiver turns every entry into a Record.
//
// The sidecar tags each request it steers with a ticket header (HeaderTicket); Envoy logs
// it with the entry, which links the outcome back to the in-flight ticket and the engine the
// sidecar chose. Entries without a ticket (requests the sidecar did not steer) are still
// reported, with an empty Ticket.
//
// Time to first token is taken at the first response body byte (Envoy's US_RX_BODY_BEG),
// not at the response headers: vLLM sends its headers before the first token. It includes
// the network round trip to the engine, which the sidecar subtracts.
package outcome
