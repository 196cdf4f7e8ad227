package main

import (
	"context"
	"net"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// collector is an OTLP/gRPC trace receiver that hands what it gets to a channel.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	got chan *coltracepb.ExportTraceServiceRequest
}

func (c *collector) Export(_ context.Context, r *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.got <- r
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func TestTracerExportsOverOTLP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{got: make(chan *coltracepb.ExportTraceServiceRequest, 4)}
	g := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(g, c)
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()

	tracer, shutdown, err := newTracer(context.Background(), ln.Addr().String(), "region-a")
	if err != nil {
		t.Fatal(err)
	}
	_, sp := tracer.Start(context.Background(), "meridian.decision")
	sp.End()
	shutdown() // flushes the batch
	select {
	case r := <-c.got:
		rs := r.GetResourceSpans()
		if len(rs) != 1 || len(rs[0].GetScopeSpans()) != 1 || rs[0].GetScopeSpans()[0].GetSpans()[0].GetName() != "meridian.decision" {
			t.Fatalf("exported %v", r)
		}
		found := false
		for _, kv := range rs[0].GetResource().GetAttributes() {
			found = found || kv.GetKey() == "service.name" && kv.GetValue().GetStringValue() == "meridian-sidecar"
		}
		if !found {
			t.Fatalf("resource %v has no service.name meridian-sidecar", rs[0].GetResource())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no span reached the collector")
	}
	if _, _, err := newTracer(context.Background(), "no-port", "n"); err == nil {
		t.Fatal("an endpoint without a port was accepted")
	}
}
