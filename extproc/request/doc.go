// Package request reads what the sidecar needs from an OpenAI-style request body: the model,
// whether the answer streams, and a chain of prefix-block hashes of the canonical prompt.
//
// The body may be a prefix of the real one (Envoy's BUFFERED_PARTIAL mode sends only the first
// bytes of a large body). Parse reads as far as the bytes go: a body cut short is not an error
// as long as the model was seen, and the hashes cover the prompt bytes that arrived.
//
// Canonical prompt: for completions, the prompt text; for chat, every message as
// role NUL content RS, in order. So turn n+1 of a conversation extends turn n's canonical
// text, and its block hashes extend turn n's chain: h_i = xxhash64(h_{i-1} || block_i).
// For the Responses API, the instructions as a system message and then each input item as a
// message (responses.go), so it shares the equivalent chat request's chain; for embeddings,
// the (first) input, as a completions prompt; for the other model-naming JSON APIs of a vLLM
// server (ModelOnly: tokenize, pooling, score, rerank, ...), the body's own bytes.
package request
