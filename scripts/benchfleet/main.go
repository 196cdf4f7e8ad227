// Command benchfleet checks the simulator's ranking on real processes. It replays a subset
// of a trace with the load generator's engine (examples/loadgen/load) through real Envoys
// into examples/mockvllm engines, which run the simulator's engine model (sim/engine) with
// prefix caching on the prompt's block hashes, in a multi-region fleet whose inter-region
// round trip is injected (stack.DelayByRegion). In one run and on the same engines it
// compares three configurations, each on cold engines (every engine is restarted before
// each configuration):
//
//   - meridian: the control server and one sidecar per region's Envoy, shipped defaults;
//   - least-request: each region's Envoy balances with Envoy's own LEAST_REQUEST (default
//     choice_count 2), no sidecar;
//   - ring-hash: each region's Envoy uses Envoy's RING_HASH (default ring sizes) on a
//     header the client sets to a hash of the prompt's first 4 KiB (the first rung of
//     the sidecar's key ladder), no sidecar.
//
// Time is scaled: with --speed k the engines run k times faster (mockvllm
// --latency-multiplier 1/k), arrivals come k times faster, the injected round trip is
// 1/k of --rtt, and the SLO's bounds are divided by k, so a run of the trace's T seconds
// takes T/k. meridian's own periods (solve, scrape, report) are its shipped defaults,
// unscaled.
//
// The last line of output is a JSON object with each configuration's SLO attainment,
// TTFT p50/p90, KV hit rate (from the engines' vllm:prefix_cache_* counters), shed and
// failed counts and requests sent.
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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
)

// Configuration names.
const (
	Meridian     = "meridian"
	LeastRequest = "least-request"
	RingHash     = "ring-hash"
)

// Configs lists every configuration in the order of the first repeat.
var Configs = []string{Meridian, LeastRequest, RingHash}

