package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meridian-router/meridian/extproc/request"
	"github.com/meridian-router/meridian/sim/engine"
)

type server struct {
	cfg      config
	log      *slog.Logger
	backend  backend
	faults   *faultState
	parseOpt request.Options
	ids      atomic.Uint64
}

func newServer(cfg config, log *slog.Logger) (*server, error) {
	s := &server{cfg: cfg, log: log}
	if cfg.fixed {
		s.backend = newFixedBackend(cfg.ttft, cfg.itl)
	} else {
		b, err := newModelBackend(cfg.engine)
		if err != nil {
			return nil, err
		}
		s.backend = b
	}
	// The prompt is hashed exactly as the sidecar hashes it, one block per BlockTokens
	// tokens, so the engine caches the prefixes the router keys on.
	blockBytes := cfg.engine.BlockTokens * charsPerToken
	s.parseOpt = request.Options{BlockBytes: blockBytes, MaxBlocks: int(cfg.maxBody)/blockBytes + 1, MaxDepth: 64}
	if err := s.parseOpt.Validate(); err != nil {
		return nil, fmt.Errorf("prompt hashing for --block-tokens %d: %w", cfg.engine.BlockTokens, err)
	}
	s.faults = newFaultState(cfg.faults, func(f Faults) { s.backend.setSlowdown(f.LatencyMultiplier) })
	return s, nil
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, request.Completions) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, request.ChatCompletions) })
	mux.HandleFunc("POST /v1/embeddings", s.embeddings)
	mux.HandleFunc("POST /v1/responses", s.responses)
	mux.HandleFunc("GET /v1/models", s.listModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	kv := s.cfg.engine
	if s.cfg.fixed {
		kv = engine.Config{} // no KV cache to state
	}
	mux.Handle("GET /metrics", newMetricsHandler(s.cfg.name, s.cfg.models, kv, s.backend.stats))
	mux.HandleFunc("GET /admin/faults", s.faults.handleGet)
	mux.HandleFunc("POST /admin/faults", s.faults.handlePost)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-served-by", s.cfg.name)
		mux.ServeHTTP(w, r)
	})
}

// options are the body fields the mock needs beyond what request.Parse reads.
type options struct {
	MaxTokens           *int `json:"max_tokens"`
	MaxCompletionTokens *int `json:"max_completion_tokens"`
	MaxOutputTokens     *int `json:"max_output_tokens"` // the Responses API's
	N                   *int `json:"n"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Tools      []toolDef       `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
	Messages   []struct {
		Role string `json:"role"`
	} `json:"messages"`
}

// genRequest is one parsed generation request.
type genRequest struct {
	kind         request.Kind
	model        string
	stream       bool
	includeUsage bool
	n            int // choices
	prompt       int
	output       int
	blocks       []uint64
	call         *toolCall // the tool the answer calls instead of writing text, if any
}

func (s *server) generate(w http.ResponseWriter, r *http.Request, kind request.Kind) {
	if s.faults.inject(w, r) {
		return
	}
	g, status, err := s.readRequest(w, r, kind)
	if err != nil {
		writeError(w, status, errorType(status), err.Error())
		return
	}
	st, cancel, err := s.backend.submit(g.prompt, g.output, g.blocks)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	defer cancel()
	prefix := "cmpl-"
	if kind == request.ChatCompletions {
		prefix = "chatcmpl-"
	}
	id := fmt.Sprintf("%s%s-%d", prefix, s.cfg.name, s.ids.Add(1))
	if g.stream {
		s.streamResponse(w, r, g, st, id)
		return
	}
	s.fullResponse(w, r, g, st, id)
}

// readBody reads a request body within the mock's limit: over it, 413.
func (s *server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.maxBody))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body is larger than %d bytes", tooBig.Limit)
	}
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("read body: %w", err)
	}
	return body, 0, nil
}

// parse reads the routing fields of body and checks the model; it returns the status of a failure.
func (s *server) parse(kind request.Kind, body []byte, pr *request.Request) (int, error) {
	if err := request.Parse(kind, body, true, s.parseOpt, pr); err != nil {
		return http.StatusBadRequest, err
	}
	if !slices.Contains(s.cfg.models, pr.Model) {
		return http.StatusNotFound, modelNotFound(pr.Model)
	}
	return 0, nil
}

