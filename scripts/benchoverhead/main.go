// Command benchoverhead measures the latency the meridian sidecar adds to a request through
// Envoy. In one run it starts two Envoys over the same mock engines, one with the sidecar
// (ext_proc) and one without, drives both at the same fixed request rates in alternating
// slices, and compares end-to-end latency percentiles. The engines answer at once, so the
// difference is the proxy path: ext_proc round trip, body parse, prefix hash and pick.
//
// The last line of output is a JSON object with the added p50 and p99 per rate.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/examples/loadgen/load"
	"github.com/meridian-router/meridian/sim/trace"
)

type options struct {
	rates   []float64
	slice   time.Duration
	slices  int
	prompt  int
	workers int
	dir     string
}

func main() {
	fs := flag.NewFlagSet("benchoverhead", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: benchoverhead [flags]\n\nMeasures the latency the sidecar adds through a real Envoy, against a plain\nEnvoy over the same engines, in one run. Prints a JSON summary as the last line.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var o options
	rates := fs.String("rates", "200,500", "comma-separated request rates (req/s)")
	fs.DurationVar(&o.slice, "slice", 5*time.Second, "length of one measurement slice")
	fs.IntVar(&o.slices, "slices", 3, "slices per configuration and rate (alternating with and without the sidecar)")
	fs.IntVar(&o.prompt, "prompt-tokens", 256, "prompt size (the sidecar parses and hashes it)")
	fs.IntVar(&o.workers, "envoy-workers", 1, "Envoy worker threads for each Envoy")
	fs.StringVar(&o.dir, "dir", "", "directory for logs (default: a temp dir, removed afterwards)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	for _, r := range strings.Split(*rates, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(r), 64)
		if err != nil || !(v > 0) {
			fmt.Fprintf(os.Stderr, "benchoverhead: --rates: %q is not a positive number\n", r)
			os.Exit(2)
		}
		o.rates = append(o.rates, v)
	}
	if o.slices < 1 || o.slice < time.Second {
		fmt.Fprintln(os.Stderr, "benchoverhead: --slices must be >= 1 and --slice >= 1s")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "benchoverhead:", err)
		os.Exit(1)
	}
}

// RateResult compares the two configurations at one rate. Latencies are in milliseconds.
type RateResult struct {
	Rate          float64 `json:"rate_rps"`
	Requests      int     `json:"requests_per_config"`
	BaselineP50   float64 `json:"baseline_p50_ms"`
	BaselineP99   float64 `json:"baseline_p99_ms"`
	SidecarP50    float64 `json:"sidecar_p50_ms"`
	SidecarP99    float64 `json:"sidecar_p99_ms"`
	AddedP50      float64 `json:"added_p50_ms"`
	AddedP99      float64 `json:"added_p99_ms"`
	BaselineError int     `json:"baseline_errors"`
	SidecarError  int     `json:"sidecar_errors"`
}

