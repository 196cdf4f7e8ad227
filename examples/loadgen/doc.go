// Command loadgen drives an OpenAI-compatible server with open-loop or
// trace-replay load and prints a JSON summary of what it measured. Run
// loadgen --help for every flag; the work is done by package load.
//
// Invariants: every run is bounded (open loop needs --duration or --count, a
// replay ends with its trace, each request with --timeout); the last line on
// stdout is the one-line JSON summary, also after Ctrl-C; progress and
// diagnostics go to stderr only; the only network peer is --url.
package main
