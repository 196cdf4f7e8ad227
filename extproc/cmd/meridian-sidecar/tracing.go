package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// newTracer exports spans over OTLP/gRPC (plaintext: point it at a collector beside the
// sidecar) to endpoint, host:port, in batches. The returned shutdown flushes what is left.
func newTracer(ctx context.Context, endpoint, nodeID string) (trace.Tracer, func(), error) {
	if _, _, err := net.SplitHostPort(endpoint); err != nil {
		return nil, nil, fmt.Errorf("--otlp-endpoint %q: want host:port: %w", endpoint, err)
	}
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(endpoint), otlptracegrpc.WithInsecure())
	if err != nil {
		return nil, nil, fmt.Errorf("--otlp-endpoint %s: %w", endpoint, err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Second)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "meridian-sidecar"),
			attribute.String("meridian.node", nodeID))))
	shutdown := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = tp.Shutdown(sctx)
	}
	return tp.Tracer("github.com/meridian-router/meridian/extproc"), shutdown, nil
}
