// Package load drives an OpenAI-compatible HTTP endpoint with a schedule of
// requests and measures what comes back.
//
// A schedule is a sequence of trace.Request: open-loop arrivals made by
// OpenLoop (Poisson or uniform at a fixed rate), or a replayed trace. Each
// request is sent at its Arrival offset from the start of the run, with a
// prompt synthesized by trace.Synthesizer, so requests that share hash ids
// share their prompt prefix byte for byte.
//
// Measurements, per request: TTFT is the time from sending to the first SSE
// data chunk that carries generated text; inter-token latencies are the gaps
// between successive such chunks; e2e runs to the end of the body. A
// streamed response counts as ok only when it ends with "data: [DONE]".
// HTTP 503 counts as shed, never as an error.
//
// Invariants:
//   - Every run is bounded: dispatch stops at Config.Duration, after
//     Config.MaxRequests, at the end of the schedule, or when the context
//     ends, and every request is bounded by Config.Timeout.
//   - At most Config.Concurrency requests are in flight. A request due while
//     the cap is reached waits for a slot (its Result.Queued says how long);
//     its latencies are measured from when it is actually sent.
//   - Runner methods are safe for concurrent use; Config.OnResult is called
//     from one goroutine at a time.
package load
