package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/examples/loadgen/load"
	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/sim/trace"
)

// model is the model name every engine serves and every request asks for.
const model = "bench"

// Output is the JSON summary, the last line of output.
type Output struct {
	Trace            string  `json:"trace"`
	Requests         int     `json:"requests"`
	Regions          int     `json:"regions"`
	EnginesPerRegion int     `json:"engines_per_region"`
	BaselineScope    string  `json:"baseline_scope"`
	Speed            float64 `json:"speed"`
	Load             float64 `json:"load"`
	// CapacityRPS (cold) and OfferedRPS are wall-clock rates of the time-scaled run.
	CapacityRPS float64 `json:"capacity_rps"`
	OfferedRPS  float64 `json:"offered_rps"`
	// PrefillShare is the part of a cold request's engine time spent in prefill, given to
	// meridian's fleet file as prefill_share.
	PrefillShare float64 `json:"prefill_share"`
	ReplaySpanS  float64 `json:"replay_span_s"`
	// RTTMs is the injected round trip between two regions (after time scaling).
	RTTMs float64   `json:"rtt_ms"`
	SLO   SLOReport `json:"slo"`
	// KVHitUpperBound is what one infinite cache shared by every engine would hit.
	KVHitUpperBound float64                 `json:"kv_hit_upper_bound"`
	Repeats         int                     `json:"repeats"`
	WallS           float64                 `json:"wall_s"`
	Configs         map[string]ConfigResult `json:"configs"`
	// Ranking orders the configurations by SLO attainment, then TTFT p50.
	Ranking []string `json:"ranking"`
	// Sim is the simulator's prediction for the same subset, fleet and load.
	Sim map[string]SimResult `json:"sim"`
}

// SLOReport states the SLO as applied, after time scaling.
type SLOReport struct {
	TTFTBaseMs     float64 `json:"ttft_base_ms"`
	TTFTPerTokenMs float64 `json:"ttft_per_prompt_token_ms"`
	ITLMeanMs      float64 `json:"itl_mean_ms"`
	TimeScale      float64 `json:"time_scale"`
}

// bench is a running fleet and the configurations over it.
type bench struct {
	o         options
	w         *workload
	s         *stack.Stack
	regions   []string
	engRegion map[string]string
	baselines map[string]map[string]*baselineNode // config -> region -> node
	ports     stack.Ports                         // the baseline Envoys' ports, each once
	synth     *trace.Synthesizer
	prefixLen int
	log       progress
}

