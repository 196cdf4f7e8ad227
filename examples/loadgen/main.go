package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/examples/loadgen/load"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without process globals; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := newFlagSet(&o, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "loadgen: unexpected arguments %q (see --help)\n", fs.Args())
		return 2
	}
	sched, cfg, info, err := plan(&o)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return 2
	}
	var rw *resultWriter
	if o.out != "" {
		if rw, err = newResultWriter(o.out); err != nil {
			fmt.Fprintln(stderr, "loadgen:", err)
			return 1
		}
		cfg.OnResult = rw.write
	}
	runner, err := load.NewRunner(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return 1
	}
	fmt.Fprintf(stderr, "loadgen: %s against %s\n", info, o.url)
	stopProgress := startProgress(runner, o.progress, stderr)
	summary, err := runner.Run(ctx, sched)
	stopProgress()
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return 1
	}
	if rw != nil {
		if err := rw.close(); err != nil {
			fmt.Fprintln(stderr, "loadgen:", err)
		}
	}
	line, err := json.Marshal(summary)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen: encode summary:", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s\n", line)
	return 0
}

// startProgress prints runner.Progress every interval until the returned
// function is called, which prints a final line. On a terminal the line is
// rewritten in place; elsewhere (logs, pipes) each update is its own line.
func startProgress(r *load.Runner, interval time.Duration, w io.Writer) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	prefix, suffix := "", "\n"
	if isTerminal(w) {
		prefix, suffix = "\r", "\x1b[K"
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				fmt.Fprintf(w, "%s%s%s", prefix, r.Progress(), suffix)
			case <-done:
				fmt.Fprintf(w, "%s%s%s", prefix, r.Progress(), suffix)
				if suffix != "\n" {
					fmt.Fprintln(w)
				}
				return
			}
		}
	}()
	return func() { close(done); <-finished }
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// resultWriter writes one JSON line per request; load.Runner serializes
// calls to write.
type resultWriter struct {
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
	err error
}

// resultLine is the --out record. Latencies are in milliseconds; ttft_ms is
// 0 when not measured.
type resultLine struct {
	Index       int     `json:"i"`
	StartMs     float64 `json:"start_ms"`
	QueuedMs    float64 `json:"queued_ms"`
	Status      int     `json:"status"`
	Class       string  `json:"class"`
	Engine      string  `json:"engine,omitempty"`
	TTFTMs      float64 `json:"ttft_ms"`
	ITLMeanMs   float64 `json:"itl_mean_ms"`
	E2EMs       float64 `json:"e2e_ms"`
	Tokens      int     `json:"tokens"`
	PromptBytes int     `json:"prompt_bytes"`
	Detail      string  `json:"detail,omitempty"`
}

func newResultWriter(path string) (*resultWriter, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	w := bufio.NewWriter(f)
	return &resultWriter{f: f, w: w, enc: json.NewEncoder(w)}, nil
}

func (rw *resultWriter) write(r load.Result) {
	if rw.err != nil {
		return
	}
	var itl time.Duration
	for _, g := range r.ITLs {
		itl += g
	}
	if len(r.ITLs) > 0 {
		itl /= time.Duration(len(r.ITLs))
	}
	rw.err = rw.enc.Encode(resultLine{
		Index: r.Index, StartMs: msOf(r.Start), QueuedMs: msOf(r.Queued), Status: r.Status, Class: r.Class,
		Engine: r.Engine, TTFTMs: msOf(r.TTFT), ITLMeanMs: msOf(itl), E2EMs: msOf(r.E2E),
		Tokens: r.Tokens, PromptBytes: r.PromptBytes, Detail: r.Detail,
	})
}

func (rw *resultWriter) close() error {
	err := errors.Join(rw.err, rw.w.Flush(), rw.f.Close())
	if err != nil {
		return fmt.Errorf("--out %s: %w", rw.f.Name(), err)
	}
	return nil
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
