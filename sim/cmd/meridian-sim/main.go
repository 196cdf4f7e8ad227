// Command meridian-sim replays an LLM request trace against a simulated multi-region fleet
// of vLLM-like engines and compares routing policies on the same arrivals. See --help.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/control/optimizer"
	"github.com/meridian-router/meridian/control/signals"
	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

type options struct {
	scan       []float64
	seeds      int
	cpuProfile string
	tracePath  string
	format     string
	load       float64
	scenarios  []sim.Scenario
	policies   []string
	out        string
	perRegion  int
	seed       uint64
	retries    int
	sample     float64
	first      int
	arrivals   string
	kvTokens   int
	quiet      bool
	commandRec string

	gpu           string
	deployments   []sim.Deployment
	replicas      int
	kvDelay       time.Duration
	shedBacklog   time.Duration
	sidecar       *server.Config
	moveCost      *float64
	minShare      *float64
	cacheHalfLife *time.Duration
	rhoMax        *float64
	slo           sim.SLO
	capacity      bool
	target        float64
	precision     float64
	stopBelow     float64
	belowCapacity float64
	startLoad     float64
	maxRuns       int
	workers       int
}

const usage = `Usage: meridian-sim --trace FILE [flags]

Replays a request trace (Mooncake JSONL or Azure CSV) on a simulated fleet of 3 regions x N
vLLM-like engines (sim/engine, calibrated to Llama-3.1-8B on an A100) on virtual time, once
per routing policy, on the same arrivals. --load sets the offered load as a fraction of the
fleet's cold capacity (engines / mean service time of the trace's requests with no cache hit).

Scenarios (changes start at 1/3 of the run and end at 2/3):
  steady       the trace as is
  step         demand entering region 0 doubles
  outage       region 0's engines go down, then come back with empty caches
  slow-engine  engine 0 becomes 5x slower (from 1/3 on)
  overload     offered load is 1.5x capacity (ignores --load)

Deployment: every policy but meridian's runs as its users deploy it. --deployment region
(the default) gives each region its own router pool over that region's engines only, with
--replicas replicas each keeping its own state; a request goes to a random replica of its
region. --deployment global is one pool over all engines with one replica. meridian is one
control server with --replicas sidecars per region under either; a region's sidecars send
each other their requests in flight every peers.interval (10ms), as they do in production.

--policies oracle adds a reference that no one can deploy (sim/oracle.go): a router that
knows every engine's cache and prefill queue the instant they change. Run it with
--replicas 1 --kv-event-delay 0; a target above its capacity is out of any router's reach.

Output (--out DIR): results.json (one object per policy), report.md (a table), ttft_cdf.png
and weights.png; with several scenarios, one subdirectory each and a combined report.md.
results.json's home_retention says how much of a prompt the engine its routing key last
went to still held, by how much that engine had written into its KV cache since;
queued_on_arrival counts the requests sent to an engine that could not start them then (a
request waiting ahead, or no room for their KV blocks), and queued_on_arrival_missed those
of them that missed the SLO.

--scan 0.60,0.64,0.68 --seeds 4 instead runs every policy at each load, once per seed (a
seed redraws the regions conversations enter through), --workers runs at a time, and prints
the mean SLO attainment / KV hit rate per load and over all runs (scan.json and scan.md with
--out): what compares two builds or two settings, whose difference is often under a capacity
search's step.

--capacity instead searches, for each policy and each --deployment (comma-separated), the
highest offered rate at which --slo-target of the requests meet the SLO (TTFT <= --slo-ttft
+ --slo-ttft-per-token x prompt tokens, mean inter-token latency <= --slo-itl; shed and
failed requests miss), by doubling/halving the rate to a bracket, then narrowing it where
the attainment crosses the target, --workers runs at a
time, and writes capacity.json, capacity.md, capacity_slo.png and capacity_ttft.png. With
--seeds N each rate tried is run once per seed and judged by all their requests together:
one seed's attainment near the capacity moves by more than a search step from seed to seed.

Flags:
`

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("meridian-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	var o options
	var scenarios, policies string
	fs.StringVar(&o.tracePath, "trace", "", "trace file (Mooncake JSONL or Azure CSV); required")
	fs.StringVar(&o.format, "format", "auto", "trace format: auto, mooncake, azure or sessions (AIPerf multi-turn sessions)")
	fs.Float64Var(&o.load, "load", 0.8, "offered load as a fraction of fleet capacity")
	fs.StringVar(&scenarios, "scenario", "steady", "comma-separated scenarios, or all: "+joinScenarios())
	fs.StringVar(&policies, "policies", strings.Join(sim.PolicyNames, ","), "comma-separated policies to compare")
	fs.StringVar(&o.out, "out", "", "directory for results.json, report.md and plots (none: table on stdout only)")
	fs.IntVar(&o.perRegion, "engines-per-region", 4, "engines in each of the 3 regions")
	fs.Uint64Var(&o.seed, "seed", 1, "seed for region assignment and scenario extras")
	fs.IntVar(&o.retries, "retries", 1, "retries a baseline proxy makes on another engine after a failure")
	fs.Float64Var(&o.sample, "sample", 1, "keep each trace request with this probability (before rescaling to --load)")
	fs.IntVar(&o.first, "first", 0, "use only the first N requests of the trace (0: all)")
	fs.StringVar(&o.arrivals, "arrivals", "", "another trace (Mooncake JSONL or Azure CSV) whose arrival times the trace's requests take, in order, before --load rescales them: one trace's requests on another's bursts")
	fs.IntVar(&o.kvTokens, "kv-tokens", 0, "KV cache per engine in tokens (0: the --gpu calibration's figure)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress on stderr")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a Go CPU profile of the whole run to this file (go tool pprof reads it)")
	fs.StringVar(&o.gpu, "gpu", "a100-40gb", "engine calibration: "+strings.Join(engine.GPUs, " or "))
	var deployments string
	fs.StringVar(&deployments, "deployment", string(sim.DeployRegion), "router deployment: region or global (--capacity: a comma-separated list)")
	fs.IntVar(&o.replicas, "replicas", 4, "router replicas (and meridian sidecars) per region pool")
	fs.DurationVar(&o.shedBacklog, "shed-backlog", 0, "meridian's control server --shed-backlog: shed only while the engines queue this much work (0: whenever the plan sheds, the default)")
	var sidecarPath string
	var moveCost, minShare, rhoMax float64
	fs.StringVar(&sidecarPath, "sidecar-config", "", "meridian's sidecar configuration: a YAML file in meridian-sidecar's --config schema (docs/configuration.md) for both meridian policies, in place of the shipped defaults (the picker's bucket count stays the simulator's; its key ladder runs from affinity_blocks to max_blocks blocks of block_bytes; the first rung is also the fixed key of every baseline that hashes on a prefix)")
	fs.Float64Var(&moveCost, "move-cost", optimizer.DefaultConfig().Params.MoveCost, "meridian's control server --move-cost for both meridian policies; unset, the shipped default shown (meridian-defaults) or the fleet tuning's (meridian: half the trace's cold engine time)")
	fs.Float64Var(&minShare, "min-share-change", optimizer.DefaultConfig().MinShareChange, "meridian's control server --min-share-change for both meridian policies; unset, as --move-cost")
	fs.Float64Var(&rhoMax, "rho-max", optimizer.DefaultConfig().Params.RhoMax, "meridian's control server --rho-max for both meridian policies; unset, as --move-cost")
	var cacheHalfLife time.Duration
	fs.DurationVar(&cacheHalfLife, "cache-half-life", signals.DefaultConfig().CacheHalfLife, "meridian's control server --cache-half-life for both meridian policies; unset, the shipped default shown")
	fs.DurationVar(&o.kvDelay, "kv-event-delay", 50*time.Millisecond, "time from an engine's KV-cache event to the routers subscribed to it")
	def := sim.DefaultSLO()
	fs.DurationVar(&o.slo.TTFTBase, "slo-ttft", def.TTFTBase, "SLO: fixed TTFT allowance")
	fs.DurationVar(&o.slo.TTFTPerToken, "slo-ttft-per-token", def.TTFTPerToken, "SLO: TTFT allowance per prompt token")
	fs.DurationVar(&o.slo.MaxITL, "slo-itl", def.MaxITL, "SLO: mean inter-token latency bound")
	fs.BoolVar(&o.capacity, "capacity", false, "search each policy's capacity at the SLO instead of running --load")
	fs.Float64Var(&o.target, "slo-target", 0.9, "--capacity: fraction of requests that must meet the SLO")
	fs.Float64Var(&o.precision, "capacity-precision", 0.03, "--capacity: relative width at which a search stops")
	fs.Float64Var(&o.stopBelow, "capacity-stop", 0.5, "--capacity: a run stops once its SLO attainment is certain to be below this (at most --slo-target)")
	fs.Float64Var(&o.startLoad, "capacity-start", 0.5, "--capacity: first rate tried, as a fraction of cold capacity")
	fs.IntVar(&o.maxRuns, "capacity-runs", 12, "--capacity: most runs per search")
	fs.Float64Var(&o.belowCapacity, "capacity-below", 0.9, "--capacity: one more run per search at this fraction of the capacity found, for its shedding there (0: none)")
	fs.IntVar(&o.workers, "workers", 2, "--capacity and --scan: runs at a time")
	var scan string
	fs.StringVar(&scan, "scan", "", "comma-separated loads: run every policy at each, once per seed of --seeds, and print the mean SLO attainment / KV hit rate per load (with --out: scan.json and scan.md), instead of one run at --load")
	fs.IntVar(&o.seeds, "seeds", 1, "--scan: seeds per load, from --seed up; --capacity: runs per rate tried, one per seed from --seed up, their requests pooled")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.tracePath == "" {
		return o, errors.New("--trace is required")
	}
	var err error
	if o.scenarios, err = parseScenarios(scenarios); err != nil {
		return o, err
	}
	for _, p := range strings.Split(policies, ",") {
		if p = strings.TrimSpace(p); p != "" {
			o.policies = append(o.policies, p)
		}
	}
	if !(o.sample > 0 && o.sample <= 1) {
		return o, fmt.Errorf("--sample %v must be in (0, 1]", o.sample)
	}
	if !contains(engine.GPUs, o.gpu) {
		return o, fmt.Errorf("--gpu %q is not one of %s", o.gpu, strings.Join(engine.GPUs, ", "))
	}
	for _, d := range strings.Split(deployments, ",") {
		dep := sim.Deployment(strings.TrimSpace(d))
		if !contains(sim.Deployments, dep) {
			return o, fmt.Errorf("--deployment: %q is not region or global", dep)
		}
		if !contains(o.deployments, dep) {
			o.deployments = append(o.deployments, dep)
		}
	}
	if len(o.deployments) > 1 && !o.capacity {
		return o, errors.New("--deployment takes several values only with --capacity")
	}
	if o.shedBacklog < 0 {
		return o, fmt.Errorf("--shed-backlog %v must be >= 0", o.shedBacklog)
	}
	if sidecarPath != "" {
		c, err := server.LoadConfig(sidecarPath, slog.New(slog.DiscardHandler))
		if err != nil {
			return o, fmt.Errorf("--sidecar-config: %w", err)
		}
		o.sidecar = &c
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "move-cost":
			o.moveCost = &moveCost
		case "min-share-change":
			o.minShare = &minShare
		case "rho-max":
			o.rhoMax = &rhoMax
		case "cache-half-life":
			o.cacheHalfLife = &cacheHalfLife
		}
	})
	oc := optimizer.DefaultConfig()
	oc.Params.MoveCost, oc.MinShareChange, oc.Params.RhoMax = moveCost, minShare, rhoMax
	if err := oc.Validate(); err != nil {
		return o, fmt.Errorf("--move-cost, --min-share-change or --rho-max: %w", err)
	}
	sc := signals.DefaultConfig()
	sc.CacheHalfLife = cacheHalfLife
	if err := sc.Validate(); err != nil {
		return o, fmt.Errorf("--cache-half-life: %w", err)
	}
	if o.replicas < 1 {
		return o, fmt.Errorf("--replicas %d must be at least 1", o.replicas)
	}
	if o.capacity && len(o.scenarios) > 1 {
		return o, errors.New("--capacity measures one scenario at a time")
	}
	for _, f := range strings.Split(scan, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		l, err := strconv.ParseFloat(f, 64)
		if err != nil || !(l > 0) || math.IsInf(l, 0) {
			return o, fmt.Errorf("--scan: %q is not a positive load", f)
		}
		o.scan = append(o.scan, l)
	}
	if scan != "" && len(o.scan) == 0 {
		return o, errors.New("--scan: no loads")
	}
	if len(o.scan) > 0 && (o.capacity || len(o.scenarios) > 1 || len(o.deployments) > 1) {
		return o, errors.New("--scan runs one scenario under one deployment, without --capacity")
	}
	if o.seeds < 1 {
		return o, fmt.Errorf("--seeds %d must be at least 1", o.seeds)
	}
	if o.seeds > 1 && len(o.scan) == 0 && !o.capacity {
		return o, errors.New("--seeds applies to --scan and --capacity; a single run uses --seed")
	}
	if o.workers < 1 {
		return o, fmt.Errorf("--workers %d must be at least 1", o.workers)
	}
	o.commandRec = "meridian-sim " + strings.Join(args, " ")
	return o, nil
}