func run(ctx context.Context, o options, stderr io.Writer) (*Output, error) {
	t0 := time.Now()
	log := progress{w: stderr, quiet: o.quiet, start: t0}
	w, err := buildWorkload(o)
	if err != nil {
		return nil, err
	}
	log.printf("%d requests over %.1fs (%.2f req/s offered, %.2f x cold capacity %.2f req/s at speed %g), %d regions x %d engines",
		len(w.reqs), w.span.Seconds(), w.offered, o.load, w.capacity, o.speed, o.regions, o.perRegion)
	regions := make([]string, o.regions)
	for i := range regions {
		regions[i] = regionName(i)
	}
	simulated, err := simulate(ctx, o, w.sub, regions)
	if err != nil {
		return nil, err
	}
	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "meridian-benchfleet-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	bins, err := stack.Build(dir)
	if err != nil {
		return nil, err
	}
	b := &bench{o: o, w: w, engRegion: map[string]string{}, baselines: map[string]map[string]*baselineNode{}, log: log}
	if b.synth, err = trace.NewSynthesizer(o.blockBytes, o.seed); err != nil {
		return nil, fmt.Errorf("--block-bytes: %w", err)
	}
	// The client's prefix header covers the sidecar's shallowest key, the first rung of its
	// key ladder: a ring hash hashes on one fixed depth.
	sc := server.DefaultConfig(slog.New(slog.DiscardHandler))
	b.prefixLen = sc.Request.KeyBlocks * sc.Request.BlockBytes
	spec := b.spec(dir, bins)
	startCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if b.s, err = stack.Start(startCtx, spec); err != nil {
		return nil, fmt.Errorf("start the fleet (logs in %s): %w", dir, err)
	}
	defer b.s.Close()
	delay, err := b.s.DelayByRegion(startCtx, b.rtt)
	if err != nil {
		return nil, fmt.Errorf("region delay: %w", err)
	}
	defer delay.Close()
	b.stopMeridian()
	b.prepareBaselines(dir, bins.Envoy)
	defer func() {
		for _, nodes := range b.baselines {
			for _, n := range nodes {
				if n.Envoy == nil {
					continue // never started
				}
				n.Envoy.Stop(2 * time.Second)
			}
		}
	}()

	runs := map[string][]ConfigResult{}
	for rep := range o.repeats {
		order := slices.Clone(o.configs)
		k := rep % len(order)
		order = append(order[k:], order[:k]...)
		for _, c := range order {
			log.printf("repeat %d/%d: %s", rep+1, o.repeats, c)
			r, err := b.runConfig(ctx, c)
			if err != nil {
				return nil, fmt.Errorf("%s (logs in %s): %w", c, dir, err)
			}
			log.printf("%s: sent %d ok %d shed %d failed %d, SLO %.1f%%, TTFT p50 %.0f ms p90 %.0f ms, KV hit %.3f, %.1fs",
				c, r.Sent, r.OK, r.Shed, r.Failed, 100*r.SLOAttainment, r.TTFTP50, r.TTFTP90, r.KVHitRate, r.ReplayS)
			runs[c] = append(runs[c], r)
		}
	}
	out := &Output{Trace: displayPath(o.tracePath), Requests: len(w.reqs), Regions: o.regions, EnginesPerRegion: o.perRegion,
		BaselineScope: o.scope, Speed: o.speed, Load: o.load, CapacityRPS: round3(w.capacity), OfferedRPS: round3(w.offered), PrefillShare: round3(w.prefillShare),
		ReplaySpanS: round3(w.span.Seconds()), RTTMs: round3(o.rttMillis / o.speed), KVHitUpperBound: round3(w.upperBound),
		Repeats: o.repeats, Configs: map[string]ConfigResult{}, Sim: simulated}
	slo := o.slo.Scaled(o.speed)
	out.SLO = SLOReport{TTFTBaseMs: ms(slo.TTFTBase), TTFTPerTokenMs: round3(float64(slo.TTFTPerToken) / float64(time.Millisecond)),
		ITLMeanMs: ms(slo.MaxITL), TimeScale: o.speed}
	for c, rs := range runs {
		out.Configs[c] = median(rs)
	}
	out.Ranking = ranking(out.Configs)
	out.WallS = round3(time.Since(t0).Seconds())
	return out, nil
}

func ms(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }

// displayPath shows a path inside the repository relative to its root.
func displayPath(p string) string {
	if root, err := stack.RepoRoot(); err == nil {
		if rel, err := filepath.Rel(root, p); err == nil && filepath.IsLocal(rel) {
			return rel
		}
	}
	return p
}

func regionName(i int) string { return "region-" + string(rune('a'+i)) }

// spec is the fleet: one meridian node (Envoy + sidecar) per region and the engines, each
// at its cold capacity; the fleet file's RTTs are the injected ones.
func (b *bench) spec(dir string, bins stack.Binaries) stack.Spec {
	spec := stack.Spec{Dir: dir, Bins: bins, RTTMillis: map[string]map[string]float64{}}
	engineArgs := []string{"--latency-multiplier", strconv.FormatFloat(1/b.o.speed, 'g', -1, 64)}
	for i := range b.o.regions {
		r := regionName(i)
		b.regions = append(b.regions, r)
		spec.Nodes = append(spec.Nodes, stack.NodeSpec{Name: r, Region: r})
		for j := range b.o.perRegion {
			name := fmt.Sprintf("%s-%d", r, j)
			b.engRegion[name] = r
			spec.Engines = append(spec.Engines, stack.EngineSpec{Name: name, Region: r, Models: []string{model},
				CapacityRPS: b.o.speed / b.w.coldService, PrefillShare: b.w.prefillShare, Args: engineArgs})
		}
	}
	for _, from := range b.regions {
		spec.RTTMillis[from] = map[string]float64{}
		for _, to := range b.regions {
			spec.RTTMillis[from][to] = float64(b.rtt(from, to)) / float64(time.Millisecond)
		}
	}
	return spec
}

