// Command benchoverhead measures the latency the meridian sidecar adds to a request through
// Envoy. In one run it starts three Envoys over the same mock engines: one with the sidecar
// (ext_proc), one without ext_proc, and one with ext_proc to a server that changes nothing
// (nullproc), drives them at the same fixed request rates in rotating slices, and compares
// end-to-end latency percentiles. The engines answer at once, so the differences are the
// proxy path: what ext_proc costs by itself, then the body parse, prefix hash and pick.
//
// The last line of output is a JSON object with the added p50 and p99 per rate.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
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
	rates     []float64
	slice     time.Duration
	slices    int
	prompt    int
	bytes     []int // prompt sizes to run, in turn: 0 is prompt tokens, > 0 that many bytes
	workers   int
	dir       string
	profile   string
	plaintext bool
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
	promptBytes := fs.String("prompt-bytes", "0", "comma-separated prompt sizes, run in turn over the same stack: 0 is --prompt-tokens\ntokens, a positive size is that many bytes of text per prompt (for example 220000, the\nlong prompts of llm-d-router issue #1109): 16 shared prefixes, each request's own suffix")
	fs.IntVar(&o.workers, "envoy-workers", 1, "Envoy worker threads for each Envoy")
	fs.StringVar(&o.profile, "cpu-profile", "", "write a CPU profile of the sidecar during the first measured slice to this file")
	fs.BoolVar(&o.plaintext, "plaintext", false, "run every connection meridian owns without TLS (loopback)")
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
	for _, r := range strings.Split(*promptBytes, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || v < 0 || v > 900_000 {
			fmt.Fprintf(os.Stderr, "benchoverhead: --prompt-bytes: %q must be in [0, 900000] (Envoy's buffer limit is 1 MiB)\n", r)
			os.Exit(2)
		}
		o.bytes = append(o.bytes, v)
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
	// PromptBytes is the prompt size in bytes; 0 for --prompt-tokens prompts.
	PromptBytes   int     `json:"prompt_bytes"`
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
	// The third configuration: Envoy with ext_proc to a server that changes nothing. Its
	// latency over the baseline is what ext_proc costs by itself on this machine; the
	// sidecar's over it is what meridian's decisions add.
	NullP50          float64 `json:"null_extproc_p50_ms"`
	NullP99          float64 `json:"null_extproc_p99_ms"`
	ExtProcAddedP50  float64 `json:"null_extproc_added_p50_ms"`
	MeridianOverNull float64 `json:"sidecar_over_null_extproc_p50_ms"`
	NullError        int     `json:"null_extproc_errors"`
	// CPU per request in microseconds, by process, over each configuration's slices.
	BaselineCPU map[string]float64 `json:"baseline_cpu_us_per_request"`
	SidecarCPU  map[string]float64 `json:"sidecar_cpu_us_per_request"`
	NullCPU     map[string]float64 `json:"null_extproc_cpu_us_per_request"`
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
	nullproc, err := buildNullproc(dir)
	if err != nil {
		return err
	}
	instant := []string{"--ttft", "0s", "--itl", "0s"}
	spec := stack.Spec{
		Dir: dir, Bins: bins, EnvoyConcurrency: o.workers,
		// Mutual TLS on every connection, as `make demo` and the tests run (and the no-op
		// ext_proc server serves it too); --plaintext measures without.
		Plaintext: o.plaintext,
		Nodes: []stack.NodeSpec{{Name: "sidecar", Region: "a"}, {Name: "baseline", Region: "a", WithoutSidecar: true},
			{Name: "noop", Region: "a", SidecarBin: nullproc}},
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
			"noop":     {"e0": 1, "e1": 1, "e2": 1, "e3": 1},
		},
	}
	if o.profile != "" {
		spec.SidecarArgs = []string{"--pprof"}
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
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConns: 256, MaxIdleConnsPerHost: 256, DisableCompression: true}}
	var results []RateResult
	for _, size := range o.bytes {
		prompts := promptSource{synth: synth, tokens: o.prompt}
		if size > 0 {
			prompts.long = longPrefixes(16, size)
		}
		rs, err := runRates(ctx, o, s, client, prompts, size)
		if err != nil {
			return err
		}
		results = append(results, rs...)
	}
	out, err := json.Marshal(map[string]any{"results": results})
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

