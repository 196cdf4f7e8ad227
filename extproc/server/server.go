package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meridian-router/meridian/envoy/resources"
	"github.com/meridian-router/meridian/extproc/request"
	"github.com/meridian-router/meridian/extproc/xdsclient"
)

// Config configures the ext_proc service.
type Config struct {
	Request request.Options
	// AffinityBlocks picks the routing key: the chained hash after this many prefix blocks
	// (or after the last block of a shorter prompt).
	AffinityBlocks int
	// Fallbacks is how many engines follow the primary in the endpoint list, for retries.
	Fallbacks int
	Log       *slog.Logger
}

// DefaultConfig is what the sidecar runs with unless configured.
func DefaultConfig(log *slog.Logger) Config {
	return Config{Request: request.DefaultOptions(), AffinityBlocks: 16, Fallbacks: 2, Log: log}
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	if err := c.Request.Validate(); err != nil {
		return err
	}
	switch {
	case c.AffinityBlocks < 1 || c.AffinityBlocks > c.Request.MaxBlocks:
		return fmt.Errorf("affinity_blocks must be in [1, max_blocks=%d] (got %d)", c.Request.MaxBlocks, c.AffinityBlocks)
	case c.Fallbacks < 0:
		return fmt.Errorf("fallbacks must be >= 0 (got %d)", c.Fallbacks)
	case c.Log == nil:
		return errors.New("a logger is required")
	}
	return nil
}

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	cfg     Config
	routing atomic.Pointer[routing]
}

// New returns a server that routes nothing until the first Update.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg}, nil
}

// Update swaps in a new routing snapshot built from an xDS view.
func (s *Server) Update(v *xdsclient.View) {
	s.routing.Store(newRouting(v))
	s.cfg.Log.Info("routing updated", "version", v.Version, "models", len(v.Models))
}

// Ready reports whether the server has a routing snapshot.
func (s *Server) Ready() bool { return s.routing.Load() != nil }

// Process handles one HTTP request's ext_proc stream.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	var st streamState
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		resp := s.handle(&st, req)
		if resp == nil {
			continue
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// streamState is what one request's stream remembers between messages.
type streamState struct {
	kind request.Kind
	req  request.Request
}

func (s *Server) handle(st *streamState, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		st.kind = request.KindOf(headerValue(r.RequestHeaders.GetHeaders(), ":path"))
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{},
		}}
	case *extprocv3.ProcessingRequest_RequestBody:
		if st.kind == 0 {
			return continueBody()
		}
		return s.route(st, r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
	}
	return nil
}

func (s *Server) route(st *streamState, body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	err := request.Parse(st.kind, body.GetBody(), body.GetEndOfStream(), s.cfg.Request, &st.req)
	if request.IsTruncatedBeforeModel(err) {
		// The request may be fine; it is just not steerable. Envoy's default route and its
		// weighted fallback take it.
		return continueBody()
	}
	var ce *request.Error
	if errors.As(err, &ce) {
		return errorResponse(400, "invalid_request_error", ce.Reason)
	}
	rt := s.routing.Load()
	if rt == nil {
		return continueBody() // no snapshot yet: fail open to Envoy's own balancing
	}
	m, ok := rt.models[st.req.Model]
	if !ok {
		return errorResponse(404, "not_found_error", fmt.Sprintf("The model `%s` does not exist.", st.req.Model))
	}
	if len(m.endpoints) == 0 {
		return errorResponse(503, "service_unavailable", fmt.Sprintf("No engine is available for model `%s`.", st.req.Model))
	}
	key := s.key(&st.req)
	var buf [16]int
	order := m.chooser.Order(key, buf[:0])
	n := min(len(order), 1+s.cfg.Fallbacks)
	var dest strings.Builder
	for i, idx := range order[:n] {
		if i > 0 {
			dest.WriteByte(',')
		}
		dest.WriteString(m.endpoints[idx].Address)
	}
	d := dest.String()
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					setHeader(resources.HeaderDestination, d),
					setHeader(resources.HeaderCluster, m.cluster),
					setHeader(resources.HeaderPrefixHash, strconv.FormatUint(key, 16)),
				}},
				ClearRouteCache: true,
			},
		}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			resources.MetadataNamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				resources.HeaderDestination: structpb.NewStringValue(d),
			}}),
		}},
	}
}

// key is the routing key: the chained hash at the affinity depth.
func (s *Server) key(r *request.Request) uint64 {
	if len(r.Blocks) == 0 {
		return 0
	}
	return r.Blocks[min(len(r.Blocks), s.cfg.AffinityBlocks)-1]
}

func continueBody() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

func headerValue(h *corev3.HeaderMap, name string) string {
	for _, hv := range h.GetHeaders() {
		if hv.GetKey() == name {
			if len(hv.GetRawValue()) > 0 {
				return string(hv.GetRawValue())
			}
			return hv.GetValue()
		}
	}
	return ""
}

// errorResponse answers the client at once, in OpenAI's error shape.
func errorResponse(code int, typ, msg string) *extprocv3.ProcessingResponse {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				setHeader("content-type", "application/json"),
			}},
			Body:    body,
			Details: "meridian_" + typ,
		},
	}}
}