func run(ctx context.Context, o options) error {
	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "meridian-benchoverhead-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	bins, err := stack.Build(dir)
	if err != nil {
		return err
	}
	instant := []string{"--ttft", "0s", "--itl", "0s"}
	spec := stack.Spec{
		Dir: dir, Bins: bins, EnvoyConcurrency: o.workers,
		Nodes: []stack.NodeSpec{{Name: "sidecar", Region: "a"}, {Name: "baseline", Region: "a", WithoutSidecar: true}},
		Engines: []stack.EngineSpec{
			{Name: "e0", Region: "a", Models: []string{"bench"}, CapacityRPS: 1000, Args: instant},
			{Name: "e1", Region: "a", Models: []string{"bench"}, CapacityRPS: 1000, Args: instant},
			{Name: "e2", Region: "a", Models: []string{"bench"}, CapacityRPS: 1000, Args: instant},
			{Name: "e3", Region: "a", Models: []string{"bench"}, CapacityRPS: 1000, Args: instant},
		},
		// Both nodes hold the same static weights, so both spread load the same way.
		Weights: map[string]map[string]uint32{
			"sidecar":  {"e0": 1, "e1": 1, "e2": 1, "e3": 1},
			"baseline": {"e0": 1, "e1": 1, "e2": 1, "e3": 1},
		},
	}
	startCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	s, err := stack.Start(startCtx, spec)
	if err != nil {
		return err
	}
	defer s.Close()
	synth, err := trace.NewSynthesizer(256, 1)
	if err != nil {
		return err
	}
	var results []RateResult
	for _, rate := range o.rates {
		lat := map[string][]time.Duration{}
		errs := map[string]int{}
		// Warm both paths (connections, caches) before measuring.
		for _, node := range []string{"sidecar", "baseline"} {
			if _, _, err := slice(ctx, s.Nodes[node].URL, synth, rate, time.Second, o.prompt); err != nil {
				return err
			}
		}
		for i := 0; i < o.slices; i++ {
			order := []string{"sidecar", "baseline"}
			if i%2 == 1 {
				order = []string{"baseline", "sidecar"}
			}
			for _, node := range order {
				fmt.Fprintf(os.Stderr, "benchoverhead: %s at %.0f req/s, slice %d/%d\n", node, rate, i+1, o.slices)
				l, e, err := slice(ctx, s.Nodes[node].URL, synth, rate, o.slice, o.prompt)
				if err != nil {
					return err
				}
				lat[node] = append(lat[node], l...)
				errs[node] += e
			}
		}
		r := RateResult{Rate: rate, Requests: len(lat["sidecar"]), BaselineError: errs["baseline"], SidecarError: errs["sidecar"]}
		r.BaselineP50, r.BaselineP99 = pct(lat["baseline"], 0.5), pct(lat["baseline"], 0.99)
		r.SidecarP50, r.SidecarP99 = pct(lat["sidecar"], 0.5), pct(lat["sidecar"], 0.99)
		r.AddedP50, r.AddedP99 = round3(r.SidecarP50-r.BaselineP50), round3(r.SidecarP99-r.BaselineP99)
		results = append(results, r)
		fmt.Printf("rate %4.0f req/s: baseline p50 %.3f ms p99 %.3f ms | sidecar p50 %.3f ms p99 %.3f ms | added p50 %.3f ms p99 %.3f ms (errors %d/%d)\n",
			rate, r.BaselineP50, r.BaselineP99, r.SidecarP50, r.SidecarP99, r.AddedP50, r.AddedP99, r.BaselineError, r.SidecarError)
	}
	out, err := json.Marshal(map[string]any{"results": results})
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

// slice sends requests at rate for d and returns the end-to-end latencies of the 200s and
// the count of the rest.
func slice(ctx context.Context, url string, synth *trace.Synthesizer, rate float64, d time.Duration, prompt int) ([]time.Duration, int, error) {
	var mu sync.Mutex
	var lat []time.Duration
	errs := 0
	r, err := load.NewRunner(load.Config{
		BaseURL: url, Endpoint: load.Chat, Model: "bench", Concurrency: 256, Timeout: 10 * time.Second,
		Duration: d, Synth: synth,
		OnResult: func(res load.Result) {
			mu.Lock()
			defer mu.Unlock()
			if res.Status == 200 {
				lat = append(lat, res.E2E)
			} else {
				errs++
			}
		},
	})
	if err != nil {
		return nil, 0, err
	}
	sched := load.OpenLoop{Rate: rate, Uniform: true, Duration: d, PromptTokens: prompt, OutputTokens: 1, PrefixGroups: 16, PrefixBlocks: 1}
	if err := sched.Validate(); err != nil {
		return nil, 0, err
	}
	if _, err := r.Run(ctx, sched.Requests()); err != nil {
		return nil, 0, err
	}
	return lat, errs, nil
}

func pct(xs []time.Duration, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return round3(float64(s[int(q*float64(len(s)-1))].Microseconds()) / 1000)
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5*sign(v))) / 1000 }

func sign(v float64) float64 {
	if v < 0 {
		return -1
	}
	return 1
}