// readParsed reads the body within the limit and parses its routing fields, checking the
// model; it returns the status of a failure.
func (s *server) readParsed(w http.ResponseWriter, r *http.Request, kind request.Kind, pr *request.Request) ([]byte, int, error) {
	body, status, err := s.readBody(w, r)
	if err != nil {
		return nil, status, err
	}
	if status, err := s.parse(kind, body, pr); err != nil {
		return nil, status, err
	}
	return body, 0, nil
}

func (s *server) readRequest(w http.ResponseWriter, r *http.Request, kind request.Kind) (genRequest, int, error) {
	var pr request.Request
	body, status, err := s.readParsed(w, r, kind, &pr)
	if err != nil {
		return genRequest{}, status, err
	}
	var opt options
	if err := json.Unmarshal(body, &opt); err != nil {
		return genRequest{}, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %w", err)
	}
	g := genRequest{kind: kind, model: pr.Model, stream: pr.Stream, blocks: pr.Blocks, n: 1,
		prompt: promptTokens(pr), output: s.cfg.maxTokens}
	for _, n := range []*int{opt.MaxCompletionTokens, opt.MaxTokens, opt.MaxOutputTokens} {
		if n != nil {
			if *n < 1 {
				return genRequest{}, http.StatusBadRequest, fmt.Errorf("max_tokens must be at least 1, got %d", *n)
			}
			g.output = *n
		}
	}
	if opt.N != nil {
		if *opt.N < 1 || *opt.N > maxChoices {
			return genRequest{}, http.StatusBadRequest, fmt.Errorf("n must be in [1, %d], got %d", maxChoices, *opt.N)
		}
		g.n = *opt.N
	}
	g.includeUsage = opt.StreamOptions != nil && opt.StreamOptions.IncludeUsage
	if kind == request.ChatCompletions {
		lastRole := ""
		if len(opt.Messages) > 0 {
			lastRole = opt.Messages[len(opt.Messages)-1].Role
		}
		call, err := chooseTool(opt.Tools, opt.ToolChoice, lastRole)
		if err != nil {
			return genRequest{}, http.StatusBadRequest, err
		}
		if call != nil {
			call.ID = fmt.Sprintf("chatcmpl-tool-%s-%d", s.cfg.name, s.ids.Add(1))
		}
		g.call = call
	}
	return g, 0, nil
}

// modelNotFound is vLLM's answer for a model it does not serve, in its own words.
type modelNotFound string

func (m modelNotFound) Error() string { return "The model `" + string(m) + "` does not exist." }

// maxChoices bounds n, so one request cannot ask for unbounded work.
const maxChoices = 16

func promptTokens(pr request.Request) int {
	return max(1, (pr.PromptBytes+charsPerToken-1)/charsPerToken)
}

// wait blocks until st changes or the client leaves; it reports false in the second case.
func wait(r *http.Request, st *stream) bool {
	select {
	case <-st.notify:
		return true
	case <-r.Context().Done():
		return false
	}
}

// waitDone blocks until st is done; false when the client left first.
func waitDone(r *http.Request, st *stream) bool {
	for {
		if _, _, done := st.snapshot(); done {
			return true
		}
		if !wait(r, st) {
			return false
		}
	}
}

func (s *server) fullResponse(w http.ResponseWriter, r *http.Request, g genRequest, st *stream, id string) {
	if !waitDone(r, st) {
		return
	}
	gen, cached, _ := st.snapshot()
	text := strings.Repeat("tok ", gen)
	choices := make([]any, 0, g.n)
	for i := range g.n {
		choice := map[string]any{"index": i, "finish_reason": "length", "logprobs": nil}
		if g.kind == request.ChatCompletions {
			msg := map[string]any{"role": "assistant", "content": text, "tool_calls": []any{}}
			if g.call != nil {
				msg["content"], msg["tool_calls"] = nil, []any{g.call.full()}
				choice["finish_reason"] = "tool_calls"
			}
			choice["message"] = msg
		} else {
			choice["text"] = text
		}
		choices = append(choices, choice)
	}
	object := "text_completion"
	if g.kind == request.ChatCompletions {
		object = "chat.completion"
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": id, "object": object, "created": time.Now().Unix(), "model": g.model,
		"choices": choices, "usage": usage(g.prompt, g.n*gen, cached),
	})
}

func usage(prompt, gen, cached int) map[string]any {
	return map[string]any{
		"prompt_tokens": prompt, "completion_tokens": gen, "total_tokens": prompt + gen,
		"prompt_tokens_details": map[string]any{"cached_tokens": cached},
	}
}

