package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchMediansAndRanges(t *testing.T) {
	in := `goos: linux
BenchmarkProcess/engines=16-2     5000   24762 ns/op   4282 B/op   58 allocs/op
BenchmarkProcess/engines=16-2     5000   24564 ns/op   4282 B/op   58 allocs/op
BenchmarkProcess/engines=16-2     5000   30000 ns/op   4290 B/op   58 allocs/op
BenchmarkKeyMovement/x-2             1   1200000 ns/op   2.5 delta-%   2.6 moved-%
PASS
`
	rows, err := parseBench(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	got := renderBench(rows)
	for _, want := range []string{
		"| benchmark | runs | median time/op | range | B/op | allocs/op | delta-% | moved-% |",
		"| `Process/engines=16` | 3 | **24.76 µs** | 24.56 µs – 30.00 µs | 4282 | 58 | – | – |",
		"| `KeyMovement/x` | 1 | **1.20 ms** | – | – | – | 2.5 | 2.6 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if _, err := parseBench(strings.NewReader("PASS\n")); err == nil {
		t.Error("input without a result line accepted")
	}
}

func TestChaosTable(t *testing.T) {
	events := `{"Action":"run","Test":"TestChaosA"}
{"Action":"pass","Test":"TestChaosA","Elapsed":12.5}
{"Action":"run","Test":"TestChaosB"}
{"Action":"run","Test":"TestChaosB/sub"}
{"Action":"fail","Test":"TestChaosB/sub","Elapsed":1}
{"Action":"fail","Test":"TestChaosB","Elapsed":3}
{"Action":"fail","Package":"x","Elapsed":16}
`
	figs := `{"test":"TestChaosA","figure":"failed","value":0}
{"test":"TestChaosA","figure":"by_reason","value":{"quota":88,"cap":1}}
{"test":"TestChaosB/sub","figure":"served","value":"16/16"}
`
	got, err := renderChaos(strings.NewReader(figs), strings.NewReader(events))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"2 tests, 1 passed, 15.5 s of test time.",
		"| `TestChaosA` | pass | 12.5 | failed = 0; by_reason = {cap: 1, quota: 88} |",
		"| `TestChaosB` | **fail** | 3.0 | sub/served = 16/16 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

func TestOverheadTable(t *testing.T) {
	in := "rate 500 req/s: ...\n" +
		`{"results":[{"rate_rps":500,"requests_per_config":7500,"baseline_p50_ms":0.646,"baseline_p99_ms":1.218,` +
		`"sidecar_p50_ms":1.173,"sidecar_p99_ms":2.695,"added_p50_ms":0.527,"added_p99_ms":1.477,` +
		`"null_extproc_p50_ms":1.092,"null_extproc_p99_ms":2.414,"null_extproc_added_p50_ms":0.446,` +
		`"sidecar_over_null_extproc_p50_ms":0.081,"sidecar_cpu_us_per_request":{"envoy":583,"sidecar":408}}]}` + "\n"
	got, err := renderOverhead(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| 500 | 7500 | 0.646 / 1.218 | 1.092 / 2.414 | 1.173 / 2.695 | **+0.527 / +1.477** | 0.446 / 0.081 | 0 / 0 / 0 |",
		"| 500 | – | – | envoy 583, sidecar 408 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

// A run over two prompt sizes says which each row is.
func TestOverheadTableByPromptSize(t *testing.T) {
	in := `{"results":[{"prompt_bytes":0,"rate_rps":50,"requests_per_config":750},{"prompt_bytes":220000,"rate_rps":50,"requests_per_config":750,"added_p50_ms":3.053}]}` + "\n"
	got, err := renderOverhead(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| prompt | rate req/s |", "| default | 50 | 750 |", "| 220,000 B | 50 | 750 |", "**+3.053 / +0.000**", "| 220,000 B | 50 | – |"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

func TestSplice(t *testing.T) {
	figs := map[string]string{"a": "new A\n", "b": "B\n"}
	figure := func(name string) (string, error) { return figs[name], nil }
	doc := "intro\n<!-- figure: a -->\nold A\nmore\n<!-- /figure: a -->\nmid\n<!-- figure: b -->\nB\n<!-- /figure: b -->\nend\n"
	got, changed, err := splice(doc, figure)
	if err != nil {
		t.Fatal(err)
	}
	want := "intro\n<!-- figure: a -->\nnew A\n<!-- /figure: a -->\nmid\n<!-- figure: b -->\nB\n<!-- /figure: b -->\nend\n"
	if got != want || len(changed) != 1 || changed[0] != "a" {
		t.Errorf("splice = %q, changed %v; want %q, changed [a]", got, changed, want)
	}
	if _, changed, _ := splice(got, figure); len(changed) != 0 {
		t.Errorf("a second splice changed %v", changed)
	}
	for _, bad := range []string{
		"<!-- figure: a -->\nx\n",
		"<!-- figure: a -->\n<!-- /figure: b -->\n",
		"<!-- /figure: a -->\n",
	} {
		if _, _, err := splice(bad, figure); err == nil {
			t.Errorf("splice accepted %q", bad)
		}
	}
}

// TestDocsMatchFigures fails when a document's generated block was edited by hand or its
// docs/figures file was regenerated without splicing: the numbers in docs/ are the files'.
func TestDocsMatchFigures(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs/*.md under %s: %v", root, err)
	}
	docs = append(docs, filepath.Join(root, "README.md"))
	blocks := 0
	for _, path := range docs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, changed, err := splice(string(b), func(name string) (string, error) {
			blocks++
			f, err := os.ReadFile(filepath.Join(root, "docs", "figures", name+".md"))
			return string(f), err
		})
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if len(changed) > 0 {
			t.Errorf("%s: blocks %v differ from docs/figures: run 'make figures-splice'", path, changed)
		}
	}
	if blocks == 0 {
		t.Error("no document includes a docs/figures block")
	}
}