func joinScenarios() string {
	var s []string
	for _, sc := range sim.Scenarios {
		s = append(s, string(sc))
	}
	return strings.Join(s, ", ")
}

func parseScenarios(s string) ([]sim.Scenario, error) {
	if s == "all" {
		return sim.Scenarios, nil
	}
	var out []sim.Scenario
	for _, name := range strings.Split(s, ",") {
		sc := sim.Scenario(strings.TrimSpace(name))
		if !contains(sim.Scenarios, sc) {
			return nil, fmt.Errorf("--scenario: %q is not one of %s", sc, joinScenarios())
		}
		out = append(out, sc)
	}
	return out, nil
}

func contains[T comparable](list []T, v T) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "meridian-sim:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "meridian-sim: --cpuprofile:", err)
			os.Exit(2)
		}
		defer f.Close()
	}
	err = run(ctx, o, os.Stdout, os.Stderr)
	if o.cpuProfile != "" {
		pprof.StopCPUProfile() // an interrupted run's profile too
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "meridian-sim:", err)
		os.Exit(1)
	}
}

func loadTrace(o options) ([]trace.Request, error) {
	f, err := trace.ParseFormat(o.format)
	if err != nil {
		return nil, fmt.Errorf("--format: %w", err)
	}
	reqs, err := trace.ReadFile(o.tracePath, f)
	if err != nil {
		return nil, err
	}
	reqs = trace.First(reqs, o.first)
	if o.sample < 1 {
		if reqs, err = trace.Sample(reqs, o.sample, o.seed); err != nil {
			return nil, err
		}
	}
	if o.arrivals != "" {
		times, err := trace.ReadFile(o.arrivals, trace.FormatAuto)
		if err != nil {
			return nil, fmt.Errorf("--arrivals: %w", err)
		}
		if reqs, err = trace.WithArrivalsOf(reqs, times); err != nil {
			return nil, fmt.Errorf("--arrivals %s: %w", o.arrivals, err)
		}
	}
	return reqs, nil
}

