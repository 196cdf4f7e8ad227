package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/examples/loadgen/load"
	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/sim/trace"
)

const model = "meridian-demo"

// Engine latencies: short and fixed, so runs are quick and figures comparable.
const (
	engineTTFT = 30 * time.Millisecond
	engineITL  = 5 * time.Millisecond
)

// node is the one data-plane node of every chaos stack.
const node = "region-a"

// binaries builds the project's executables once per test binary; TestMain removes them.
var binaries = sync.OnceValues(func() (stack.Binaries, error) {
	dir, err := os.MkdirTemp("", "meridian-chaos-bin-")
	if err != nil {
		return stack.Binaries{}, err
	}
	return stack.Build(dir)
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bins, err := binaries(); err == nil {
		os.RemoveAll(strings.TrimSuffix(bins.Control, "meridian-control"))
	}
	os.Exit(code)
}

// engineSpec is n engines e0..e(n-1) in region a with the suite's fixed latencies.
func engineSpec(n int, extra ...string) []stack.EngineSpec {
	out := make([]stack.EngineSpec, n)
	for i := range out {
		args := append([]string{"--ttft", engineTTFT.String(), "--itl", engineITL.String()}, extra...)
		out[i] = stack.EngineSpec{Name: fmt.Sprintf("e%d", i), Region: "a", Models: []string{model}, Args: args}
	}
	return out
}

// oneNode is a stack of one node and n engines; weights nil means proportional to capacity.
func oneNode(n int, weights map[string]uint32) stack.Spec {
	spec := stack.Spec{Nodes: []stack.NodeSpec{{Name: node, Region: "a"}}, Engines: engineSpec(n)}
	if weights != nil {
		spec.Weights = map[string]map[string]uint32{node: weights}
	}
	return spec
}

// evenThree is the usual chaos stack: three engines under equal static weights (the
// optimizer leaves them alone) and a planned capacity of 25 req/s each.
func evenThree() stack.Spec {
	return withCapacity(oneNode(3, map[string]uint32{"e0": 1, "e1": 1, "e2": 1}), 25)
}

// withCapacity sets every engine's capacity_rps, which the control server's LP plans with.
func withCapacity(spec stack.Spec, rps float64) stack.Spec {
	for i := range spec.Engines {
		spec.Engines[i].CapacityRPS = rps
	}
	return spec
}

// startStack brings up spec; the logs of a failed test are kept and their place printed.
func startStack(t *testing.T, spec stack.Spec) *stack.Stack {
	t.Helper()
	stack.RequireEnvoy(t)
	bins, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	return stack.StartT(t, bins, spec)
}

// loadSpec is one open-loop run through a node's Envoy.
type loadSpec struct {
	Rate     float64
	Duration time.Duration
	Output   int  // tokens per response
	Groups   int  // prompts come from this many fixed prompts; 0: every prompt unique
	Stream   bool // SSE, so TTFT is measured
	Header   http.Header
	Seed     uint64
}

// loadRun is a load running in the background.
type loadRun struct {
	reqs    []trace.Request
	start   time.Time
	done    chan struct{}
	summary load.Summary
	results []load.Result // by index
	err     error
}

// startLoad starts spec against url and returns at once; wait collects it.
func startLoad(t *testing.T, url string, spec loadSpec) *loadRun {
	t.Helper()
	syn, err := trace.NewSynthesizer(256, spec.Seed+1)
	if err != nil {
		t.Fatal(err)
	}
	ol := load.OpenLoop{Rate: spec.Rate, Duration: spec.Duration, Seed: spec.Seed,
		PromptTokens: 2 * trace.BlockTokens, OutputTokens: spec.Output}
	if spec.Groups > 0 {
		ol.PrefixGroups, ol.PrefixBlocks = spec.Groups, 2 // the whole prompt is the group's
	}
	if err := ol.Validate(); err != nil {
		t.Fatal(err)
	}
	r := &loadRun{reqs: slices.Collect(ol.Requests()), done: make(chan struct{})}
	results := make([]load.Result, len(r.reqs))
	runner, err := load.NewRunner(load.Config{
		BaseURL: url, Endpoint: load.Chat, Model: model, Stream: spec.Stream, Header: spec.Header,
		Concurrency: 256, Timeout: 15 * time.Second, Duration: spec.Duration, Synth: syn,
		OnResult: func(res load.Result) { results[res.Index] = res },
	})
	if err != nil {
		t.Fatal(err)
	}
	r.start = time.Now()
	go func() {
		defer close(r.done)
		r.summary, r.err = runner.Run(context.Background(), slices.Values(r.reqs))
		r.results = results[:r.summary.Requests]
	}()
	return r
}

// sleepTo sleeps until d after the start of the load.
func (r *loadRun) sleepTo(d time.Duration) { time.Sleep(time.Until(r.start.Add(d))) }

// wait returns the summary and every result, by index.
func (r *loadRun) wait(t *testing.T) (load.Summary, []load.Result) {
	t.Helper()
	<-r.done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.summary, r.results
}

// group is the prefix group of request i (its first hash id).
func (r *loadRun) group(i int) uint64 {
	if len(r.reqs[i].HashIDs) == 0 {
		return 0
	}
	return r.reqs[i].HashIDs[0]
}

// failed lists the results that are neither ok nor shed, for the failure message.
func failed(results []load.Result) []string {
	var out []string
	for _, r := range results {
		if r.Class != load.ClassOK && r.Class != load.ClassShed {
			out = append(out, fmt.Sprintf("#%d at %s: %s %s", r.Index, r.Start.Round(time.Millisecond), r.Class, r.Detail))
		}
	}
	return out
}

// accessLog waits until the node's access log holds at least n entries (or 5 s pass).
func accessLog(t *testing.T, s *stack.Stack, n int) []stack.AccessEntry {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		entries, err := stack.ReadAccessLog(s.Nodes[node].AccessLog)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) >= n || time.Now().After(deadline) {
			return entries
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// between returns the generation entries that started in [from, to).
func between(entries []stack.AccessEntry, from, to time.Time) []stack.AccessEntry {
	var out []stack.AccessEntry
	for _, e := range entries {
		if strings.HasPrefix(e.Path, "/v1/") && !e.Start.Before(from) && e.Start.Before(to) {
			out = append(out, e)
		}
	}
	return out
}

// primaryShare is the fraction of entries whose sidecar-chosen primary is addr.
func primaryShare(entries []stack.AccessEntry, addr string) float64 {
	if len(entries) == 0 {
		return 0
	}
	n := 0
	for _, e := range entries {
		if e.Primary() == addr {
			n++
		}
	}
	return float64(n) / float64(len(entries))
}

// steeredShare is the fraction of entries the sidecar steered.
func steeredShare(entries []stack.AccessEntry) float64 {
	if len(entries) == 0 {
		return 0
	}
	n := 0
	for _, e := range entries {
		if e.Primary() != "" {
			n++
		}
	}
	return float64(n) / float64(len(entries))
}

// figure records a measured figure in the test log and, with MERIDIAN_CHAOS_FIGURES set,
// as a JSON line in that file.
func figure(t *testing.T, name string, value any) {
	t.Helper()
	t.Logf("figure %s = %v", name, value)
	path := os.Getenv("MERIDIAN_CHAOS_FIGURES")
	if path == "" {
		return
	}
	line, err := json.Marshal(map[string]any{"test": t.Name(), "figure": name, "value": value})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
}

// round2 keeps figures readable.
func round2(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }

// penaltySampler polls the sidecar's penalty factors until stopped and keeps each engine's
// lowest, so a test sees transient penalties, not only the final ones.
type penaltySampler struct {
	stop chan struct{}
	done chan map[string]float64
}

func samplePenalties(s *stack.Stack, every time.Duration) *penaltySampler {
	p := &penaltySampler{stop: make(chan struct{}), done: make(chan map[string]float64, 1)}
	go func() {
		low := map[string]float64{}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				p.done <- low
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			m, err := s.SidecarMetrics(ctx, node)
			cancel()
			if err != nil {
				continue // the sidecar may be down on purpose
			}
			for e, f := range m.ByLabel("meridian_sidecar_engine_penalty", "engine") {
				if v, ok := low[e]; !ok || f < v {
					low[e] = f
				}
			}
		}
	}()
	return p
}

// lowest stops the sampler and returns each engine's lowest factor seen.
func (p *penaltySampler) lowest() map[string]float64 {
	close(p.stop)
	return <-p.done
}

// atPenaltyFloor returns when, after from, the engine at addr first drew no more than
// about the outlier penalty floor's share of primaries in a 1 s window of at least minLogged
// requests (one engine of three, the other two unpenalized).
func atPenaltyFloor(entries []stack.AccessEntry, from time.Time, addr string, minLogged int) (time.Time, bool) {
	floor := guard.DefaultOutlierConfig().MinFactor
	share := floor / (2 + floor)
	return firstWindow(entries, from, time.Second, func(w []stack.AccessEntry) bool {
		return len(w) >= minLogged && primaryShare(w, addr) <= 2*share+0.05
	})
}
