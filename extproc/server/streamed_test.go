package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3filter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/xdsapi"
)

// streamedConfig is what Envoy announces on the first message when the bootstrap streams
// the body without waiting for the headers answer.
var streamedConfig = &extprocv3.ProtocolConfiguration{
	RequestBodyMode:                         extprocv3filter.ProcessingMode_STREAMED,
	SendBodyWithoutWaitingForHeaderResponse: true,
}

// streamed plays Envoy in the streamed mode: the headers, then each chunk at once, without
// waiting for answers (the last chunk ends the body when eos). gap spaces the chunks.
type streamed struct {
	t      *testing.T
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

func (h *harness) streamed(t *testing.T, path string, hdrs map[string]string) *streamed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	st, err := h.proc.Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte(path)}, {Key: ":method", RawValue: []byte("POST")}}}
	for k, v := range hdrs {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	if err := st.Send(&extprocv3.ProcessingRequest{ProtocolConfig: streamedConfig,
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}); err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &streamed{t: t, stream: st, cancel: cancel}
	t.Cleanup(cancel)
	return s
}

func (s *streamed) chunk(b string, eos bool) {
	s.t.Helper()
	if err := s.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *streamed) recv() *extprocv3.ProcessingResponse {
	s.t.Helper()
	r, err := s.stream.Recv()
	if err != nil {
		s.t.Fatalf("no answer: %v", err)
	}
	return r
}

// expectBodies reads n answers that must each pass one body chunk on unchanged.
func (s *streamed) expectBodies(n int) {
	s.t.Helper()
	for i := range n {
		r := s.recv()
		if r.GetRequestBody() == nil || r.GetRequestBody().GetResponse().GetBodyMutation() != nil {
			s.t.Fatalf("answer %d of %d for the body chunks: %v, want an unchanged chunk", i+1, n, r)
		}
	}
}

// modelFirst is a chat body with the model before the messages, so a part of it names the
// model. (chatBody's encoding/json puts "messages" first, as OpenAI's Python SDK does: such
// a body can only be routed once it ends.)
func modelFirst(model, content string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, content)
}

