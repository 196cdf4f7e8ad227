package server

import (
	"context"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The Gateway API Inference Extension's endpoint-picker protocol, v1 (its
// docs/proposals/004-endpoint-picker-protocol, read at gateway-api-inference-extension
// v1.6.0; the constants are its pkg/epp/metadata's), beyond the destination header and
// envoy.lb metadata every steered answer carries:
//
//   - Subset hint (gateway → picker): the request's metadata_context may list, under
//     envoy.lb.subset_hint / x-gateway-destination-endpoint-subset, the endpoints the picker
//     must choose from; when none of them can be chosen the answer is 503.
//   - Served report (gateway → picker): on the response headers, envoy.lb /
//     x-gateway-destination-endpoint-served names the endpoint that served the request
//     (a retry may have moved it down the list). The sidecar counts where requests were
//     served (meridian_sidecar_served_total); its outcomes still come from the access log.
//   - Health: the gRPC health service answers "liveness" (always SERVING), "readiness" and
//     envoy.service.ext_proc.v3.ExternalProcessor (SERVING once the sidecar has a routing
//     snapshot), and "" like readiness.
//   - Status codes: 503 when no endpoint can take the request, 429 when a sheddable request
//     is dropped under load (Config.SheddableBelow).
const (
	subsetNamespace = "envoy.lb.subset_hint"
	subsetKey       = "x-gateway-destination-endpoint-subset"
	lbNamespace     = "envoy.lb"
	servedKey       = "x-gateway-destination-endpoint-served"
)

// readSubset takes the subset hint from a request's metadata_context. present is true
// when the gateway sent the key, even with an empty list (which then allows nothing).
func readSubset(md *corev3.Metadata) (subset []string, present bool) {
	v, ok := md.GetFilterMetadata()[subsetNamespace].GetFields()[subsetKey]
	if !ok {
		return nil, false
	}
	list := v.GetListValue().GetValues()
	subset = make([]string, 0, len(list))
	for _, e := range list {
		if s := e.GetStringValue(); s != "" {
			subset = append(subset, s)
		}
	}
	return subset, true
}

// readServed takes the served endpoint from a response's metadata_context.
func readServed(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[lbNamespace].GetFields()[servedKey].GetStringValue()
}

// served records where a steered request was served: by its primary, by another endpoint
// of its list (a retry), or by one the sidecar did not list (the gateway's own choice).
func (s *Server) served(ctx context.Context, st *streamState, req *extprocv3.ProcessingRequest) {
	addr := readServed(req.GetMetadataContext())
	if addr == "" || st.dest == "" {
		return
	}
	result := "unlisted"
	for i, rest := 0, st.dest; rest != ""; i++ {
		var cur string
		cur, rest, _ = strings.Cut(rest, ",")
		if cur == addr {
			result = "fallback"
			if i == 0 {
				result = "primary"
			}
			break
		}
	}
	s.metrics.servedBy.Add(ctx, 1, s.metrics.opt("result", result))
}

// Health service names of the endpoint-picker protocol.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	HealthExtProc   = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// ServeHealth keeps h's statuses current until ctx ends: liveness SERVING; readiness, the
// ext_proc service and "" SERVING once the sidecar has a routing snapshot, NOT_SERVING
// before. It polls every interval, and blocks.
func (s *Server) ServeHealth(ctx context.Context, h *health.Server, interval time.Duration) {
	h.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if s.Ready() {
			st = healthpb.HealthCheckResponse_SERVING
		}
		for _, svc := range []string{"", HealthReadiness, HealthExtProc} {
			h.SetServingStatus(svc, st)
		}
		select {
		case <-ctx.Done():
			h.Shutdown()
			return
		case <-t.C:
		}
	}
}
