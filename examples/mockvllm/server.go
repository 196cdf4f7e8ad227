package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meridian-router/meridian/extproc/request"
)

// maxBody bounds a request body, like vLLM's server does.
const maxBody = 16 << 20

type server struct {
	cfg     config
	log     *slog.Logger
	backend backend
	faults  *faultState
	parse   request.Options
	ids     atomic.Uint64
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
	s.parse = request.Options{BlockBytes: blockBytes, MaxBlocks: maxBody/blockBytes + 1, MaxDepth: 64}
	if err := s.parse.Validate(); err != nil {
		return nil, fmt.Errorf("prompt hashing for --block-tokens %d: %w", cfg.engine.BlockTokens, err)
	}
	s.faults = newFaultState(cfg.faults, func(f Faults) { s.backend.setSlowdown(f.LatencyMultiplier) })
	return s, nil
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, request.Completions) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, request.ChatCompletions) })
	mux.HandleFunc("GET /v1/models", s.listModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", newMetricsHandler(s.cfg.name, s.cfg.models, s.backend.stats))
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
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// genRequest is one parsed generation request.
type genRequest struct {
	kind         request.Kind
	model        string
	stream       bool
	includeUsage bool
	prompt       int
	output       int
	blocks       []uint64
}

func (s *server) generate(w http.ResponseWriter, r *http.Request, kind request.Kind) {
	if s.faults.inject(w, r) {
		return
	}
	g, status, err := s.readRequest(r, kind)
	if err != nil {
		typ := "invalid_request_error"
		if status == http.StatusNotFound {
			typ = "not_found_error"
		}
		writeError(w, status, typ, err.Error())
		return
	}
	st, cancel, err := s.backend.submit(g.prompt, g.output, g.blocks)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	defer cancel()
	id := fmt.Sprintf("cmpl-%s-%d", s.cfg.name, s.ids.Add(1))
	if g.stream {
		s.streamResponse(w, r, g, st, id)
		return
	}
	s.fullResponse(w, r, g, st, id)
}

func (s *server) readRequest(r *http.Request, kind request.Kind) (genRequest, int, error) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return genRequest{}, http.StatusBadRequest, fmt.Errorf("read body: %w", err)
	}
	var pr request.Request
	if err := request.Parse(kind, body, true, s.parse, &pr); err != nil {
		return genRequest{}, http.StatusBadRequest, err
	}
	var opt options
	if err := json.Unmarshal(body, &opt); err != nil {
		return genRequest{}, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %w", err)
	}
	if !slices.Contains(s.cfg.models, pr.Model) {
		return genRequest{}, http.StatusNotFound, fmt.Errorf("the model `%s` does not exist on %s", pr.Model, s.cfg.name)
	}
	g := genRequest{kind: kind, model: pr.Model, stream: pr.Stream, blocks: pr.Blocks,
		prompt: max(1, (pr.PromptBytes+charsPerToken-1)/charsPerToken), output: s.cfg.maxTokens}
	for _, n := range []*int{opt.MaxCompletionTokens, opt.MaxTokens} {
		if n != nil {
			if *n < 1 {
				return genRequest{}, http.StatusBadRequest, fmt.Errorf("max_tokens must be at least 1, got %d", *n)
			}
			g.output = *n
		}
	}
	g.includeUsage = opt.StreamOptions != nil && opt.StreamOptions.IncludeUsage
	return g, 0, nil
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

func (s *server) fullResponse(w http.ResponseWriter, r *http.Request, g genRequest, st *stream, id string) {
	for {
		if _, _, done := st.snapshot(); done {
			break
		}
		if !wait(r, st) {
			return
		}
	}
	gen, cached, _ := st.snapshot()
	text := strings.Repeat("tok ", gen)
	choice := map[string]any{"index": 0, "finish_reason": "length"}
	object := "text_completion"
	if g.kind == request.ChatCompletions {
		object = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		choice["text"] = text
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": id, "object": object, "created": time.Now().Unix(), "model": g.model,
		"choices": []any{choice}, "usage": usage(g.prompt, gen, cached),
	})
}

func usage(prompt, gen, cached int) map[string]any {
	return map[string]any{
		"prompt_tokens": prompt, "completion_tokens": gen, "total_tokens": prompt + gen,
		"prompt_tokens_details": map[string]any{"cached_tokens": cached},
	}
}

func (s *server) streamResponse(w http.ResponseWriter, r *http.Request, g genRequest, st *stream, id string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	object := "text_completion"
	if g.kind == request.ChatCompletions {
		object = "chat.completion.chunk"
	}
	created := time.Now().Unix()
	sent := 0
	for {
		gen, cached, done := st.snapshot()
		for ; sent < gen; sent++ {
			last := done && sent == gen-1
			writeEvent(w, chunk(id, object, created, g, sent == 0, last))
		}
		if done {
			if g.includeUsage {
				writeEvent(w, map[string]any{"id": id, "object": object, "created": created, "model": g.model,
					"choices": []any{}, "usage": usage(g.prompt, gen, cached)})
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
			if fl != nil {
				fl.Flush()
			}
			return
		}
		if fl != nil {
			fl.Flush()
		}
		if !wait(r, st) {
			return
		}
	}
}

func chunk(id, object string, created int64, g genRequest, first, last bool) map[string]any {
	choice := map[string]any{"index": 0, "finish_reason": nil}
	if last {
		choice["finish_reason"] = "length"
	}
	if g.kind == request.ChatCompletions {
		delta := map[string]any{"content": "tok "}
		if first {
			delta["role"] = "assistant"
		}
		choice["delta"] = delta
	} else {
		choice["text"] = "tok "
	}
	return map[string]any{"id": id, "object": object, "created": created, "model": g.model, "choices": []any{choice}}
}

func writeEvent(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "data: %s\n\n", b)
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

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": status}})
}
