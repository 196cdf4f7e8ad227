package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3filter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meridian-router/meridian/extproc/decide"
	"github.com/meridian-router/meridian/extproc/engineload"
	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/picker"
	"github.com/meridian-router/meridian/extproc/request"
	"github.com/meridian-router/meridian/xdsapi"
)

// Server implements envoy.service.ext_proc.v3.ExternalProcessor around a decide.Core: it
// reads requests off the ext_proc stream, asks the core, and encodes the decision into
// header mutations, dynamic metadata or an immediate response.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	cfg     Config
	clock   guard.Clock
	core    *decide.Core
	metrics *metrics
	// decisions keeps the last Config.Decisions decisions for /debug/decisions (explain.go).
	decisions *decisionLog
}

// New returns a server that routes nothing until the first Update.
func New(cfg Config) (*Server, error) {
	return NewWithClock(cfg, guard.SystemClock{})
}

// NewWithClock is New with an injected clock, for tests.
func NewWithClock(cfg Config, clock guard.Clock) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Routing reads the request's keys and its prefix marks (one per first rung of the key
	// ladder, at most MaxBlocks/KeyBlocks), never its per-block hashes: a long prompt then
	// costs no slice but the marks', whatever Config the caller built.
	cfg.Request.KeyOnly = true
	s := &Server{cfg: cfg, clock: clock, decisions: newDecisionLog(cfg.Decisions)}
	dc := cfg.Core()
	dc.OnEngineOutcome = func(engine string, ok bool) {
		class := "ok"
		if !ok {
			class = "error"
		}
		s.metrics.outcomes.Add(context.Background(), 1, s.metrics.opt("engine", engine, "class", class))
	}
	var err error
	if s.core, err = decide.New(dc, clock); err != nil {
		return nil, err
	}
	if s.metrics, err = newMetrics(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Core is the decision core the server translates for.
func (s *Server) Core() *decide.Core { return s.core }

// Metrics is the registry to serve on /metrics.
func (s *Server) Metrics() *prometheus.Registry { return s.metrics.Registry }

// Update swaps in a new routing snapshot built from an xDS view.
func (s *Server) Update(v *xdsapi.View) {
	if err := s.core.Update(v); err != nil {
		s.cfg.Log.Error("xDS view refused; keeping the current routing", "version", v.Version, "err", err)
		return
	}
	s.cfg.Log.Info("routing updated", "version", v.Version, "models", len(v.Models))
}

// Ready reports whether the server has a routing snapshot.
func (s *Server) Ready() bool { return s.core.Ready() }

// Run re-evaluates penalties, releases lost tickets and scrapes the engines' load gauges
// (EngineLoad) until ctx is done.
func (s *Server) Run(ctx context.Context) {
	go engineload.Run(ctx, engineload.Config{Interval: s.cfg.EngineLoad.Interval, Timeout: s.cfg.EngineLoad.Timeout,
		OnScrape: s.metrics.scraped, Log: s.cfg.Log}, s.core)
	pen := time.NewTicker(s.cfg.PenaltyInterval)
	defer pen.Stop()
	sweep := time.NewTicker(min(s.cfg.MaxRequestAge/4, time.Minute))
	defer sweep.Stop()
	quiet := time.NewTicker(outcomeSilence) // so the warning repeats at most every 30 s
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-quiet.C:
			s.checkOutcomes()
		case <-pen.C:
			s.refreshPenalties()
		case <-sweep.C:
			if n := s.core.Expire(s.cfg.MaxRequestAge); n > 0 {
				s.cfg.Log.Warn("released in-flight tickets whose outcome never arrived", "count", n)
			}
		}
	}
}

// outcomeSilence and outcomeSilentAfter: when this many requests were steered and no
// outcome came for this long, Envoy's gRPC access log to the sidecar is missing or broken.
const (
	outcomeSilence     = 30 * time.Second
	outcomeSilentAfter = 100
)