// rtt is the injected round trip from a region's proxy to an engine region: --rtt across
// regions, 1 ms within one, both divided by the speed.
func (b *bench) rtt(from, to string) time.Duration {
	ms := b.o.rttMillis
	if from == to {
		ms = 1
	}
	return time.Duration(ms / b.o.speed * float64(time.Millisecond))
}

func (b *bench) prepareBaselines(dir, envoyBin string) {
	policies := map[string]string{LeastRequest: "LEAST_REQUEST", RingHash: "RING_HASH"}
	for _, c := range b.o.configs {
		lb, ok := policies[c]
		if !ok {
			continue
		}
		b.baselines[c] = map[string]*baselineNode{}
		for _, r := range b.regions {
			var eps []baselineEndpoint
			for _, e := range b.s.Engines {
				prio := 0
				if b.o.scope == "region" && b.engRegion[e.Name] != r {
					prio = 1
				}
				eps = append(eps, baselineEndpoint{Address: e.Address, Priority: prio})
			}
			slices.SortFunc(eps, func(x, y baselineEndpoint) int { return cmp.Compare(x.Address, y.Address) })
			b.baselines[c][r] = newBaselineNode(dir, envoyBin, c, r, lb, eps, &b.ports)
		}
	}
}

// stopMeridian stops the control server, the sidecars and their Envoys.
func (b *bench) stopMeridian() {
	for _, n := range b.s.Nodes {
		n.Envoy.Stop(2 * time.Second)
		n.Sidecar.Stop(2 * time.Second)
	}
	b.s.Control.Stop(2 * time.Second)
}

