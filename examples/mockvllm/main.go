// Command mockvllm is an OpenAI-compatible stand-in for a vLLM engine, driven by the engine
// model in sim/engine on real time: completions and chat completions with SSE streaming,
// n choices, tool calls (streamed in pieces, as vLLM's tool parsers do), usage with
// prompt_tokens_details.cached_tokens; /v1/embeddings; the Responses API (/v1/responses,
// with its event stream); /v1/models, /health, vLLM-named Prometheus metrics, and fault
// injection by flag or at run time through /admin/faults.
//
// Latency comes from the model (continuous batching, prefill that skips cached prefix
// blocks, decode steps that slow as the batch grows) unless --ttft or --itl is given, in
// which case every request gets exactly those latencies. Every response names the engine
// in the x-served-by header.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
)

// charsPerToken turns prompt bytes into tokens: the mock has no tokenizer.
const charsPerToken = 4

type config struct {
	listen    string
	name      string
	models    []string
	fixed     bool // --ttft or --itl given: fixed latencies instead of the model
	ttft      time.Duration
	itl       time.Duration
	maxTokens int // output tokens when the request does not say
	maxBody   int64
	embedDim  int
	engine    engine.Config
	faults    Faults
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("mockvllm", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: mockvllm [flags]\n\n"+
			"An OpenAI-compatible mock vLLM engine. Latencies come from the engine model in\n"+
			"sim/engine (calibrated to Llama-3.1-8B on one A100) unless --ttft or --itl is set.\n"+
			"Faults can be changed at run time: POST /admin/faults with a JSON body such as\n"+
			"{\"error_rate\":0.1,\"latency_multiplier\":5,\"hang\":false,\"close_connections\":false}.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	c := config{engine: engine.A100Llama8B(16)}
	var models string
	var kvTokens int
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8000", "address to serve HTTP on")
	fs.StringVar(&c.name, "name", "engine-0", "engine name, sent in the x-served-by response header and the engine metric label")
	fs.StringVar(&models, "model", "meridian-demo", "comma-separated model names this engine serves")
	fs.DurationVar(&c.ttft, "ttft", 20*time.Millisecond, "fixed time to first token; setting --ttft or --itl replaces the engine model with fixed latencies")
	fs.DurationVar(&c.itl, "itl", 5*time.Millisecond, "fixed time between output tokens (see --ttft)")
	fs.Int64Var(&c.maxBody, "max-body-bytes", 16<<20, "largest request body; a larger one is answered 413")
	fs.IntVar(&c.embedDim, "embedding-dim", 32, "length of the vectors /v1/embeddings returns")
	fs.IntVar(&c.maxTokens, "default-max-tokens", 16, "output tokens when a request sets neither max_tokens nor max_completion_tokens")
	fs.IntVar(&c.engine.MaxNumSeqs, "max-num-seqs", c.engine.MaxNumSeqs, "largest running batch")
	fs.IntVar(&c.engine.MaxBatchedTokens, "max-num-batched-tokens", c.engine.MaxBatchedTokens, "token budget of one engine step")
	fs.IntVar(&c.engine.BlockTokens, "block-tokens", c.engine.BlockTokens, "tokens per KV block and prefix hash (4 prompt bytes count as one token)")
	fs.IntVar(&kvTokens, "kv-tokens", c.engine.KVBlocks*c.engine.BlockTokens, "KV cache capacity in tokens")
	fs.Float64Var(&c.engine.PrefillTokensPerSec, "prefill-tokens-per-sec", c.engine.PrefillTokensPerSec, "prefill speed for uncached prompt tokens")
	fs.DurationVar(&c.engine.StepBase, "step-base", c.engine.StepBase, "fixed cost of one engine step")
	fs.DurationVar(&c.engine.DecodeSeqCost, "decode-seq-cost", c.engine.DecodeSeqCost, "extra step cost per decoding request")
	fs.Float64Var(&c.faults.ErrorRate, "error-rate", 0, "fraction of generation requests answered with HTTP 500")
	fs.Float64Var(&c.faults.LatencyMultiplier, "latency-multiplier", 1, "multiplies every step (or fixed latency)")
	fs.BoolVar(&c.faults.Hang, "hang", false, "accept generation requests and never answer them")
	fs.BoolVar(&c.faults.CloseConnections, "close-connections", false, "close the connection of every generation request without answering")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	fs.Visit(func(f *flag.Flag) { c.fixed = c.fixed || f.Name == "ttft" || f.Name == "itl" })
	for _, m := range strings.Split(models, ",") {
		if m = strings.TrimSpace(m); m != "" {
			c.models = append(c.models, m)
		}
	}
	if c.engine.BlockTokens > 0 {
		c.engine.KVBlocks = kvTokens / c.engine.BlockTokens
	}
	return c, c.validate()
}

func (c config) validate() error {
	var errs []error
	if len(c.models) == 0 {
		errs = append(errs, errors.New("--model: at least one model name is required"))
	}
	if c.ttft < 0 || c.itl < 0 {
		errs = append(errs, errors.New("--ttft and --itl must not be negative"))
	}
	if c.maxBody < 1024 {
		errs = append(errs, fmt.Errorf("--max-body-bytes is %d, must be at least 1024", c.maxBody))
	}
	if c.embedDim < 1 || c.embedDim > 8192 {
		errs = append(errs, fmt.Errorf("--embedding-dim is %d, must be in [1, 8192]", c.embedDim))
	}
	if c.maxTokens < 1 {
		errs = append(errs, fmt.Errorf("--default-max-tokens is %d, must be at least 1", c.maxTokens))
	}
	if err := c.engine.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.faults.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
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
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		log.Error("exit", "err", fmt.Errorf("listen on %s: %w", cfg.listen, err))
		os.Exit(1)
	}
	if err := serve(ctx, ln, cfg, log); err != nil {
		log.Error("exit", "err", err)
		os.Exit(1)
	}
}

// serve runs the mock on ln until ctx ends.
func serve(ctx context.Context, ln net.Listener, cfg config, log *slog.Logger) error {
	s, err := newServer(cfg, log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.backend.run(ctx)
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving", "addr", ln.Addr().String(), "models", cfg.models, "fixed_latency", cfg.fixed)
	go func() {
		<-ctx.Done()
		s.faults.release()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve HTTP: %w", err)
	}
	return nil
}