// checkOutcomes warns when outcomes stopped while requests are steered: without them
// in-flight counts of streamed requests never fall and penalties never change.
func (s *Server) checkOutcomes() {
	n, since := s.core.OutcomeSilence()
	if n >= outcomeSilentAfter && since >= outcomeSilence {
		s.cfg.Log.Warn("no outcome from Envoy's access log while requests are steered: is the bootstrap's envoy.access_loggers.http_grpc to the sidecar in place? In-flight counts only fall when max_request_age sweeps them",
			"steered", n, "silent_for", since.Round(time.Second))
	}
}

// refreshPenalties re-evaluates outliers; the core rebuilds routing when a factor changed.
func (s *Server) refreshPenalties() {
	penalized, err := s.core.RefreshPenalties()
	if err != nil {
		s.cfg.Log.Error("penalties not applied", "err", err)
		return
	}
	for _, e := range penalized {
		s.cfg.Log.Info("engine penalized", "engine", e.Engine, "factor", e.Factor, "reason", e.Reason.String())
	}
}

// Process handles one HTTP request's ext_proc stream.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	st := &streamState{stream: stream}
	defer func() {
		st.mu.Lock()
		st.closed = true
		if st.timer != nil {
			st.timer.Stop()
		}
		ticket, hold := st.ticket, st.hold
		st.mu.Unlock()
		// With a buffered body Envoy keeps the stream until the request ends, or cancels it
		// when it stops waiting for the sidecar and fails open without the ticket: either
		// way the request no longer counts against its engine here. A streamed body's
		// stream closes as soon as the last chunk is answered, long before the request
		// ends, so only the outcome (found by ticket or by request id) releases it.
		if !hold {
			s.core.EndStream(ticket)
		}
	}()
	ctx := stream.Context()
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
		st.mu.Lock()
		s.handle(ctx, st, req)
		err = st.flush()
		st.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// streamState is what one request's stream remembers between messages. mu guards it
// against the hold timer, which may answer for a slow body.
type streamState struct {
	mu     sync.Mutex
	stream extprocv3.ExternalProcessor_ProcessServer // nil in benchmarks
	out    []*extprocv3.ProcessingResponse           // answers to send, in order
	closed bool

	kind        request.Kind
	priority    int
	traceparent string
	requestID   string
	req         request.Request
	ticket      string // the in-flight ticket this stream's request holds, if any
	dest        string // the endpoint list the sidecar answered with, if it steered
	// subset is a GIE gateway's subset hint (gie.go); hasSubset is set when it sent one.
	subset    []string
	hasSubset bool
	// contentLength is the request's Content-Length, 0 when absent.
	contentLength int64
	counted       bodyCount // the body after the decision, against its limit

	// hold is set when Envoy streams the body without waiting for the headers answer
	// (STREAMED with send_body_without_waiting_for_header_response): the sidecar keeps
	// that answer until it has read enough of the body to route, so one exchange carries
	// both, and Envoy holds the request meanwhile.
	hold bool
	// decided is set once the headers are answered; later body chunks pass at once.
	decided   bool
	pending   int    // body chunks received and not yet answered
	nextParse int    // body size at which keyKnown parses again
	parsed    bool   // st.req holds the parse route needs (keyKnown's)
	body      []byte // the body so far, when it came in more than one chunk
	first     []byte // the first chunk, not copied until a second one arrives
	timer     *time.Timer
}

// flush sends the queued answers.
func (st *streamState) flush() error {
	for i, r := range st.out {
		st.out[i] = nil
		if st.stream == nil || st.closed {
			continue
		}
		if err := st.stream.Send(r); err != nil {
			st.out = st.out[:0]
			return err
		}
	}
	st.out = st.out[:0]
	return nil
}

// noBody tells Envoy to send no body for this request and nothing for its response: the
// whole processing mode is replaced, so every phase is stated.
var noBody = &extprocv3filter.ProcessingMode{
	RequestHeaderMode:   extprocv3filter.ProcessingMode_SEND,
	ResponseHeaderMode:  extprocv3filter.ProcessingMode_SKIP,
	RequestBodyMode:     extprocv3filter.ProcessingMode_NONE,
	ResponseBodyMode:    extprocv3filter.ProcessingMode_NONE,
	RequestTrailerMode:  extprocv3filter.ProcessingMode_SKIP,
	ResponseTrailerMode: extprocv3filter.ProcessingMode_SKIP,
}