// streamResponse sends one chunk per choice per generated token, as vLLM does, then the
// usage chunk when asked for, then [DONE].
func (s *server) streamResponse(w http.ResponseWriter, r *http.Request, g genRequest, st *stream, id string) {
	sse := newSSE(w)
	object := "text_completion"
	if g.kind == request.ChatCompletions {
		object = "chat.completion.chunk"
	}
	c := chunker{id: id, object: object, created: time.Now().Unix(), g: g}
	sent := 0
	for {
		gen, cached, done := st.snapshot()
		for ; sent < gen; sent++ {
			for i := range g.n {
				sse.data(c.chunk(i, sent, gen, done && sent == gen-1))
			}
		}
		if done {
			if g.call != nil {
				for i := range g.n {
					sse.data(c.closing(i))
				}
			}
			if g.includeUsage {
				sse.data(map[string]any{"id": id, "object": object, "created": c.created, "model": g.model,
					"choices": []any{}, "usage": usage(g.prompt, g.n*gen, cached)})
			}
			sse.done()
			return
		}
		sse.flush()
		if !wait(r, st) {
			return
		}
	}
}

// chunker builds the stream's chunks.
type chunker struct {
	id, object string
	created    int64
	g          genRequest
}

// chunk is choice i's chunk for output token tok (of gen so far); last ends the choice.
func (c chunker) chunk(i, tok, gen int, last bool) map[string]any {
	choice := map[string]any{"index": i, "finish_reason": nil, "logprobs": nil}
	if last {
		choice["finish_reason"] = "length"
	}
	if c.g.kind != request.ChatCompletions {
		choice["text"] = "tok "
	} else if c.g.call == nil {
		delta := map[string]any{"content": "tok "}
		if tok == 0 {
			delta["role"] = "assistant"
		}
		choice["delta"] = delta
	} else {
		// The call's arguments arrive in pieces over the output tokens; the first piece
		// carries the call's id and name, as vLLM's tool parsers stream them.
		end := len(c.g.call.Arguments) * (tok + 1) / c.g.output
		if last || end > len(c.g.call.Arguments) {
			end = len(c.g.call.Arguments)
		}
		start := min(len(c.g.call.Arguments)*tok/c.g.output, end)
		delta := map[string]any{"tool_calls": []any{c.g.call.delta(tok == 0, c.g.call.Arguments[start:end])}}
		if tok == 0 {
			delta["role"] = "assistant"
		}
		choice["delta"] = delta
		choice["finish_reason"] = nil // a closing chunk follows (see closing)
	}
	return map[string]any{"id": c.id, "object": c.object, "created": c.created, "model": c.g.model, "choices": []any{choice}}
}

// closing ends choice i of a tool-call answer: an empty delta with finish_reason
// "tool_calls", after the chunk with the arguments' last piece (clients, the OpenAI SDKs'
// stream accumulators among them, take a chunk without a tool-call delta as the call's end).
func (c chunker) closing(i int) map[string]any {
	choice := map[string]any{"index": i, "delta": map[string]any{}, "finish_reason": "tool_calls", "logprobs": nil}
	return map[string]any{"id": c.id, "object": c.object, "created": c.created, "model": c.g.model, "choices": []any{choice}}
}

// sse writes a server-sent event stream.
type sse struct {
	w  io.Writer
	fl http.Flusher
}

func newSSE(w http.ResponseWriter) sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	return sse{w: w, fl: fl}
}

func (s sse) data(v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(s.w, "data: %s\n\n", b)
}

// event writes a named event (the Responses API's form).
func (s sse) event(name string, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", name, b)
}

func (s sse) flush() {
	if s.fl != nil {
		s.fl.Flush()
	}
}

func (s sse) done() {
	fmt.Fprint(s.w, "data: [DONE]\n\n")
	s.flush()
}

func (s *server) listModels(w http.ResponseWriter, _ *http.Request) {
	data := make([]any, 0, len(s.cfg.models))
	for _, m := range s.cfg.models {
		data = append(data, map[string]any{"id": m, "object": "model", "owned_by": "meridian-mock"})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// errorType is the OpenAI error type of an HTTP status.
func errorType(status int) string {
	switch {
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status < 500:
		return "invalid_request_error"
	case status == http.StatusServiceUnavailable:
		return "service_unavailable"
	}
	return "server_error"
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": status}})
}