// runRates measures every rate with one kind of prompt.
func runRates(ctx context.Context, o options, s *stack.Stack, client *http.Client, prompts promptSource, size int) ([]RateResult, error) {
	var results []RateResult
	what := fmt.Sprintf("%d-token prompts", o.prompt)
	if size > 0 {
		what = fmt.Sprintf("%d-byte prompts", size)
	}
	for _, rate := range o.rates {
		lat := map[string][]time.Duration{}
		errs := map[string]int{}
		cpu := map[string]map[string]time.Duration{"sidecar": {}, "baseline": {}, "noop": {}}
		// Warm both paths (connections, caches) before measuring.
		configs := []string{"sidecar", "baseline", "noop"}
		for _, node := range configs {
			if _, _, err := slice(ctx, client, s.Nodes[node].URL, prompts, rate, time.Second); err != nil {
				return nil, err
			}
		}
		for i := 0; i < o.slices; i++ {
			// Rotate the order so that no configuration always runs first after another.
			order := append(slices.Clone(configs[i%len(configs):]), configs[:i%len(configs)]...)
			for _, node := range order {
				fmt.Fprintf(os.Stderr, "benchoverhead: %s at %.0f req/s, %s, slice %d/%d\n", node, rate, what, i+1, o.slices)
				var prof <-chan error
				if o.profile != "" && node == "sidecar" && i == 0 && rate == o.rates[0] && size == o.bytes[0] {
					prof = profileSidecar(ctx, s.Nodes[node].SidecarHTTP, o.slice, o.profile)
				}
				before, cerr := cpuTimes(s, node)
				if cerr != nil {
					return nil, cerr
				}
				l, e, err := slice(ctx, client, s.Nodes[node].URL, prompts, rate, o.slice)
				after, cerr := cpuTimes(s, node)
				if cerr != nil {
					return nil, cerr
				}
				for k, v := range after {
					cpu[node][k] += v - before[k]
				}
				if prof != nil {
					if perr := <-prof; perr != nil {
						return nil, perr
					}
					fmt.Fprintf(os.Stderr, "benchoverhead: sidecar CPU profile in %s (go tool pprof %s)\n", o.profile, o.profile)
				}
				if err != nil {
					return nil, err
				}
				lat[node] = append(lat[node], l...)
				errs[node] += e
			}
		}
		r := RateResult{PromptBytes: size, Rate: rate, Requests: len(lat["sidecar"]), BaselineError: errs["baseline"], SidecarError: errs["sidecar"]}
		r.BaselineP50, r.BaselineP99 = pct(lat["baseline"], 0.5), pct(lat["baseline"], 0.99)
		r.SidecarP50, r.SidecarP99 = pct(lat["sidecar"], 0.5), pct(lat["sidecar"], 0.99)
		r.AddedP50, r.AddedP99 = round3(r.SidecarP50-r.BaselineP50), round3(r.SidecarP99-r.BaselineP99)
		r.NullP50, r.NullP99, r.NullError = pct(lat["noop"], 0.5), pct(lat["noop"], 0.99), errs["noop"]
		r.ExtProcAddedP50, r.MeridianOverNull = round3(r.NullP50-r.BaselineP50), round3(r.SidecarP50-r.NullP50)
		r.BaselineCPU = perRequest(cpu["baseline"], len(lat["baseline"])+errs["baseline"])
		r.SidecarCPU = perRequest(cpu["sidecar"], len(lat["sidecar"])+errs["sidecar"])
		r.NullCPU = perRequest(cpu["noop"], len(lat["noop"])+errs["noop"])
		results = append(results, r)
		fmt.Printf("%s, rate %4.0f req/s: baseline p50 %.3f ms p99 %.3f ms | sidecar p50 %.3f ms p99 %.3f ms | added p50 %.3f ms p99 %.3f ms (errors %d/%d)\n",
			what, rate, r.BaselineP50, r.BaselineP99, r.SidecarP50, r.SidecarP99, r.AddedP50, r.AddedP99, r.BaselineError, r.SidecarError)
		fmt.Printf("           null ext_proc p50 %.3f ms p99 %.3f ms: ext_proc alone adds p50 %.3f ms, the sidecar %.3f ms more (errors %d)\n",
			r.NullP50, r.NullP99, r.ExtProcAddedP50, r.MeridianOverNull, r.NullError)
		fmt.Printf("           CPU µs per request: baseline %s | null ext_proc %s | sidecar %s\n", fmtCPU(r.BaselineCPU), fmtCPU(r.NullCPU), fmtCPU(r.SidecarCPU))
	}
	return results, nil
}