// baseConfig is the simulation the options describe, over the trace's requests on engines
// configured by ecfg, for the first scenario and deployment.
func baseConfig(o options, reqs []trace.Request, ecfg engine.Config) sim.Config {
	base := sim.Config{Trace: reqs, Regions: sim.DefaultRegions, EnginesPerRegion: o.perRegion,
		RTT: sim.DefaultRTT(), Engine: ecfg, Load: o.load, Scenario: o.scenarios[0], Policies: o.policies,
		Seed: o.seed, Retries: o.retries, Deployment: o.deployments[0],
		Replicas: o.replicas, KVEventDelay: o.kvDelay, SLO: o.slo, ShedBacklog: o.shedBacklog,
		Sidecar: o.sidecar, MoveCost: o.moveCost, MinShareChange: o.minShare, RhoMax: o.rhoMax, CacheHalfLife: o.cacheHalfLife}
	if base.Deployment == sim.DeployGlobal {
		base.Replicas = 1
	}
	return base
}

func run(ctx context.Context, o options, stdout, stderr io.Writer) error {
	reqs, err := loadTrace(o)
	if err != nil {
		return err
	}
	ecfg, err := engine.Calibrated(o.gpu, trace.BlockTokens)
	if err != nil {
		return err
	}
	if o.kvTokens > 0 {
		ecfg.KVBlocks = o.kvTokens / trace.BlockTokens
	}
	base := baseConfig(o, reqs, ecfg)
	if o.capacity {
		return runCapacity(ctx, o, base, stdout, stderr)
	}
	if len(o.scan) > 0 {
		return runScan(ctx, o, base, stdout, stderr)
	}
	var all []scenarioResult
	for _, sc := range o.scenarios {
		cfg := base
		cfg.Scenario = sc
		start := time.Now()
		res, w, err := sim.Run(ctx, &cfg, progressLine(stderr, sc, o.quiet), 500*time.Millisecond)
		if !o.quiet {
			fmt.Fprintln(stderr)
		}
		if err != nil {
			return fmt.Errorf("scenario %s: %w", sc, err)
		}
		r := scenarioResult{scenario: sc, results: res, workload: w, cfg: &cfg, wall: time.Since(start)}
		all = append(all, r)
		fmt.Fprint(stdout, sim.Table(res, w))
		if o.out != "" {
			dir := o.out
			if len(o.scenarios) > 1 {
				dir = filepath.Join(o.out, string(sc))
			}
			if err := sim.WriteOutputs(dir, res, w, &cfg, o.commandRec, r.wall); err != nil {
				return err
			}
		}
	}
	if o.out != "" && len(all) > 1 {
		return writeSummary(o, all)
	}
	return nil
}

