package server

import (
	"context"
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// RequestLimits bound request bodies: a request whose body is larger than its model's
// limit is answered 413 in OpenAI's error shape before any engine sees it.
type RequestLimits struct {
	// DefaultBytes applies to every model not in Models.
	DefaultBytes int64 `yaml:"default_bytes"`
	// Models overrides the limit per model name.
	Models map[string]int64 `yaml:"models"`
}

// DefaultMaxRequestBytes is 16 MiB: far beyond any context window's worth of text, and
// what the mock engine (like a stock vLLM server behind uvicorn's defaults) reads at most.
const DefaultMaxRequestBytes = 16 << 20

// Validate reports every limit that is not positive.
func (l RequestLimits) Validate() error {
	if l.DefaultBytes <= 0 {
		return fmt.Errorf("max_request_bytes.default_bytes must be > 0 (got %d)", l.DefaultBytes)
	}
	for m, v := range l.Models {
		if v <= 0 {
			return fmt.Errorf("max_request_bytes.models[%s] must be > 0 (got %d)", m, v)
		}
	}
	return nil
}

// limit is model's limit; for "" (a body cut before its model) the largest of all, so
// nothing is refused that some model would accept.
func (l RequestLimits) limit(model string) int64 {
	if model == "" {
		most := l.DefaultBytes
		for _, v := range l.Models {
			most = max(most, v)
		}
		return most
	}
	if v, ok := l.Models[model]; ok {
		return v
	}
	return l.DefaultBytes
}

// bodyCount follows a streamed body after the routing decision, so a body without a
// Content-Length that grows past its limit is still cut off.
type bodyCount struct {
	limit, seen int64 // limit 0: not counting
	model       string
}

// resultTooLarge counts requests refused for their body's size (metrics' decision results).
const resultTooLarge = "too_large"

// bodyOverLimit answers 413 when the request's size (its Content-Length, or all of the
// body when eos) is over the limit of its model (st.req.Model, once parsed). Otherwise it
// starts counting the rest of a streamed body against that limit (streamedOverLimit).
func (s *Server) bodyOverLimit(ctx context.Context, st *streamState, body []byte, eos bool) (decision, bool) {
	size := st.contentLength
	if eos {
		size = max(size, int64(len(body)))
	}
	limit := s.cfg.MaxRequest.limit(st.req.Model)
	if size > limit {
		s.metrics.decision(ctx, st.req.Model, resultTooLarge)
		return decision{immediate: tooLarge(st.req.Model, size, limit)}, true
	}
	st.counted = bodyCount{limit: limit, seen: int64(len(body)), model: st.req.Model}
	if eos {
		st.counted.limit = 0
	}
	return decision{}, false
}

// streamedOverLimit counts a body chunk that came after the routing decision and returns
// the 413 once the body passes its limit (nil before). Envoy then resets the request to
// the engine, which has seen only part of the body: only a body without a Content-Length
// gets this far.
func (s *Server) streamedOverLimit(ctx context.Context, st *streamState, chunk int) *extprocv3.ProcessingResponse {
	c := &st.counted
	if c.limit == 0 {
		return nil
	}
	c.seen += int64(chunk)
	if c.seen <= c.limit {
		return nil
	}
	limit := c.limit
	c.limit = 0
	s.metrics.decision(ctx, c.model, resultTooLarge)
	return tooLarge(c.model, c.seen, limit)
}

// tooLarge is the 413 for a body of size bytes (at least) over limit.
func tooLarge(model string, size, limit int64) *extprocv3.ProcessingResponse {
	msg := fmt.Sprintf("The request body is %d bytes; the limit is %d bytes.", size, limit)
	if model != "" {
		msg = fmt.Sprintf("The request body is %d bytes; model `%s` accepts at most %d bytes.", size, model, limit)
	}
	return errorResponse(413, "invalid_request_error", msg, 0)
}
