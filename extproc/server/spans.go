package server

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/meridian-router/meridian/extproc/decide"
)

// Span attributes of a decision ("meridian.decision" spans, child of the request's
// traceparent when it has a valid one).
const (
	attrModel      = "meridian.model"
	attrResult     = "meridian.result"
	attrPrefixKey  = "meridian.prefix_key"
	attrPriority   = "meridian.priority"
	attrEngine     = "meridian.engine"
	attrEngines    = "meridian.engines"
	attrPassedOver = "meridian.passed_over_for_load"
	attrOverflowed = "meridian.overflowed"
	attrRetries    = "meridian.retries"
	attrRetryOn    = "meridian.retry_on"
	attrBudget     = "meridian.retry_budget"
	attrStatus     = "meridian.status"
	attrRequestID  = "meridian.request_id"
)

var traceContext = propagation.TraceContext{}

// span exports d as one span. It runs only when Config.Tracer is set.
func (s *Server) span(ctx context.Context, st *streamState, d *decide.Decision, status int) {
	if st.traceparent != "" {
		ctx = traceContext.Extract(ctx, propagation.MapCarrier{"traceparent": st.traceparent})
	}
	_, sp := s.cfg.Tracer.Start(ctx, "meridian.decision", trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		attribute.String(attrModel, d.Model),
		attribute.String(attrResult, d.Verdict.String()),
		attribute.String(attrPrefixKey, strconv.FormatUint(st.req.Key, 16)),
		attribute.Int(attrPriority, d.Priority),
		attribute.String(attrEngine, d.Engine),
		attribute.String(attrEngines, st.dest),
		attribute.Bool(attrPassedOver, d.Spilled),
		attribute.Bool(attrOverflowed, d.Overflowed),
		attribute.Int(attrRetries, int(d.Retries)),
		attribute.String(attrRetryOn, d.RetryOn),
		attribute.Int(attrBudget, int(d.Budget)),
		attribute.Int(attrStatus, status),
		attribute.String(attrRequestID, st.requestID),
	))
	if d.Verdict.Shed() || d.Verdict == decide.NoEngine {
		sp.SetStatus(codes.Error, d.Verdict.String())
	}
	sp.End()
}