type scenarioResult struct {
	scenario sim.Scenario
	results  []sim.Result
	workload *sim.Workload
	cfg      *sim.Config
	wall     time.Duration
}

func progressLine(w io.Writer, sc sim.Scenario, quiet bool) func(sim.Progress) {
	if quiet {
		return nil
	}
	start := time.Now()
	return func(p sim.Progress) {
		pct := 100 * float64(p.Done) / float64(max(p.Total, 1))
		fmt.Fprintf(w, "\r%-11s %5.1f%% of %v virtual, %v elapsed   ", sc, pct,
			p.Total.Round(time.Second), time.Since(start).Round(100*time.Millisecond))
	}
}

// writeSummary writes the combined report of several scenarios.
func writeSummary(o options, all []scenarioResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# meridian-sim results\n\nCommand: `%s`\n\n", o.commandRec)
	fmt.Fprintf(&b, "%s\n", sim.Describe(all[0].workload, all[0].cfg))
	byScenario := map[sim.Scenario][]sim.Result{}
	for _, r := range all {
		byScenario[r.scenario] = r.results
	}
	if ts := sim.Targets(byScenario); len(ts) > 0 {
		fmt.Fprintf(&b, "## Targets\n\n%s\n", sim.TargetTable(ts))
	}
	for _, r := range all {
		fmt.Fprintf(&b, "## %s (%.2f x capacity, %v of wall time)\n", r.scenario, r.workload.Load, r.wall.Round(time.Second))
		b.WriteString(sim.Table(r.results, r.workload))
		fmt.Fprintf(&b, "\nPlots: [TTFT CDF](%s/ttft_cdf.png), [weights](%s/weights.png).\n\n", r.scenario, r.scenario)
	}
	path := filepath.Join(o.out, "report.md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// runCapacity runs the capacity search and writes its outputs.
func runCapacity(ctx context.Context, o options, base sim.Config, stdout, stderr io.Writer) error {
	cc := sim.DefaultCapacityConfig(base)
	cc.Policies, cc.Deployments, cc.Replicas = o.policies, o.deployments, o.replicas
	cc.Target, cc.Precision, cc.StartLoad, cc.MaxRuns, cc.Workers = o.target, o.precision, o.startLoad, o.maxRuns, o.workers
	cc.StopBelow, cc.BelowCapacity, cc.Seeds = o.stopBelow, o.belowCapacity, o.seeds
	if err := cc.Validate(); err != nil {
		return err
	}
	w, err := sim.BuildWorkload(&base)
	if err != nil {
		return err
	}
	var progress func(sim.CapacityProgress)
	if !o.quiet {
		fmt.Fprintf(stderr, "capacity search: %d policies x %d deployments, at most %d rates each, %d seed(s) a rate, %d runs at a time\n",
			len(cc.Policies), len(cc.Deployments), cc.MaxRuns, cc.Seeds, cc.Workers)
		progress = func(p sim.CapacityProgress) {
			verdict := "miss"
			if p.Point.Pass {
				verdict = "pass"
			}
			att := fmt.Sprintf("%.3f", p.Point.SLOAttainment)
			if p.Point.Stopped {
				att = fmt.Sprintf("< %.2f (stopped)", cc.StopBelow)
			}
			fmt.Fprintf(stderr, "[run %3d, %d/%d searches done, %v] %-18s %-6s %7.3f req/s (%.3f x cold): attainment %s, %s, in %v\n",
				p.Done, p.SearchesDone, p.SearchesOf, p.Elapsed.Round(time.Second), p.Policy, p.Deployment,
				p.Point.OfferedRPS, p.Point.Load, att, verdict, p.RunWall.Round(100*time.Millisecond))
		}
	}
	start := time.Now()
	caps, err := sim.RunCapacity(ctx, cc, progress)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, sim.CapacityTable(caps))
	if o.out != "" {
		return sim.WriteCapacity(o.out, caps, &cc, w, o.commandRec, time.Since(start))
	}
	return nil
}

// runScan runs a fixed-load scan and writes its outputs.
func runScan(ctx context.Context, o options, base sim.Config, stdout, stderr io.Writer) error {
	sc := sim.ScanConfig{Base: base, Loads: o.scan, Workers: o.workers}
	for i := range o.seeds {
		sc.Seeds = append(sc.Seeds, o.seed+uint64(i))
	}
	var progress func(sim.ScanProgress)
	if !o.quiet {
		fmt.Fprintf(stderr, "scan: %d policies x %d loads x %d seeds, %d at a time\n",
			len(base.Policies), len(sc.Loads), len(sc.Seeds), sc.Workers)
		progress = func(p sim.ScanProgress) {
			fmt.Fprintf(stderr, "[run %3d/%d, %v] %-18s load %.4g seed %d: attainment %.3f, KV hit %.3f, %d shed\n",
				p.Done, p.Total, p.Elapsed.Round(time.Second), p.Point.Policy, p.Point.Load, p.Point.Seed,
				p.Point.SLOAttainment, p.Point.KVHitRate, p.Point.Shed)
		}
	}
	start := time.Now()
	points, err := sim.RunScan(ctx, sc, progress)
	if err != nil {
		return err
	}
	table := sim.ScanTable(points)
	fmt.Fprint(stdout, table)
	if o.out == "" {
		return nil
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", o.out, err)
	}
	data, err := json.MarshalIndent(points, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "scan.json"), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write scan.json: %w", err)
	}
	md := fmt.Sprintf("# meridian-sim: fixed-load scan\n\nCommand: `%s` (%v of wall time on this machine, %d runs at a time).\n\n"+
		"SLO attainment / KV hit rate, the mean over seeds %d to %d at each load (x cold capacity), and over every run.\n\n%s",
		o.commandRec, time.Since(start).Round(time.Second), sc.Workers, sc.Seeds[0], sc.Seeds[len(sc.Seeds)-1], table)
	if err := os.WriteFile(filepath.Join(o.out, "scan.md"), []byte(md), 0o644); err != nil {
		return fmt.Errorf("write scan.md: %w", err)
	}
	return nil
}