// slice sends requests at rate for d and returns the end-to-end latencies of the 200s and
// the count of the rest. Bodies are built before the clock starts and answers are read
// without parsing, so the client, which shares the machine's cores with the path being
// measured, costs as little as it can.
func slice(ctx context.Context, client *http.Client, url string, prompts promptSource, rate float64, d time.Duration) ([]time.Duration, int, error) {
	sched := load.OpenLoop{Rate: rate, Uniform: true, Duration: d, PromptTokens: prompts.tokens, OutputTokens: 1, PrefixGroups: 16, PrefixBlocks: 1}
	if err := sched.Validate(); err != nil {
		return nil, 0, err
	}
	type call struct {
		at   time.Duration
		body []byte
	}
	var calls []call
	for r := range sched.Requests() {
		body, err := json.Marshal(map[string]any{"model": "bench", "max_tokens": 1,
			"messages": []map[string]string{{"role": "user", "content": prompts.prompt(r, len(calls))}}})
		if err != nil {
			return nil, 0, err
		}
		calls = append(calls, call{r.Arrival, body})
	}
	lat := make([]time.Duration, len(calls))
	failed := make([]bool, len(calls))
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range calls {
		if wait := time.Until(start.Add(c.at)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				wg.Wait()
				return nil, 0, ctx.Err()
			}
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			t0 := time.Now()
			ok := post(rctx, client, url, c.body)
			lat[i], failed[i] = time.Since(t0), !ok
		}()
	}
	wg.Wait()
	var out []time.Duration
	errs := 0
	for i := range calls {
		if failed[i] {
			errs++
		} else {
			out = append(out, lat[i])
		}
	}
	return out, errs, nil
}

// promptSource makes the prompts: the synthesizer's of a number of tokens, or, with long
// set, one of the long shared prefixes followed by the request's own number.
type promptSource struct {
	synth  *trace.Synthesizer
	tokens int
	long   []string
}

func (p promptSource) prompt(r trace.Request, i int) string {
	if len(p.long) == 0 {
		return p.synth.Prompt(r, uint64(i))
	}
	return p.long[i%len(p.long)] + fmt.Sprintf("%08d", i%100_000_000)
}

// longPrefixes are n different texts of size-8 bytes (each request adds 8 digits).
func longPrefixes(n, size int) []string {
	out := make([]string, n)
	for g := range out {
		var b strings.Builder
		b.Grow(size)
		for i := 0; b.Len() < size-8; i++ {
			fmt.Fprintf(&b, "Document %d, paragraph %d: the quick brown fox jumps over the lazy dog. ", g, i)
		}
		out[g] = b.String()[:size-8]
	}
	return out
}

// post sends one chat request and reads the whole answer; true for a 200.
func post(ctx context.Context, client *http.Client, url string, body []byte) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err == nil && resp.StatusCode == http.StatusOK
}

// buildNullproc builds the do-nothing ext_proc server into dir.
func buildNullproc(dir string) (string, error) {
	root, err := stack.RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "nullproc")
	cmd := exec.Command("go", "build", "-o", out, "./scripts/benchoverhead/nullproc")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build nullproc: %w\n%s", err, b)
	}
	return out, nil
}

// cpuTimes is the processor time used so far by the processes one request to node passes
// through (its Envoy, its sidecar if any, the engines) and by this process, which
// generates the load.
func cpuTimes(s *stack.Stack, node string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	n := s.Nodes[node]
	var err error
	if out["envoy"], err = n.Envoy.CPUTime(); err != nil {
		return nil, err
	}
	if n.Sidecar != nil && n.Sidecar.Running() {
		if out["sidecar"], err = n.Sidecar.CPUTime(); err != nil {
			return nil, err
		}
	}
	for _, e := range s.Engines {
		d, err := e.Proc.CPUTime()
		if err != nil {
			return nil, err
		}
		out["engines"] += d
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return nil, fmt.Errorf("own cpu time: %w", err)
	}
	out["loadgen"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return out, nil
}

func perRequest(cpu map[string]time.Duration, requests int) map[string]float64 {
	out := map[string]float64{}
	for k, v := range cpu {
		out[k] = math.Round(float64(v.Microseconds()) / float64(max(requests, 1)))
	}
	return out
}

func fmtCPU(m map[string]float64) string {
	var parts []string
	for _, k := range []string{"envoy", "sidecar", "engines", "loadgen"} {
		if v, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, v))
		}
	}
	return strings.Join(parts, ", ")
}

// profileSidecar records the sidecar's CPU profile for d, in the background.
func profileSidecar(ctx context.Context, base string, d time.Duration, path string) <-chan error {
	done := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, int(d.Seconds())), nil)
		if err != nil {
			done <- err
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- fmt.Errorf("sidecar profile: %w", err)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			done <- fmt.Errorf("sidecar profile: HTTP %d", resp.StatusCode)
			return
		}
		f, err := os.Create(path)
		if err != nil {
			done <- err
			return
		}
		_, err = io.Copy(f, resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		done <- err
	}()
	return done
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
