package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/bootstrap"
	"github.com/meridian-router/meridian/envoy/stack"
)

type options struct {
	duration   time.Duration
	scale      float64
	dir        string
	fleet      string
	reportJSON string
	live       string // auto, on, off
	bins       string // prebuilt binaries; empty: build them
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long traffic runs (the story's five phases share it; at least 5s)")
	fs.Float64Var(&o.scale, "scale", 1, "multiplies every request rate (lower it on a slow machine)")
	fs.StringVar(&o.dir, "dir", "", "directory for logs and generated config (default: a new temp dir)")
	fs.StringVar(&o.fleet, "fleet", "", "the demo's fleet file (default: examples/demo/fleet.yaml in this repository)")
	fs.StringVar(&o.reportJSON, "report-json", "", "also write the report as JSON to this file")
	fs.StringVar(&o.bins, "bins", "", "directory with meridian-control, meridian-sidecar and mockvllm already built (default: build them into --dir)")
	fs.StringVar(&o.live, "live", "auto", "live screen: on, off (a progress line every 5 s) or auto (on when stdout is a terminal)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: demo [flags]\n\nRuns meridian end to end on 127.0.0.1, plays a load story through it and prints a report.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.live != "auto" && o.live != "on" && o.live != "off" {
		return o, fmt.Errorf("--live %q: want auto, on or off", o.live)
	}
	return o, nil
}

// errInterrupted means the run was stopped by a signal; the report was still printed.
var errInterrupted = errors.New("interrupted")

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = run(ctx, o, os.Stdout)
	switch {
	case errors.Is(err, errInterrupted):
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, out io.Writer) error {
	root, err := stack.RepoRoot()
	if err != nil {
		return err
	}
	if o.fleet == "" {
		o.fleet = filepath.Join(root, "examples", "demo", "fleet.yaml")
	}
	topo, err := loadTopology(o.fleet)
	if err != nil {
		return err
	}
	p, err := newPlan(topo, o.duration, o.scale)
	if err != nil {
		return err
	}
	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", "meridian-demo-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(out, "demo: logs and generated config go to %s\n", o.dir)
	bins, err := binaries(o)
	if err != nil {
		return err
	}
	nw := describeNetwork(ctx, topo)
	fmt.Fprintf(out, "demo: network: %s\n", nw.Detail)
	s, delay, err := startSystem(ctx, topo, o.dir, bins)
	if err != nil {
		return err
	}
	defer s.Close()
	defer delay.Close()
	fmt.Fprintf(out, "demo: dashboard %s/dashboard/  state %s/debug/state\n", s.ControlHTTP, s.ControlHTTP)
	for _, n := range topo.nodeNames() {
		fmt.Fprintf(out, "demo: %s: Envoy %s (admin %s)\n", n, s.Nodes[n].URL, s.Nodes[n].AdminURL)
	}
	r, err := play(ctx, p, s, nw, o.live == "on" || (o.live == "auto" && isTerminal(out)), out)
	if err != nil {
		return err
	}
	r.print(out, topo)
	if o.reportJSON != "" {
		if err := writeJSON(o.reportJSON, r); err != nil {
			return err
		}
	}
	if r.Interrupted {
		return errInterrupted
	}
	return nil
}

// startSystem starts every process and puts the engines behind their delaying fronts.
func startSystem(ctx context.Context, topo *topology, dir string, bins stack.Binaries) (*stack.Stack, *stack.RegionDelay, error) {
	spec := topo.spec(dir, bins)
	// The demo's load generator is the trusted gateway that sets x-meridian-priority.
	spec.Bootstrap = func(p *bootstrap.Params) { p.TrustPriorityHeader = true }
	startCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	s, err := stack.Start(startCtx, spec)
	if err != nil {
		return nil, nil, fmt.Errorf("start the system (logs in %s): %w", dir, err)
	}
	delay, err := s.DelayByRegion(startCtx, topo.rttFunc())
	if err != nil {
		s.Close()
		return nil, nil, fmt.Errorf("engine delay fronts: %w", err)
	}
	return s, delay, nil
}

// binaries builds the system's binaries into the run's directory, or takes prebuilt ones.
func binaries(o options) (stack.Binaries, error) {
	if o.bins == "" {
		return stack.Build(o.dir)
	}
	envoy, err := stack.EnvoyPath()
	if err != nil {
		return stack.Binaries{}, err
	}
	b := stack.Binaries{Control: filepath.Join(o.bins, "meridian-control"), Sidecar: filepath.Join(o.bins, "meridian-sidecar"),
		MockEngine: filepath.Join(o.bins, "mockvllm"), Envoy: envoy}
	for _, p := range []string{b.Control, b.Sidecar, b.MockEngine} {
		if _, err := os.Stat(p); err != nil {
			return stack.Binaries{}, fmt.Errorf("--bins: %w", err)
		}
	}
	return b, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