type options struct {
	tracePath, traceFormat string
	requests, offset       int
	load, speed            float64
	regions                int
	perRegion              int
	rttMillis              float64
	scope                  string
	configs                []string
	repeats                int
	blockBytes             int
	timeout                time.Duration
	slo                    SLO
	seed                   uint64
	dir                    string
	quiet                  bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cli(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usageHead = `Usage: benchfleet [flags]

Replays a time-scaled subset of a trace through real Envoys into mock vLLM engines in
two or more regions, and compares meridian (control server + sidecars) with Envoy's own
LEAST_REQUEST and RING_HASH (on a prompt-prefix header) on the same, restarted engines.
The last line of output is a JSON summary.

Flags:
`

// cli is main without process globals; it returns the exit status.
func cli(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "benchfleet:", err)
		return 2
	}
	out, err := run(ctx, o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "benchfleet:", err)
		return 1
	}
	for _, c := range o.configs {
		r := out.Configs[c]
		fmt.Fprintf(stdout, "%-13s sent %4d  ok %4d  shed %3d  failed %3d  SLO %5.1f%%  TTFT p50 %7.1f ms  p90 %7.1f ms  KV hit %.3f  cross-region %.2f\n",
			c, r.Sent, r.OK, r.Shed, r.Failed, 100*r.SLOAttainment, r.TTFTP50, r.TTFTP90, r.KVHitRate, r.CrossRegion)
		if p, ok := out.Sim[c]; ok {
			fmt.Fprintf(stdout, "  simulator (%s): shed %d failed %d  TTFT p50 %7.1f ms  p90 %7.1f ms  KV hit %.3f\n",
				p.Policy, p.Shed, p.Failed, p.TTFTP50, p.TTFTP90, p.KVHitRate)
		}
	}
	line, err := json.Marshal(out)
	if err != nil {
		fmt.Fprintln(stderr, "benchfleet: encode summary:", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s\n", line)
	return 0
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("benchfleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usageHead); fs.PrintDefaults() }
	o := options{slo: DefaultSLO()}
	var configs string
	fs.StringVar(&o.tracePath, "trace", "traces/mooncake_synthetic_trace.jsonl", "trace to replay (Mooncake JSONL with hash_ids; Azure CSV replays without shared prefixes), relative to the repository root unless absolute")
	fs.StringVar(&o.traceFormat, "trace-format", "auto", "trace format: auto, mooncake, azure or sessions (AIPerf multi-turn sessions)")
	fs.IntVar(&o.requests, "requests", 480, "replay N consecutive requests of the trace")
	fs.IntVar(&o.offset, "offset", -1, "index of the first request replayed (-1: the last --requests of the trace, where a Mooncake trace's prefix reuse has built up)")
	fs.Float64Var(&o.load, "load", 0.8, "offered load as a fraction of the fleet's cold capacity (engines / mean cold service time of the subset, as the simulator computes it)")
	fs.Float64Var(&o.speed, "speed", 4, "time scale k: engines, arrivals and the injected RTT run k times faster, and the SLO bounds are divided by k")
	fs.IntVar(&o.regions, "regions", 2, "regions, each with one Envoy (and sidecar) and --engines-per-region engines")
	fs.IntVar(&o.perRegion, "engines-per-region", 2, "engines in each region")
	fs.Float64Var(&o.rttMillis, "rtt", 62, "round trip between two regions in ms before time scaling (the simulator's us-east to us-west); 1 ms within a region")
	fs.StringVar(&o.scope, "baseline-scope", "global", "engines each baseline Envoy balances over: global (every engine, region-blind, as the simulator's least-request and prefix-hash) or region (its region's engines; the others at priority 1, for failover only)")
	fs.StringVar(&configs, "configs", strings.Join(Configs, ","), "comma-separated configurations to run: "+strings.Join(Configs, ", "))
	fs.IntVar(&o.repeats, "repeats", 1, "run every configuration this many times (rotating their order) and report medians")
	fs.IntVar(&o.blockBytes, "block-bytes", 2048, "prompt bytes per 512-token trace block (2048 keeps real prompt sizes: the mock counts 4 bytes a token)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on each request (wall time); a request past it fails")
	fs.DurationVar(&o.slo.TTFTBase, "slo-ttft", o.slo.TTFTBase, "SLO: TTFT allowance per request before time scaling")
	fs.DurationVar(&o.slo.TTFTPerToken, "slo-ttft-per-token", o.slo.TTFTPerToken, "SLO: extra TTFT allowance per prompt token before time scaling")
	fs.DurationVar(&o.slo.MaxITL, "slo-itl", o.slo.MaxITL, "SLO: bound on a request's mean inter-token latency before time scaling")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the region assignment and the prompt text")
	fs.StringVar(&o.dir, "dir", "", "directory for the processes' logs (default: a temp dir, removed afterwards)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	for _, c := range strings.Split(configs, ",") {
		c = strings.TrimSpace(c)
		if !slices.Contains(Configs, c) {
			return o, fmt.Errorf("--configs: %q is not one of %s", c, strings.Join(Configs, ", "))
		}
		if !slices.Contains(o.configs, c) {
			o.configs = append(o.configs, c)
		}
	}
	var errs []error
	if o.requests < 2 || o.offset < -1 {
		errs = append(errs, fmt.Errorf("--requests %d and --offset %d: want at least 2 requests and an offset >= -1", o.requests, o.offset))
	}
	if !(o.load > 0) || !(o.speed > 0) || o.load > 100 || o.speed > 1000 {
		errs = append(errs, fmt.Errorf("--load %v and --speed %v: want positive numbers (load <= 100, speed <= 1000)", o.load, o.speed))
	}
	if o.regions < 1 || o.perRegion < 1 || o.regions*o.perRegion > 32 {
		errs = append(errs, fmt.Errorf("--regions %d x --engines-per-region %d: want at least 1 each and at most 32 engines", o.regions, o.perRegion))
	}
	if !(o.rttMillis >= 1) {
		errs = append(errs, fmt.Errorf("--rtt %v: want at least 1 ms", o.rttMillis))
	}
	if o.scope != "global" && o.scope != "region" {
		errs = append(errs, fmt.Errorf("--baseline-scope %q: want global or region", o.scope))
	}
	if o.repeats < 1 || o.repeats > 9 {
		errs = append(errs, fmt.Errorf("--repeats %d: want 1 to 9", o.repeats))
	}
	if o.timeout < time.Second {
		errs = append(errs, fmt.Errorf("--timeout %v: want at least 1s", o.timeout))
	}
	if err := o.slo.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return o, errors.Join(errs...)
	}
	if !filepath.IsAbs(o.tracePath) {
		root, err := stack.RepoRoot()
		if err != nil {
			return o, err
		}
		o.tracePath = filepath.Join(root, o.tracePath)
	}
	return o, nil
}

// progress writes a line to w unless quiet.
type progress struct {
	w     io.Writer
	quiet bool
	start time.Time
}

func (p progress) printf(format string, args ...any) {
	if !p.quiet {
		fmt.Fprintf(p.w, "benchfleet [%5.1fs]: %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
	}
}
