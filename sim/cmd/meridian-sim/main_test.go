package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/sim/engine"
)

// writeTrace writes a small Mooncake-format trace of conversations sharing prefixes.
func writeTrace(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		conv := i % 7
		ids := []string{}
		for k := range 2 + i/7%5 {
			ids = append(ids, fmt.Sprint(conv*1000+k))
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 30, "hash_ids": [%s]}`+"\n",
			i*400, len(ids)*512, strings.Join(ids, ", "))
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestWritesResultsReportAndPlots(t *testing.T) {
	out := t.TempDir()
	o, err := parseFlags([]string{"--trace", writeTrace(t, 120), "--out", out, "--scenario", "steady,overload",
		"--engines-per-region", "1", "--quiet"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := run(context.Background(), o, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "| prefix-hash |") {
		t.Errorf("stdout has no table:\n%s", stdout.String())
	}
	for _, sc := range []string{"steady", "overload"} {
		for _, f := range []string{"results.json", "report.md", "ttft_cdf.png", "weights.png"} {
			if fi, err := os.Stat(filepath.Join(out, sc, f)); err != nil || fi.Size() == 0 {
				t.Errorf("%s/%s missing or empty: %v", sc, f, err)
			}
		}
	}
	data, err := os.ReadFile(filepath.Join(out, "steady", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var results []map[string]any
	if err := json.Unmarshal(data, &results); err != nil {
		t.Fatal(err)
	}
	required := []string{"policy", "requests", "completed", "shed", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
		"itl_p50_ms", "itl_p99_ms", "e2e_p99_ms", "slo_goodput_rps", "slo_attainment", "kv_hit_rate", "kv_hit_upper_bound", "weight_churn"}
	if len(results) != len(o.policies) {
		t.Fatalf("%d results for %d policies", len(results), len(o.policies))
	}
	for _, r := range results {
		for _, k := range required {
			if _, ok := r[k]; !ok {
				t.Errorf("result %v lacks %s", r["policy"], k)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(out, "report.md")); err != nil {
		t.Errorf("no combined report: %v", err)
	}
}

func TestFlags(t *testing.T) {
	var stderr bytes.Buffer
	if _, err := parseFlags([]string{"--help"}, &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "slow-engine") {
		t.Errorf("--help: %v, usage %q", err, stderr.String())
	}
	for _, args := range [][]string{
		{},
		{"--trace", "x", "--scenario", "storm"},
		{"--trace", "x", "--sample", "0"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestCapacityWritesJSONAndPlots(t *testing.T) {
	out := t.TempDir()
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"--trace", writeTrace(t, 150), "--out", out, "--capacity",
		"--policies", "round-robin,dynamo,meridian", "--deployment", "region,global", "--replicas", "2",
		"--engines-per-region", "1", "--gpu", "h100-80gb", "--capacity-runs", "4"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := run(context.Background(), o, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), "[run ") {
		t.Errorf("no progress on stderr: %q", stderr.String())
	}
	for _, f := range []string{"capacity.json", "capacity.md", "capacity_slo.png", "capacity_ttft.png"} {
		if fi, err := os.Stat(filepath.Join(out, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s missing or empty: %v", f, err)
		}
	}
	data, err := os.ReadFile(filepath.Join(out, "capacity.json"))
	if err != nil {
		t.Fatal(err)
	}
	var caps []map[string]any
	if err := json.Unmarshal(data, &caps); err != nil {
		t.Fatal(err)
	}
	if len(caps) != 6 {
		t.Fatalf("%d objects for 3 policies x 2 deployments", len(caps))
	}
	required := []string{"policy", "deployment", "replicas", "capacity_rps", "slo_attainment", "kv_hit_rate",
		"kv_hit_upper_bound", "shed_rate", "weight_churn", "max_share_step"}
	for _, c := range caps {
		for _, k := range required {
			if _, ok := c[k]; !ok {
				t.Errorf("%v lacks %s", c["policy"], k)
			}
		}
		want := 2.0
		if c["deployment"] == "global" {
			want = 1
		}
		if c["replicas"] != want {
			t.Errorf("%v %v: replicas %v, want %v", c["policy"], c["deployment"], c["replicas"], want)
		}
	}
}

func TestCapacityFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--trace", "x", "--gpu", "v100"},
		{"--trace", "x", "--deployment", "region,global"}, // several only with --capacity
		{"--trace", "x", "--deployment", "planet"},
		{"--trace", "x", "--replicas", "0"},
		{"--trace", "x", "--capacity", "--scenario", "steady,step"},
		{"--trace", "x", "--seeds", "2"}, // a single run has one seed: --seed
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

// TestCapacitySeedsApply: --capacity --seeds 2 judges each rate by two runs, and the
// report says so.
func TestCapacitySeedsApply(t *testing.T) {
	out := t.TempDir()
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"--trace", writeTrace(t, 150), "--out", out, "--capacity", "--seeds", "2", "--seed", "3",
		"--policies", "round-robin", "--engines-per-region", "1", "--capacity-runs", "2", "--quiet"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), o, &bytes.Buffer{}, &stderr); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(out, "capacity.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "judged by 2 runs, seeds 3 to 4") {
		t.Errorf("capacity.md does not say each rate is judged by seeds 3 and 4:\n%s", md)
	}
}

// TestSidecarConfigAndControlFlagsApply: --sidecar-config's file is what meridian's
// sidecars run (a hard cap of one request per engine sheds under a load the defaults
// serve), and bad files or control-server values are refused before any run.
func TestSidecarConfigAndControlFlagsApply(t *testing.T) {
	tr := writeTrace(t, 150)
	shed := func(extra ...string) float64 {
		t.Helper()
		out := t.TempDir()
		args := append([]string{"--trace", tr, "--out", out, "--policies", "meridian-defaults", "--load", "0.8",
			"--engines-per-region", "1", "--gpu", "h100-80gb", "--quiet"}, extra...)
		o, err := parseFlags(args, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if err := run(context.Background(), o, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(out, "results.json"))
		if err != nil {
			t.Fatal(err)
		}
		var r []struct{ Shed float64 }
		if err := json.Unmarshal(data, &r); err != nil || len(r) != 1 {
			t.Fatalf("results.json: %v, %d results", err, len(r))
		}
		return r[0].Shed
	}
	capped := filepath.Join(t.TempDir(), "sidecar.yaml")
	if err := os.WriteFile(capped, []byte("picker:\n  max_in_flight: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base, withCap := shed(), shed("--sidecar-config", capped)
	t.Logf("shed: %v with the defaults, %v capped at one request per engine", base, withCap)
	if withCap <= base {
		t.Errorf("--sidecar-config with max_in_flight 1 shed %v, the defaults %v: the file was not applied", withCap, base)
	}

	// The control server's values reach the simulation exactly when given.
	o, err := parseFlags([]string{"--trace", tr, "--move-cost", "0.05", "--min-share-change", "0.04", "--rho-max", "0.8", "--cache-half-life", "20s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c := baseConfig(o, nil, engine.Config{}); c.MoveCost == nil || *c.MoveCost != 0.05 || c.MinShareChange == nil ||
		*c.MinShareChange != 0.04 || c.RhoMax == nil || *c.RhoMax != 0.8 || c.CacheHalfLife == nil || *c.CacheHalfLife != 20*time.Second {
		t.Errorf("given: move cost %v, min share change %v, rho max %v, cache half-life %v", c.MoveCost, c.MinShareChange, c.RhoMax, c.CacheHalfLife)
	}
	if o, err = parseFlags([]string{"--trace", tr}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if c := baseConfig(o, nil, engine.Config{}); c.MoveCost != nil || c.MinShareChange != nil || c.RhoMax != nil || c.Sidecar != nil || c.CacheHalfLife != nil {
		t.Errorf("not given: move cost %v, min share change %v, rho max %v, sidecar %v, cache half-life %v: want the policies' own", c.MoveCost, c.MinShareChange, c.RhoMax, c.Sidecar, c.CacheHalfLife)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("picker:\n  move_factor: -1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--trace", tr, "--sidecar-config", bad},
		{"--trace", tr, "--sidecar-config", filepath.Join(t.TempDir(), "missing.yaml")},
		{"--trace", tr, "--min-share-change", "1"},
		{"--trace", tr, "--move-cost", "-1"},
		{"--trace", tr, "--rho-max", "1"},
		{"--trace", tr, "--cache-half-life", "0s"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		} else if args[2] == "--sidecar-config" && !strings.Contains(err.Error(), args[3]) {
			t.Errorf("parseFlags(%q): %v does not name the file", args, err)
		}
	}
}

// Every configuration variant docs/results cites (--sidecar-config docs/results/variants/*)
// loads, and changes something: a file that stopped parsing, or one whose every value is a
// default, would make its figures a run of the shipped configuration.
func TestTheDocumentedVariantsLoadAndDiffer(t *testing.T) {
	files, err := filepath.Glob("../../../docs/results/variants/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no variants found: %v", err)
	}
	tr := writeTrace(t, 10)
	base, err := parseFlags([]string{"--trace", tr}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c := baseConfig(base, nil, engine.Config{}); c.Sidecar != nil {
		t.Fatal("without --sidecar-config the policies' own configuration must run")
	}
	def, err := json.Marshal(server.DefaultConfig(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		o, err := parseFlags([]string{"--trace", tr, "--sidecar-config", f}, &bytes.Buffer{})
		if err != nil {
			t.Errorf("%s: %v", filepath.Base(f), err)
			continue
		}
		c := baseConfig(o, nil, engine.Config{})
		if c.Sidecar == nil {
			t.Errorf("%s: not applied", filepath.Base(f))
			continue
		}
		d, err := json.Marshal(*c.Sidecar)
		if err != nil {
			t.Fatal(err)
		}
		if string(d) == string(def) {
			t.Errorf("%s: every value is the shipped default", filepath.Base(f))
		}
	}
}

func TestScanWritesTheMeanOfEachLoad(t *testing.T) {
	for _, args := range [][]string{
		{"--trace", "x", "--scan", "0.5,abc"},
		{"--trace", "x", "--scan", ","},
		{"--trace", "x", "--scan", "0.5", "--capacity"},
		{"--trace", "x", "--scan", "0.5", "--scenario", "steady,step"},
		{"--trace", "x", "--scan", "0.5", "--seeds", "0"},
		{"--trace", "x", "--scan", "0.5", "--workers", "0"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
	out := t.TempDir()
	o, err := parseFlags([]string{"--trace", writeTrace(t, 80), "--scan", "0.3,0.6", "--seeds", "2", "--seed", "5",
		"--policies", "round-robin,prefix-hash", "--engines-per-region", "1", "--out", out, "--quiet"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := run(context.Background(), o, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(out, "scan.json"))
	if err != nil {
		t.Fatal(err)
	}
	var points []struct {
		Policy string
		Load   float64
		Seed   uint64
	}
	if err := json.Unmarshal(data, &points); err != nil || len(points) != 8 {
		t.Fatalf("scan.json: %v, %d points, want 2 policies x 2 loads x 2 seeds", err, len(points))
	}
	if p := points[7]; p.Policy != "prefix-hash" || p.Load != 0.6 || p.Seed != 6 {
		t.Errorf("last point %+v, want prefix-hash at 0.6 with seed 6", p)
	}
	md, err := os.ReadFile(filepath.Join(out, "scan.md"))
	if err != nil || !strings.Contains(string(md), "| prefix-hash |") || !strings.Contains(stdout.String(), "(4 runs)") {
		t.Errorf("scan.md (%v):\n%s\nstdout:\n%s", err, md, stdout.String())
	}
}