// handle queues the answers to one message on st.out.
func (s *Server) handle(ctx context.Context, st *streamState, req *extprocv3.ProcessingRequest) {
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		s.readHeaders(st, r.RequestHeaders.GetHeaders())
		st.subset, st.hasSubset = readSubset(req.GetMetadataContext())
		pc := req.GetProtocolConfig()
		st.hold = pc.GetRequestBodyMode() == extprocv3filter.ProcessingMode_STREAMED && pc.GetSendBodyWithoutWaitingForHeaderResponse()
		if st.hold && st.kind != 0 && !r.RequestHeaders.GetEndOfStream() {
			return // answered with the body (see streamState.hold)
		}
		st.decided = true
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{},
		}}
		if !st.hold && st.kind != 0 && st.contentLength > s.cfg.BodyLimitBytes {
			// BUFFERED_PARTIAL can lose the end of a body over Envoy's buffer limit.
			st.kind = 0
			resp.ModeOverride = noBody
			s.metrics.decision(ctx, "", resultPassThrough)
		}
		st.out = append(st.out, resp)
	case *extprocv3.ProcessingRequest_RequestBody:
		if st.hold {
			s.holdBody(ctx, st, r.RequestBody)
			return
		}
		if st.kind == 0 {
			st.out = append(st.out, continueBody)
			return
		}
		// BUFFERED or BUFFERED_PARTIAL: this one message is all of the body Envoy sends.
		start := time.Now()
		d := s.route(ctx, st, r.RequestBody.GetBody(), r.RequestBody.GetEndOfStream())
		st.out = append(st.out, d.bodyResponse())
		s.metrics.latency.Record(ctx, time.Since(start).Seconds())
	case *extprocv3.ProcessingRequest_RequestTrailers:
		st.out = append(st.out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		s.served(ctx, st, req)
		st.out = append(st.out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseBody:
		st.out = append(st.out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.out = append(st.out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
}

// holdBody takes one chunk of a streamed body. Until the headers are answered it gathers
// the body, and routes once the body ends or enough of it is in to route on; every chunk
// is answered, in order, after the headers.
func (s *Server) holdBody(ctx context.Context, st *streamState, b *extprocv3.HttpBody) {
	if st.decided {
		if r := s.streamedOverLimit(ctx, st, len(b.GetBody())); r != nil {
			st.out = append(st.out, r)
			return
		}
		st.out = append(st.out, continueBody)
		return
	}
	st.pending++
	chunk := b.GetBody()
	switch {
	case st.pending == 1:
		st.first = chunk
	case st.body == nil:
		size := int64(2 * (len(st.first) + len(chunk)))
		if st.contentLength > 0 {
			size = max(size, min(st.contentLength, s.cfg.BodyLimitBytes)) // gathered once, not regrown
		}
		st.body = append(append(make([]byte, 0, size), st.first...), chunk...)
		st.first = nil
	default:
		st.body = append(st.body, chunk...)
	}
	gathered := st.gathered()
	// Half the buffer limit: Envoy stops reading the client when its queue of unanswered
	// chunks passes the limit, so waiting for more than that would wait forever.
	switch {
	case b.GetEndOfStream() || int64(len(gathered)) >= s.cfg.BodyLimitBytes/2:
		s.decide(ctx, st, gathered, b.GetEndOfStream())
		return
	case s.keyKnown(st, gathered):
		st.parsed = true // st.req already holds this body's parse
		s.decide(ctx, st, gathered, false)
		return
	}
	if st.timer == nil {
		// A slow upload must not hold the request past Envoy's message timeout, which
		// would let it through unsteered: route on what has come by then.
		st.timer = time.AfterFunc(s.cfg.HoldTimeout, func() {
			st.mu.Lock()
			defer st.mu.Unlock()
			if st.decided || st.closed {
				return
			}
			s.decide(ctx, st, st.gathered(), false)
			_ = st.flush() // a failed send ends the stream; Recv sees it
		})
	}
}

// earlyParseBytes is the body size from which a long streamed body is parsed before it
// ends, and again at every doubling (so the parsing stays linear in the body).
const earlyParseBytes = 16 << 10

// keyKnown reports whether the part of the body gathered so far already fixes the routing:
// the model is named and the prompt has filled the key ladder's last rung, so the rest of
// a long prompt cannot change the pick. The body's end then need not be waited for. (A
// shorter prompt's key is its deepest rung, known only once the prompt has ended.)
func (s *Server) keyKnown(st *streamState, gathered []byte) bool {
	// The canonical prompt is never longer than the body that carries it.
	last := s.cfg.Request.MaxBlocks * s.cfg.Request.BlockBytes
	if len(gathered) < max(st.nextParse, earlyParseBytes, last) {
		return false
	}
	st.nextParse = 2 * len(gathered)
	err := request.Parse(st.kind, gathered, false, s.cfg.Request, &st.req)
	// The key is the deepest rung of the ladder the prompt fills, so only a prompt that
	// has reached the last rung (the hashing stopped) has its key before the body's end.
	keyIn := st.req.PromptBytes >= last
	if keyIn && st.req.Model == "" {
		// The key's blocks are in and the model is not: it comes after the prompt, at the
		// body's end as the OpenAI SDKs send it (messages first), so parsing again before
		// the end would find no more than this. (A body with more after its prompt, say a
		// long tools list, is routed at its end too.)
		st.nextParse = math.MaxInt
	}
	return err == nil && st.req.Model != "" && keyIn
}

// bodyBytes is the request body's size for its weight in bounded loads: the
// Content-Length when the client sent one, else what arrived before the decision.
func bodyBytes(contentLength int64, seen int) int {
	if contentLength > int64(seen) {
		return int(min(contentLength, 1<<40))
	}
	return seen
}

func (st *streamState) gathered() []byte {
	if st.body != nil {
		return st.body
	}
	return st.first
}

// decide routes a held request on body (all of it when eos) and queues the headers answer,
// then one answer per chunk received so far.
func (s *Server) decide(ctx context.Context, st *streamState, body []byte, eos bool) {
	st.decided = true
	if st.timer != nil {
		st.timer.Stop()
	}
	if ctx.Err() != nil {
		return // Envoy gave up on this stream (a stalled sidecar catching up): nothing to route
	}
	start := time.Now()
	d := s.route(ctx, st, body, eos)
	s.metrics.latency.Record(ctx, time.Since(start).Seconds())
	st.first, st.body = nil, nil
	st.out = append(st.out, d.headersResponse())
	if d.immediate != nil {
		return
	}
	for ; st.pending > 0; st.pending-- {
		st.out = append(st.out, continueBody)
	}
}

// decision is the outcome of routing one request: an immediate answer, a steered one, or
// neither (pass the request through to Envoy's own balancing).
type decision struct {
	immediate *extprocv3.ProcessingResponse // answer the client now (an error or a shed)
	steered   *answer
}

// bodyResponse is d as the answer to a buffered body message.
func (d decision) bodyResponse() *extprocv3.ProcessingResponse {
	switch {
	case d.immediate != nil:
		return d.immediate
	case d.steered != nil:
		return d.steered.bodyResponse()
	}
	return continueBody
}

// headersResponse is d as the answer to held request headers.
func (d decision) headersResponse() *extprocv3.ProcessingResponse {
	switch {
	case d.immediate != nil:
		return d.immediate
	case d.steered != nil:
		return d.steered.headersResponse()
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
}

// readHeaders takes the path, the priority and the trace context from the request headers.
func (s *Server) readHeaders(st *streamState, h *corev3.HeaderMap) {
	st.priority = s.cfg.Priority.Default
	for _, hv := range h.GetHeaders() {
		k := hv.GetKey()
		switch {
		case k == ":path":
			st.kind = request.KindOf(value(hv))
		case k == "content-length":
			st.contentLength, _ = strconv.ParseInt(value(hv), 10, 64)
		case k == "traceparent":
			st.traceparent = value(hv)
		case k == "x-request-id":
			st.requestID = value(hv)
		case k == "authorization" && len(s.cfg.Priority.APIKeys) > 0:
			if tok, ok := strings.CutPrefix(value(hv), "Bearer "); ok {
				sum := sha256.Sum256([]byte(tok))
				if p, ok := s.cfg.Priority.APIKeys[hex.EncodeToString(sum[:])]; ok {
					st.priority = p
				}
			}
		case k == s.cfg.Priority.Header && s.cfg.Priority.Header != "":
			if p, err := strconv.Atoi(value(hv)); err == nil && p >= 0 && p < s.cfg.Shed.Priorities {
				st.priority = p
			}
		}
	}
}

func value(hv *corev3.HeaderValue) string {
	if len(hv.GetRawValue()) > 0 {
		return string(hv.GetRawValue())
	}
	return hv.GetValue()
}

func (s *Server) route(ctx context.Context, st *streamState, body []byte, eos bool) decision {
	var err error
	if !st.parsed {
		err = request.Parse(st.kind, body, eos, s.cfg.Request, &st.req)
	}
	if d, over := s.bodyOverLimit(ctx, st, body, eos); over {
		return d
	}
	if request.IsTruncatedBeforeModel(err) {
		// The request may be fine; it is just not steerable. Envoy's default route and its
		// weighted fallback take it.
		s.metrics.decision(ctx, "", resultPassThrough)
		return decision{}
	}
	var ce *request.Error
	if errors.As(err, &ce) {
		s.metrics.decision(ctx, "", resultBadRequest)
		return decision{immediate: errorResponse(400, "invalid_request_error", ce.Reason, 0)}
	}
	var buf [picker.MaxExamined]int
	d := s.core.Route(decide.Request{Model: st.req.Model, Key: st.req.Key, ParentKey: st.req.ParentKey, Marks: st.req.Marks, Priority: st.priority,
		PromptBytes: st.req.PromptBytes, BodyBytes: bodyBytes(st.contentLength, len(body)),
		RequestID: st.requestID, Subset: st.subset, HasSubset: st.hasSubset}, buf[:0])
	st.ticket = d.Ticket
	switch d.Verdict {
	case decide.NoSnapshot:
		s.metrics.decision(ctx, "", resultPassThrough)
		return decision{} // no snapshot yet: fail open to Envoy's own balancing
	case decide.UnknownModel:
		s.metrics.decision(ctx, "", resultUnknownModel) // no label for a name no cluster has
		return decision{immediate: errorResponse(404, "not_found_error", fmt.Sprintf("The model `%s` does not exist.", st.req.Model), 0)}
	case decide.NoEngine:
		s.explain(ctx, st, &d, 503)
		s.metrics.decision(ctx, d.Model, resultNoEngine)
		resp := errorResponse(503, "service_unavailable", fmt.Sprintf("No engine is available for model `%s`.", d.Model), d.RetryAfter)
		s.withDecision(resp, st, &d, 503)
		return decision{immediate: resp}
	case decide.ShedQuota, decide.ShedLimit:
		result := d.Verdict.String()
		s.metrics.decision(ctx, d.Model, result)
		s.metrics.shed(ctx, d.Model, strings.TrimPrefix(result, "shed_"), d.Priority)
		s.explain(ctx, st, &d, s.shedStatus(d.Priority))
		resp := errorResponse(s.shedStatus(d.Priority), "overloaded_error", "The service is overloaded; retry after the time in Retry-After.", d.RetryAfter)
		resp.GetImmediateResponse().Details = "meridian_" + result // Envoy's %RESPONSE_CODE_DETAILS% tells quota from limit
		s.withDecision(resp, st, &d, s.shedStatus(d.Priority))
		return decision{immediate: resp}
	}
	return s.steer(ctx, st, &d)
}

// steer encodes a Steer decision: the endpoint list as the endpoint-picker header and
// envoy.lb metadata, the model's cluster, the prefix key for the fallback's hash, the
// ticket, the retry grant and the trace context, all in one answer allocation.
func (s *Server) steer(ctx context.Context, st *streamState, d *decide.Decision) decision {
	a := newAnswer()
	start := len(a.raw)
	a.raw = d.AppendDestination(a.raw)
	a.setHeaderRaw(xdsapi.HeaderDestination, start)
	dest := string(a.vals[0].RawValue)
	st.dest = dest
	a.setString(xdsapi.HeaderCluster, d.Cluster)
	var num [20]byte
	a.setHeader(xdsapi.HeaderPrefixHash, strconv.AppendUint(num[:0], st.req.Key, 16))
	if d.Ticket != "" {
		a.setString(outcome.HeaderTicket, d.Ticket)
	}
	a.setHeader("x-envoy-max-retries", strconv.AppendUint(num[:0], uint64(d.Retries), 10))
	a.setString("x-envoy-retry-on", d.RetryOn)
	start = len(a.raw)
	a.raw = appendChildTraceparent(a.raw, st.traceparent)
	a.setHeaderRaw("traceparent", start)
	a.finish(dest, a.decision.fill(d, st.req.Key, dest, 0))
	s.explain(ctx, st, d, 0)
	s.metrics.decision(ctx, d.Model, resultSteered)
	s.metrics.picks.Add(ctx, 1, s.metrics.opt("engine", d.Engine))
	s.metrics.retries.Record(ctx, int64(d.Budget)) // the budget; unsent-only retries are not counted
	if d.Spilled {
		s.metrics.spills.Add(ctx, 1, s.metrics.opt("model", d.Model))
	}
	if d.Overflowed {
		s.metrics.overflows.Add(ctx, 1, s.metrics.opt("model", d.Model))
	}
	if d.QuotaHeld {
		s.metrics.held.Add(ctx, 1, s.metrics.opt("model", d.Model))
	}
	return decision{steered: a}
}

// shedStatus is the HTTP status of a load shed at priority p: 429 for a sheddable request
// (Config.SheddableBelow), as the endpoint-picker protocol answers a dropped one, else 503.
func (s *Server) shedStatus(p int) int {
	if p < s.cfg.SheddableBelow {
		return 429
	}
	return 503
}

// OnOutcome hands one entry of Envoy's access log stream to the core.
func (s *Server) OnOutcome(rec outcome.Record) { s.core.Outcome(rec) }

func (s *Server) penaltyFactors() map[string]float64 {
	out := map[string]float64{}
	for _, e := range s.core.Penalties().Engines() {
		out[e.Engine] = e.Factor
	}
	return out
}

func (s *Server) inFlight() map[string]int64 { return s.core.InFlight() }

func (s *Server) observedLoad() map[string]int64 { return s.core.ObservedLoad() }

func (s *Server) tablesBuilt() (view, penalties int64) { return s.core.TablesBuilt() }

func (s *Server) homesExpired() int64 { return s.core.HomesExpired() }

func (s *Server) peerCount() int64 { return int64(len(s.core.Peers())) }

func (s *Server) peerInFlight() map[string]int64 { return s.core.PeerInFlight() }

// continueBody passes a body chunk on unchanged. It is never modified, so every stream
// sends the same message (protobuf's marshaling only reads it, and caches sizes atomically).
var continueBody = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// errorResponse answers the client at once, in OpenAI's error shape.
func errorResponse(code int, typ, msg string, retryAfter time.Duration) *extprocv3.ProcessingResponse {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
	hdrs := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	if retryAfter > 0 {
		hdrs = append(hdrs, setHeader("retry-after", strconv.Itoa(int(retryAfter/time.Second))))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: hdrs},
			Body:    body,
			Details: "meridian_" + typ,
		},
	}}
}
