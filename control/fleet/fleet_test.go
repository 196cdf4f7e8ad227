package fleet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const good = `
models:
  - name: llama
  - name: qwen
clusters:
  - {name: region-a, region: a}
  - {name: region-b, region: b}
engines:
  - {name: a-0, address: "127.0.0.1:8001", region: a, models: [llama], capacity_rps: 10}
  - {name: a-1, address: "127.0.0.1:8002", region: a, models: [llama, qwen], capacity_rps: 10}
  - {name: b-0, address: "127.0.0.1:8003", region: b, models: [llama], capacity_rps: 20, max_in_flight: 64}
rtt_ms:
  region-a: {a: 1, b: 40}
  region-b: {a: 40, b: 1}
weights:
  region-a: {a-0: 100, a-1: 50, b-0: 0}
`

func TestParseGood(t *testing.T) {
	f, err := Parse("fleet.yaml", []byte(good))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if f.DefaultModel != "llama" {
		t.Errorf("DefaultModel = %q, want the first model", f.DefaultModel)
	}
	if got := f.Engines[0].MetricsURL; got != "http://127.0.0.1:8001/metrics" {
		t.Errorf("MetricsURL default = %q", got)
	}
	b0, ok := f.Engine("b-0")
	if !ok || !b0.Serves("llama") || b0.Serves("qwen") {
		t.Errorf("Engine(b-0) = %+v, %v", b0, ok)
	}
	if g, err := Parse("fleet.yaml", []byte(strings.Replace(good, "{name: region-b, region: b}", "{name: region-b, region: b, decisions_url: \"http://127.0.0.1:19081/debug/decisions\"}", 1))); err != nil || g.Clusters[1].DecisionsURL != "http://127.0.0.1:19081/debug/decisions" {
		t.Errorf("decisions_url: %v, %+v", err, g)
	}
	if got := f.RTTSeconds("region-a", b0); got != 0.040 {
		t.Errorf("RTTSeconds = %v, want 0.040", got)
	}
}

func TestParseErrorsNameFileFieldAndReason(t *testing.T) {
	cases := []struct {
		name string
		edit func(string) string
		want string
	}{
		{"unknown field", func(s string) string { return s + "bogus: 1\n" }, "field bogus not found"},
		{"bad address", func(s string) string { return strings.Replace(s, `"127.0.0.1:8001"`, `"engine-host:8001"`, 1) }, "engines[0].address"},
		{"duplicate address", func(s string) string { return strings.Replace(s, `"127.0.0.1:8002"`, `"127.0.0.1:8001"`, 1) }, "engines[1].address: 127.0.0.1:8001 is also"},
		{"unknown model on engine", func(s string) string {
			return strings.Replace(s, "models: [llama], capacity_rps: 20", "models: [mistral], capacity_rps: 20", 1)
		}, `engines[2].models[0]: "mistral" is not one of models[].name`},
		{"zero capacity", func(s string) string { return strings.Replace(s, "capacity_rps: 20", "capacity_rps: 0", 1) }, "engines[2].capacity_rps: must be a finite number > 0"},
		{"duplicate engine", func(s string) string { return strings.Replace(s, "name: a-1", "name: a-0", 1) }, `engines[1].name: engine "a-0" is listed twice`},
		{"missing rtt", func(s string) string { return strings.Replace(s, "region-b: {a: 40, b: 1}", "region-b: {a: 40}", 1) }, "rtt_ms.region-b.b: missing"},
		{"negative rtt", func(s string) string { return strings.Replace(s, "{a: 40, b: 1}", "{a: -4, b: 1}", 1) }, "rtt_ms.region-b.a: must be a finite number >= 0"},
		{"weights unknown engine", func(s string) string { return strings.Replace(s, "a-0: 100", "zz: 100", 1) }, `weights.region-a.zz: "zz" is not one of engines[].name`},
		{"weights all zero", func(s string) string { return strings.Replace(s, "{a-0: 100, a-1: 50, b-0: 0}", "{a-0: 0}", 1) }, "weights.region-a: every weight is 0"},
		{"weights unknown cluster", func(s string) string { return strings.Replace(s, "  region-a: {a-0", "  region-z: {a-0", 1) }, `weights.region-z: "region-z" is not one of clusters[].name`},
		{"default model unknown", func(s string) string { return s + "default_model: gpt\n" }, `default_model: "gpt" is not one of models[].name`},
		{"no models", func(s string) string {
			return strings.Replace(strings.Replace(s, "  - name: llama\n  - name: qwen\n", "", 1), "models:\n", "models: []\n", 1)
		}, "models: at least one model is required"},
		{"empty file", func(string) string { return "" }, "is empty"},
		{"infinite capacity", func(s string) string { return strings.Replace(s, "capacity_rps: 20", "capacity_rps: .inf", 1) }, "engines[2].capacity_rps: must be a finite number > 0"},
		{"weights overflow", func(s string) string {
			return strings.Replace(s, "{a-0: 100, a-1: 50, b-0: 0}", "{a-0: 4294967295, a-1: 2}", 1)
		}, "weights.region-a: weights sum to 4294967297"},
		{"decisions url not http", func(s string) string {
			return strings.Replace(s, "{name: region-b, region: b}", "{name: region-b, region: b, decisions_url: \"file:///etc/passwd\"}", 1)
		}, "clusters[1].decisions_url"},
		{"decisions url with a query", func(s string) string {
			return strings.Replace(s, "{name: region-b, region: b}", "{name: region-b, region: b, decisions_url: \"http://127.0.0.1:19081/debug/decisions?engine=x\"}", 1)
		}, "clusters[1].decisions_url"},
		{"wrong type", func(s string) string { return strings.Replace(s, "capacity_rps: 20", "capacity_rps: lots", 1) }, "cannot unmarshal"},
		{"prefill share of 1", func(s string) string {
			return strings.Replace(s, "- name: qwen", "- {name: qwen, prefill_share: 1}", 1)
		}, "models[1].prefill_share: must be in [0, 1)"},
		{"negative engine prefill share", func(s string) string {
			return strings.Replace(s, "capacity_rps: 20,", "capacity_rps: 20, prefill_share: -0.1,", 1)
		}, "engines[2].prefill_share: must be in [0, 1)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("fleet.yaml", []byte(tc.edit(good)))
			if err == nil {
				t.Fatal("Parse accepted a bad fleet file")
			}
			if !strings.Contains(err.Error(), "fleet.yaml") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not name the file and contain %q", err, tc.want)
			}
		})
	}
}

func TestPrefillShareIsTheEnginesElseTheSmallestOfItsModels(t *testing.T) {
	y := strings.NewReplacer("- name: llama", "- {name: llama, prefill_share: 0.8}", "- name: qwen", "- {name: qwen, prefill_share: 0.6}",
		"capacity_rps: 20,", "capacity_rps: 20, prefill_share: 0.9,").Replace(good)
	f, err := Parse("fleet.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"a-0": 0.8, "a-1": 0.6, "b-0": 0.9} {
		e, _ := f.Engine(name)
		if got := f.PrefillShare(e); got != want {
			t.Errorf("PrefillShare(%s) = %v, want %v", name, got, want)
		}
	}
	g, _ := Parse("fleet.yaml", []byte(good))
	if got := g.PrefillShare(g.Engines[0]); got != 0 {
		t.Errorf("PrefillShare with none set = %v, want 0 (no credit)", got)
	}
}

func TestLoadReadsFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f.yaml")
	if err := os.WriteFile(p, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p + ".missing"); err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
}