// startMeridian starts the control server, then each node's sidecar and Envoy, fresh,
// and waits until every node routes.
func (b *bench) startMeridian(ctx context.Context) error {
	if err := b.s.Control.Start(); err != nil {
		return err
	}
	if err := stack.WaitHTTP(ctx, b.s.ControlHTTP+"/healthz", http.StatusOK); err != nil {
		return fmt.Errorf("control server: %w", err)
	}
	for _, r := range b.regions {
		n := b.s.Nodes[r]
		if err := n.Sidecar.Start(); err != nil {
			return err
		}
		if err := n.Envoy.Start(); err != nil {
			return err
		}
	}
	for _, r := range b.regions {
		if err := b.s.WaitNodeReady(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// restartEngines gives every engine an empty cache and zero counters.
func (b *bench) restartEngines(ctx context.Context) error {
	for _, e := range b.s.Engines {
		e.Proc.Stop(2 * time.Second)
		if err := e.Proc.Start(); err != nil {
			return err
		}
	}
	for _, e := range b.s.Engines {
		// The engine itself first (its last --listen, behind the region-delay front), so
		// the front is not asked while the engine is still starting.
		for _, addr := range []string{listenAddr(e.Proc.Args), e.Address} {
			if err := stack.WaitHTTP(ctx, "http://"+addr+"/health", http.StatusOK); err != nil {
				return fmt.Errorf("engine %s: %w", e.Name, err)
			}
		}
	}
	return nil
}

// listenAddr is the value of the last --listen flag in args (a later flag wins).
func listenAddr(args []string) string {
	addr := ""
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--listen" {
			addr = args[i+1]
		}
	}
	return addr
}

// runConfig replays the workload through configuration c on freshly restarted engines.
func (b *bench) runConfig(ctx context.Context, c string) (ConfigResult, error) {
	upCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := b.restartEngines(upCtx); err != nil {
		return ConfigResult{}, err
	}
	urls := map[string]string{}
	if c == Meridian {
		if err := b.startMeridian(upCtx); err != nil {
			return ConfigResult{}, err
		}
		defer b.stopMeridian()
		for _, r := range b.regions {
			urls[r] = b.s.Nodes[r].URL
		}
	} else {
		for _, r := range b.regions {
			n := b.baselines[c][r]
			if err := n.start(upCtx); err != nil {
				return ConfigResult{}, err
			}
			defer n.Envoy.Stop(2 * time.Second)
			urls[r] = n.URL
		}
	}
	attempts, replay, err := b.replay(ctx, urls)
	if err != nil {
		return ConfigResult{}, err
	}
	shown := 0
	for i, a := range attempts {
		if a.done && a.res.Class != load.ClassOK && a.res.Class != load.ClassShed && shown < 3 {
			shown++
			b.log.printf("%s: request %d (%s) failed: %s %s", c, i, a.region, a.res.Class, a.res.Detail)
		}
	}
	scrapeCtx, cancelScrape := context.WithTimeout(ctx, 30*time.Second)
	defer cancelScrape()
	hits, queries := 0.0, 0.0
	for _, e := range b.s.Engines {
		m, err := stack.ScrapeMetrics(scrapeCtx, "http://"+e.Address+"/metrics")
		if err != nil {
			return ConfigResult{}, fmt.Errorf("engine %s metrics: %w", e.Name, err)
		}
		hits += m.Value("vllm:prefix_cache_hits_total")
		queries += m.Value("vllm:prefix_cache_queries_total")
	}
	return score(attempts, b.o.slo.Scaled(b.o.speed), b.engRegion, hits, queries, replay)
}

// replay sends each region's requests to that region's URL, all regions at once, and
// returns every request's outcome in workload order.
func (b *bench) replay(ctx context.Context, urls map[string]string) ([]attempt, time.Duration, error) {
	// Bounded: dispatch ends with the schedule (and at its span plus a second), each
	// request within --timeout, the whole replay within the span plus the timeout and a
	// minute of slack.
	ctx, cancel := context.WithTimeout(ctx, b.w.span+b.o.timeout+time.Minute)
	defer cancel()
	attempts := make([]attempt, len(b.w.reqs))
	perRegion := make([][]int, len(b.regions)) // workload indices by region, in order
	for i, r := range b.w.reqs {
		ri := b.w.regions[i]
		attempts[i] = attempt{req: r, region: b.regions[ri]}
		perRegion[ri] = append(perRegion[ri], i)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(b.regions))
	var mu sync.Mutex
	start := time.Now()
	for ri, region := range b.regions {
		idx := perRegion[ri]
		if len(idx) == 0 {
			continue
		}
		sched := make([]trace.Request, len(idx))
		for j, i := range idx {
			sched[j] = b.w.reqs[i]
		}
		cfg := load.Config{
			BaseURL: urls[region], Endpoint: load.Chat, Model: model, Stream: true, IncludeUsage: true,
			Header:       http.Header{stack.ClientRegionHeader: {region}},
			PrefixHeader: PrefixHeader, PrefixHeaderBytes: b.prefixLen,
			Concurrency: 512, Timeout: b.o.timeout, Duration: b.w.span + time.Second, Synth: b.synth,
			OnResult: func(res load.Result) {
				mu.Lock()
				defer mu.Unlock()
				if res.Index < len(idx) {
					a := &attempts[idx[res.Index]]
					a.res, a.done = res, true
				}
			},
		}
		runner, err := load.NewRunner(cfg)
		if err != nil {
			return nil, 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := runner.Run(ctx, slices.Values(sched))
			if err == nil && s.Interrupted {
				err = fmt.Errorf("%s: the replay was cut short: %w", region, ctx.Err())
			}
			errs[ri] = err
		}()
	}
	wg.Wait()
	replay := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return nil, 0, err
		}
	}
	return attempts, replay, nil
}
