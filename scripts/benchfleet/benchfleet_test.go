package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/examples/loadgen/load"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/trace"
)

// writeTrace writes a small Mooncake trace: convs conversations of turns requests each,
// interleaved, every request sharing its conversation's first shared blocks and ending in
// blocks of its own.
func writeTrace(t *testing.T, convs, turns, shared, own int) string {
	t.Helper()
	var b strings.Builder
	id := uint64(1000)
	for i := range convs * turns {
		c := i % convs
		var ids []string
		for k := range shared {
			ids = append(ids, fmt.Sprint(c*100+k))
		}
		for range own {
			ids = append(ids, fmt.Sprint(id))
			id++
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 8, "hash_ids": [%s]}`+"\n",
			i*100, (shared+own)*512, strings.Join(ids, ", "))
	}
	path := filepath.Join(t.TempDir(), "tiny.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTinyFleet runs the whole benchmark on a few dozen requests through real Envoys,
// sidecars, the control server and mock engines, and checks the JSON it ends with.
func TestTinyFleet(t *testing.T) {
	stack.RequireEnvoy(t)
	const convs, turns = 6, 6
	path := writeTrace(t, convs, turns, 4, 2)
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	args := []string{"--trace", path, "--requests", fmt.Sprint(convs * turns), "--offset", "0", "--speed", "10",
		"--load", "0.5", "--engines-per-region", "1", "--timeout", "20s", "--quiet"}
	if code := cli(ctx, args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var out Output
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &out); err != nil {
		t.Fatalf("last line is not the JSON summary: %v\n%s", err, stdout.String())
	}
	t.Logf("%s", stdout.String())
	if out.Requests != convs*turns || out.Regions != 2 || out.EnginesPerRegion != 1 || out.Speed != 10 {
		t.Errorf("header fields %+v, want %d requests, 2 regions x 1 engine, speed 10", out, convs*turns)
	}
	// The SLO as applied is the default divided by the speed.
	if out.SLO.TTFTBaseMs != 100 || out.SLO.TTFTPerTokenMs != 0.02 || out.SLO.ITLMeanMs != 10 || out.SLO.TimeScale != 10 {
		t.Errorf("slo %+v, want 100 ms + 0.02 ms per token, ITL 10 ms, scale 10", out.SLO)
	}
	// Prompts of 6 blocks (3,072 tokens) and 8 output tokens: prefill is most of the time.
	if !(out.PrefillShare > 0.5 && out.PrefillShare < 1) {
		t.Errorf("prefill_share %v, want most of a cold request's engine time", out.PrefillShare)
	}
	if !(out.KVHitUpperBound > 0.5 && out.KVHitUpperBound <= 1) {
		t.Errorf("kv_hit_upper_bound %v: the trace shares 4 of 6 blocks per request", out.KVHitUpperBound)
	}
	if len(out.Ranking) != len(Configs) {
		t.Errorf("ranking %v, want every configuration", out.Ranking)
	}
	for _, c := range Configs {
		r, ok := out.Configs[c]
		if !ok {
			t.Errorf("no result for %s", c)
			continue
		}
		if r.Sent != convs*turns || r.OK+r.Shed+r.Failed != r.Sent {
			t.Errorf("%s: sent %d (want %d), ok %d + shed %d + failed %d", c, r.Sent, convs*turns, r.OK, r.Shed, r.Failed)
		}
		if r.OK < r.Sent*3/4 {
			t.Errorf("%s: only %d of %d requests completed (errors %v)", c, r.OK, r.Sent, r.Errors)
		}
		if r.SLOAttainment < 0 || r.SLOAttainment > 1 || r.CrossRegion < 0 || r.CrossRegion > 1 {
			t.Errorf("%s: slo_attainment %v and cross_region_share %v must be in [0,1]", c, r.SLOAttainment, r.CrossRegion)
		}
		if !(r.TTFTP50 > 0 && r.TTFTP90 >= r.TTFTP50) || !(r.ITLMean > 0) {
			t.Errorf("%s: TTFT p50 %v p90 %v, ITL mean %v: want 0 < p50 <= p90 and a positive ITL", c, r.TTFTP50, r.TTFTP90, r.ITLMean)
		}
		// The replay carries the trace's prefix structure, so the engines' caches hit;
		// they cannot beat one infinite cache shared by all (the slack covers the role
		// tag a chat prompt starts with).
		if !(r.KVHitRate > 0 && r.KVHitRate <= out.KVHitUpperBound+0.02) {
			t.Errorf("%s: kv_hit_rate %v, want in (0, %v]", c, r.KVHitRate, out.KVHitUpperBound)
		}
		total := 0
		for _, n := range r.Engines {
			total += n
		}
		if total != r.OK {
			t.Errorf("%s: engines %v count %d responses, want the %d ok", c, r.Engines, total, r.OK)
		}
	}
	// RING_HASH on the client's prefix header sends a conversation to one engine, and the
	// cache (far larger than the trace) keeps it: every shared block after the first turn
	// hits, as with one shared cache.
	if rh := out.Configs[RingHash]; rh.KVHitRate < 0.9*out.KVHitUpperBound {
		t.Errorf("ring-hash kv_hit_rate %v, want about the bound %v: the prefix header does not pin conversations", rh.KVHitRate, out.KVHitUpperBound)
	}
}

func TestSLO(t *testing.T) {
	slo := DefaultSLO().Scaled(4)
	if slo.TTFTBase != 250*time.Millisecond || slo.TTFTPerToken != 50*time.Microsecond || slo.MaxITL != 25*time.Millisecond {
		t.Fatalf("DefaultSLO().Scaled(4) = %+v", slo)
	}
	ok := func(ttft time.Duration, itls ...time.Duration) load.Result {
		return load.Result{Class: load.ClassOK, TTFT: ttft, ITLs: itls}
	}
	cases := []struct {
		name   string
		res    load.Result
		tokens int
		want   bool
	}{
		{"fast", ok(100*time.Millisecond, 10*time.Millisecond), 1000, true},
		{"ttft within the per-token allowance", ok(290 * time.Millisecond), 1000, true}, // 250 + 50 ms
		{"ttft past it", ok(310 * time.Millisecond), 1000, false},
		{"mean itl at the bound", ok(time.Millisecond, 20*time.Millisecond, 30*time.Millisecond), 1, true},
		{"mean itl over it", ok(time.Millisecond, 20*time.Millisecond, 40*time.Millisecond), 1, false},
		{"shed", load.Result{Class: load.ClassShed}, 1, false},
		{"failed", load.Result{Class: load.ClassIncomplete, TTFT: time.Millisecond}, 1, false},
		{"no token", load.Result{Class: load.ClassOK}, 1, false},
	}
	for _, c := range cases {
		if got := slo.Met(c.res, c.tokens); got != c.want {
			t.Errorf("%s: Met = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestBaselineBootstrapValidates(t *testing.T) {
	envoy := stack.RequireEnvoy(t)
	eps := []baselineEndpoint{{Address: "127.0.0.1:8001"}, {Address: "127.0.0.1:8002", Priority: 1}}
	for _, lb := range []string{"LEAST_REQUEST", "RING_HASH"} {
		yaml, err := baselineBootstrap("n", "127.0.0.1:10000", "127.0.0.1:9901", "/dev/null", lb, eps)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(yaml, "hash_policy"); got != (lb == "RING_HASH") {
			t.Errorf("%s: hash policy present = %v", lb, got)
		}
		path := filepath.Join(t.TempDir(), "envoy.yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := execOutput(envoy, "--mode", "validate", "-c", path); err != nil || !strings.Contains(out, "OK") {
			t.Fatalf("%s: envoy --mode validate: %v\n%s", lb, err, out)
		}
	}
}

func execOutput(bin string, args ...string) (string, error) {
	out, err := exec.Command(bin, args...).CombinedOutput()
	return string(out), err
}

// The simulator's prediction judges requests by the run's SLO before time scaling: a
// generous SLO is met by every completed request, a 1 ms one by none.
func TestSimulatePredictsSLOAttainment(t *testing.T) {
	reqs, err := trace.ReadFile(writeTrace(t, 6, 4, 2, 2), trace.FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	o := options{load: 0.3, regions: 2, perRegion: 2, rttMillis: 15, seed: 1, configs: []string{Meridian, LeastRequest, RingHash}}
	for _, tc := range []struct {
		name string
		slo  sim.SLO
		want func(float64) bool
	}{
		{"generous", sim.SLO{TTFTBase: time.Hour, MaxITL: time.Hour}, func(a float64) bool { return a > 0.9 }},
		{"1 ms", sim.SLO{TTFTBase: time.Millisecond, MaxITL: time.Millisecond}, func(a float64) bool { return a == 0 }},
	} {
		o.slo = SLO{tc.slo}
		res, err := simulate(context.Background(), o, reqs, []string{"region-a", "region-b"})
		if err != nil {
			t.Fatal(err)
		}
		for c, r := range res {
			if !tc.want(r.SLOAttainment) {
				t.Errorf("%s SLO, %s: predicted attainment %v", tc.name, c, r.SLOAttainment)
			}
		}
	}
}
