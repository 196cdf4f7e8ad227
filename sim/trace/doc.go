// Package trace reads LLM request traces and prepares them for replay.
//
// Two on-disk formats are understood:
//
//   - Mooncake JSONL (kvcache-ai/Mooncake, FAST'25 traces): one JSON object a
//     line with "timestamp" (milliseconds from trace start), "input_length",
//     "output_length" and optionally "hash_ids" (one id per 512-token prompt
//     block, prefix-chained: two requests sharing their first k ids share
//     their first k*512 prompt tokens). Unknown fields are ignored so newer
//     variants of the format still load.
//   - Azure LLM inference CSV (Azure/AzurePublicDataset, Splitwise ISCA'24): a
//     header naming TIMESTAMP, ContextTokens and GeneratedTokens (any column
//     order, extra columns ignored) and wall-clock timestamps such as
//     "2023-11-16 18:15:46.6805900". Arrivals are relative to the first row.
//
// The format is detected from the content (a first non-blank byte of '{'
// means Mooncake, a header naming TIMESTAMP means Azure); FormatMooncake or
// FormatAzure overrides detection.
//
// Invariants:
//   - A Reader yields requests in file order; it never sorts, so an Azure row
//     earlier than the first row has a negative Arrival. Errors name the
//     source, the line and the field ("trace.jsonl:12: input_length: ...").
//   - Token counts are integers in [0, 2^31-1]; Mooncake timestamps are
//     non-negative (fractional milliseconds are kept to the nanosecond). The
//     number of hash ids is not checked against input_length.
//   - Read and ReadFile return at least one request (an empty trace is an
//     error), sorted by Arrival with a stable sort (rows with equal or
//     out-of-order timestamps keep their file order among equals), and rebased
//     so the earliest Arrival is zero.
//   - Transformations (First, Window, Sample, WithSpeed, WithRate) never modify
//     their input slice; they return a new one. HashIDs slices are shared
//     between input and output and must be treated as read-only.
//   - Requests from a format without prefix information have nil HashIDs.
package trace
