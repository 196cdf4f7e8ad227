// Command mockvllm is an OpenAI-compatible stand-in for a vLLM engine: completions and chat
// completions with SSE streaming, /v1/models, /health and vLLM-named Prometheus metrics.
// Every response names the engine that served it in the x-served-by header.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

type config struct {
	listen string
	name   string
	models []string
	ttft   time.Duration
	itl    time.Duration
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("mockvllm", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: mockvllm [flags]\n\nAn OpenAI-compatible mock vLLM engine.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var c config
	var models string
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8000", "address to serve HTTP on")
	fs.StringVar(&c.name, "name", "engine-0", "engine name, sent in the x-served-by response header and the engine metric label")
	fs.StringVar(&models, "model", "meridian-demo", "comma-separated model names this engine serves")
	fs.DurationVar(&c.ttft, "ttft", 20*time.Millisecond, "time to first token")
	fs.DurationVar(&c.itl, "itl", 5*time.Millisecond, "time between output tokens")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for _, m := range strings.Split(models, ",") {
		if m = strings.TrimSpace(m); m != "" {
			c.models = append(c.models, m)
		}
	}
	if len(c.models) == 0 {
		return c, errors.New("--model: at least one model name is required")
	}
	if c.ttft < 0 || c.itl < 0 {
		return c, errors.New("--ttft and --itl must not be negative")
	}
	return c, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mockvllm:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("engine", cfg.name)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("exit", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.listen, err)
	}
	e := &engine{cfg: cfg}
	srv := &http.Server{Handler: e.routes(), ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving", "addr", ln.Addr().String(), "models", cfg.models)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type engine struct {
	cfg      config
	running  atomic.Int64
	requests atomic.Int64
}

func (e *engine) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { e.generate(w, r, false) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { e.generate(w, r, true) })
	mux.HandleFunc("GET /v1/models", e.listModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-served-by", e.cfg.name)
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /metrics", e.metrics)
	return mux
}

type genRequest struct {
	Model     string `json:"model"`
	Stream    bool   `json:"stream"`
	MaxTokens *int   `json:"max_tokens"`
}

func (e *engine) serves(model string) bool {
	for _, m := range e.cfg.models {
		if m == model {
			return true
		}
	}
	return false
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": status}})
}

func (e *engine) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	w.Header().Set("x-served-by", e.cfg.name)
	var req genRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid JSON body: "+err.Error())
		return
	}
	if !e.serves(req.Model) {
		writeError(w, http.StatusNotFound, "not_found_error", fmt.Sprintf("model %q is not served by %s", req.Model, e.cfg.name))
		return
	}
	n := 16
	if req.MaxTokens != nil && *req.MaxTokens > 0 {
		n = *req.MaxTokens
	}
	e.requests.Add(1)
	e.running.Add(1)
	defer e.running.Add(-1)
	id := fmt.Sprintf("cmpl-%s-%d", e.cfg.name, e.requests.Load())
	object := "text_completion"
	if chat {
		object = "chat.completion"
	}
	if !sleep(r.Context(), e.cfg.ttft) {
		return
	}
	if !req.Stream {
		if !sleep(r.Context(), time.Duration(n-1)*e.cfg.itl) {
			return
		}
		text := strings.Repeat("tok ", n)
		choice := map[string]any{"index": 0, "finish_reason": "length"}
		if chat {
			choice["message"] = map[string]any{"role": "assistant", "content": text}
		} else {
			choice["text"] = text
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": id, "object": object, "created": time.Now().Unix(), "model": req.Model,
			"choices": []any{choice},
			"usage":   map[string]any{"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n},
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	for i := 0; i < n; i++ {
		if i > 0 && !sleep(r.Context(), e.cfg.itl) {
			return
		}
		choice := map[string]any{"index": 0, "finish_reason": nil}
		if i == n-1 {
			choice["finish_reason"] = "length"
		}
		if chat {
			choice["delta"] = map[string]any{"content": "tok "}
		} else {
			choice["text"] = "tok "
		}
		b, _ := json.Marshal(map[string]any{"id": id, "object": object + ".chunk", "model": req.Model, "choices": []any{choice}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if fl != nil {
		fl.Flush()
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (e *engine) listModels(w http.ResponseWriter, r *http.Request) {
	data := make([]any, 0, len(e.cfg.models))
	for _, m := range e.cfg.models {
		data = append(data, map[string]any{"id": m, "object": "model", "owned_by": "meridian-mock"})
	}
	w.Header().Set("x-served-by", e.cfg.name)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

func (e *engine) metrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	for _, m := range e.cfg.models {
		fmt.Fprintf(w, "vllm:num_requests_running{engine=%q,model_name=%q} %d\n", e.cfg.name, m, e.running.Load())
		fmt.Fprintf(w, "vllm:num_requests_waiting{engine=%q,model_name=%q} 0\n", e.cfg.name, m)
	}
}