func headersHeader(r *extprocv3.ProcessingResponse, name string) string {
	for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == name {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

// With the body streamed, the routing decision is the answer to the headers, sent once the
// body is in, followed by one answer per chunk; it is the one the buffered exchange gives.
func TestStreamedBodyIsRoutedInTheHeadersAnswer(t *testing.T) {
	h := newHarness(t)
	for i := range 20 {
		body := chatBody("llama", fmt.Sprintf("streamed prompt %d %s", i, strings.Repeat("x", 300)))
		br := h.exchange(t, "/v1/chat/completions", body)
		want := header(br, xdsapi.HeaderDestination)
		// The buffered request ends first, so both are routed on the same loads.
		wfirst, _, _ := strings.Cut(want, ",")
		h.srv.OnOutcome(outcome.Record{Ticket: header(br, outcome.HeaderTicket), Upstream: wfirst, Status: 200, Attempts: 1})

		s := h.streamed(t, "/v1/chat/completions", nil)
		third := len(body) / 3
		s.chunk(body[:third], false)
		s.chunk(body[third:2*third], false)
		s.chunk(body[2*third:], true)
		r := s.recv()
		if r.GetRequestHeaders() == nil {
			t.Fatalf("first answer %v: want the headers answer", r)
		}
		dest := headersHeader(r, xdsapi.HeaderDestination)
		if dest != want || dest == "" {
			t.Fatalf("streamed in three chunks: destination %q, buffered: %q", dest, want)
		}
		first, _, _ := strings.Cut(dest, ",")
		h.srv.OnOutcome(outcome.Record{Ticket: headersHeader(r, outcome.HeaderTicket), Upstream: first, Status: 200, Attempts: 1})
		if !r.GetRequestHeaders().GetResponse().GetClearRouteCache() || headersHeader(r, xdsapi.HeaderCluster) == "" {
			t.Fatal("the headers answer must set the cluster and clear the route cache")
		}
		md := r.GetDynamicMetadata().GetFields()[xdsapi.MetadataNamespaceLB].GetStructValue().GetFields()[xdsapi.HeaderDestination]
		if md.GetStringValue() != dest {
			t.Fatalf("envoy.lb metadata %q != header %q", md.GetStringValue(), dest)
		}
		s.expectBodies(3)
	}
}

// A body larger than half the buffer limit is answered once half the limit is in, even when
// its model comes last (as OpenAI's Python SDK sends it) and so cannot be read: Envoy stops
// reading a client whose unanswered chunks pass the limit, so waiting for the end would
// hang the request. Such a request passes unsteered; later chunks are answered one by one.
func TestStreamedLargeBodyAnsweredAtHalfTheLimit(t *testing.T) {
	h := newHarnessWith(t, func(c *server.Config) {
		c.BodyLimitBytes = 64 << 10
		c.HoldTimeout = time.Minute // only the size may end the hold here
	})
	s := h.streamed(t, "/v1/chat/completions", nil)
	body := chatBody("llama", strings.Repeat("a long document ", 8<<10)) // 128 KiB, model last
	s.chunk(body[:20<<10], false)
	got := make(chan *extprocv3.ProcessingResponse, 1)
	go func() {
		r, err := s.stream.Recv()
		if err == nil {
			got <- r
		}
	}()
	select {
	case r := <-got:
		t.Fatalf("answered after 20 KiB, under half the 64 KiB limit, with the model unread: %v", r)
	case <-time.After(200 * time.Millisecond):
	}
	s.chunk(body[20<<10:40<<10], false) // 40 KiB: past half the limit
	select {
	case r := <-got:
		if r.GetRequestHeaders() == nil || headersHeader(r, xdsapi.HeaderDestination) != "" {
			t.Fatalf("answer %v: want the headers passed on unsteered (the model is not in the first half)", r)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no answer after half the buffer limit: Envoy would stop reading the client and hang")
	}
	s.expectBodies(2)
	s.chunk(body[40<<10:100<<10], false)
	s.expectBodies(1)
	s.chunk(body[100<<10:], true)
	s.expectBodies(1)
}

// A body that stops coming is routed on what came when the hold timeout passes, before
// Envoy's message timeout would let the request through unsteered.
func TestStreamedSlowBodyRoutedAtHoldTimeout(t *testing.T) {
	h := newHarnessWith(t, func(c *server.Config) { c.HoldTimeout = 50 * time.Millisecond })
	s := h.streamed(t, "/v1/chat/completions", nil)
	body := modelFirst("llama", strings.Repeat("slow upload ", 200))
	start := time.Now()
	s.chunk(body[:len(body)-10], false)
	r := s.recv()
	waited := time.Since(start)
	if headersHeader(r, xdsapi.HeaderDestination) == "" {
		t.Fatalf("answer %v: want a steering headers answer from the partial body", r)
	}
	if waited < 40*time.Millisecond || waited > 2*time.Second {
		t.Fatalf("answered after %v, want about the 50ms hold timeout", waited)
	}
	s.expectBodies(1)
	s.chunk(body[len(body)-10:], true)
	s.expectBodies(1)
}

// Requests the sidecar does not steer get their headers answered at once: a path that is
// not a generation API, and a request without a body.
func TestStreamedUnsteeredAnsweredAtOnce(t *testing.T) {
	h := newHarness(t)
	s := h.streamed(t, "/v1/models", nil)
	if r := s.recv(); r.GetRequestHeaders() == nil || headersHeader(r, xdsapi.HeaderDestination) != "" {
		t.Fatalf("/v1/models: %v, want an empty headers answer at once", r)
	}
	s.chunk("{}", true)
	s.expectBodies(1)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := h.proc.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{ProtocolConfig: streamedConfig, Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true, Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || r.GetRequestHeaders() == nil {
		t.Fatalf("request without a body: %v %v, want the headers answered", r, err)
	}
}

// A refusal is the whole answer: Envoy replies to the client and forgets the chunks.
func TestStreamedRefusalIsImmediate(t *testing.T) {
	h := newHarness(t)
	s := h.streamed(t, "/v1/chat/completions", nil)
	s.chunk(`{"model":"mistral","messages":[{"role":"user","content":"hi"}]}`, true)
	r := s.recv()
	if ir := r.GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 404 {
		t.Fatalf("unknown model: %v, want an immediate 404", r)
	}
}

// The streamed mode's stream closes right after the last chunk's answer, long before the
// request ends: the request stays in flight until its outcome, which finds it by ticket or,
// when Envoy did not apply the sidecar's headers, by x-request-id.
func TestStreamedInFlightUntilOutcome(t *testing.T) {
	h := newHarness(t)
	inFlight := func() float64 { return gauge(t, h.srv, "meridian_sidecar_engine_in_flight") }
	steer := func(reqID string) (ticket, primary string) {
		s := h.streamed(t, "/v1/chat/completions", map[string]string{"x-request-id": reqID})
		s.chunk(chatBody("llama", "in flight "+reqID), true)
		r := s.recv()
		s.expectBodies(1)
		_ = s.stream.CloseSend()
		s.cancel() // Envoy closes the stream once the last chunk is answered
		primary, _, _ = strings.Cut(headersHeader(r, xdsapi.HeaderDestination), ",")
		return headersHeader(r, outcome.HeaderTicket), primary
	}
	t1, p1 := steer("req-1")
	_, p2 := steer("req-2")
	time.Sleep(100 * time.Millisecond) // let the stream ends reach the server
	if got := inFlight(); got != 2 {
		t.Fatalf("in flight after the streams closed: %v, want 2 until the outcomes", got)
	}
	h.srv.OnOutcome(outcome.Record{Ticket: t1, RequestID: "req-1", Upstream: p1, Status: 200, Attempts: 1})
	if got := inFlight(); got != 1 {
		t.Fatalf("in flight after the first outcome: %v, want 1", got)
	}
	// Envoy gave up on the sidecar just as it answered: the log has no ticket.
	h.srv.OnOutcome(outcome.Record{RequestID: "req-2", Upstream: p2, Status: 200, Attempts: 1})
	if got := inFlight(); got != 0 {
		t.Fatalf("in flight after the outcome without a ticket: %v, want 0", got)
	}
}

// A long prompt whose model comes first is routed once it has filled the key ladder's last
// rung, without waiting for the rest of the body, and to the engine the whole body would
// get. (The hold timer is too long to be what answers.)
func TestStreamedLongPromptRoutedOnceTheKeyIsIn(t *testing.T) {
	h := newHarnessWith(t, func(c *server.Config) {
		c.Request.MaxBlocks = 64 // the last rung at 16 KiB
		c.HoldTimeout = time.Minute
	})
	body := modelFirst("llama", strings.Repeat("a long shared document. ", 8<<10)) // ~200 KiB
	first := h.exchange(t, "/v1/chat/completions", body)
	want, wantKey := header(first, xdsapi.HeaderDestination), header(first, xdsapi.HeaderPrefixHash)
	// It ends before the streamed one starts, so both are decided on the same (empty) loads.
	primary, _, _ := strings.Cut(want, ",")
	h.srv.OnOutcome(outcome.Record{Ticket: header(first, outcome.HeaderTicket), Upstream: primary, Status: 200, Attempts: 1})
	s := h.streamed(t, "/v1/chat/completions", nil)
	const chunk = 8 << 10
	for i := range 4 { // 32 KiB (parsed at 16 KiB and at each doubling): the 64 blocks of 256 prompt bytes are in
		s.chunk(body[i*chunk:(i+1)*chunk], false)
	}
	r := s.recv()
	if got, key := headersHeader(r, xdsapi.HeaderDestination), headersHeader(r, xdsapi.HeaderPrefixHash); got != want || got == "" || key != wantKey {
		t.Fatalf("after 32 KiB of a long prompt: destination %q key %s, the whole body gets %q key %s", got, key, want, wantKey)
	}
	s.expectBodies(4)
	s.chunk(body[4*chunk:], true)
	s.expectBodies(1)
}

// On the shipped ladder (its last rung at 1 MiB) the same prompt's key is its deepest rung,
// which only its end shows: the streamed body is routed then, on the key the whole body
// has, not on what its first 16 KiB would make of it.
func TestStreamedLongPromptKeyedOnItsDeepestRung(t *testing.T) {
	h := newHarnessWith(t, func(c *server.Config) { c.HoldTimeout = time.Minute })
	body := modelFirst("llama", strings.Repeat("a long shared document. ", 8<<10))
	whole := h.exchange(t, "/v1/chat/completions", body)
	wantKey := header(whole, xdsapi.HeaderPrefixHash)
	part := h.exchange(t, "/v1/chat/completions", body[:16<<10]+`"}]}`)
	if k := header(part, xdsapi.HeaderPrefixHash); k == wantKey || wantKey == "" {
		t.Fatalf("the first 16 KiB and the whole prompt share the key %s: the ladder is not in use", k)
	}
	s := h.streamed(t, "/v1/chat/completions", nil)
	const chunk = 16 << 10
	n := 0
	for off := 0; off < len(body); off += chunk {
		s.chunk(body[off:min(off+chunk, len(body))], off+chunk >= len(body))
		n++
	}
	if key := headersHeader(s.recv(), xdsapi.HeaderPrefixHash); key != wantKey {
		t.Fatalf("streamed long prompt keyed %s, the whole body's key is %s", key, wantKey)
	}
	s.expectBodies(n)
}

// A long prompt whose model comes last (as the OpenAI SDKs send it) cannot be routed before
// its end; it is routed then, to the engine the buffered exchange picks.
func TestStreamedLongPromptModelLastRoutedAtItsEnd(t *testing.T) {
	h := newHarness(t)
	body := chatBody("llama", strings.Repeat("a long shared document. ", 8<<10)) // ~200 KiB, model last
	want := header(h.exchange(t, "/v1/chat/completions", body), xdsapi.HeaderDestination)
	s := h.streamed(t, "/v1/chat/completions", map[string]string{"content-length": fmt.Sprint(len(body))})
	const chunk = 16 << 10
	n := 0
	for off := 0; off < len(body); off += chunk {
		s.chunk(body[off:min(off+chunk, len(body))], off+chunk >= len(body))
		n++
	}
	r := s.recv()
	if got := headersHeader(r, xdsapi.HeaderDestination); got != want || got == "" {
		t.Fatalf("model-last long prompt: destination %q, the buffered exchange gets %q", got, want)
	}
	s.expectBodies(n)
}
