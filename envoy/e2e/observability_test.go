package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"

	"github.com/openai/openai-go"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/xdsapi"
)

// ruleFile is deploy/prometheus/meridian-rules.yaml, decoded strictly (Prometheus's
// rule-file schema, the fields the file uses).
type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []struct {
			Record      string            `yaml:"record"`
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// dashboard is deploy/grafana/meridian-dashboard.json, decoded strictly: Grafana's dashboard
// model, the fields the file uses. A field Grafana does not know fails the decode.
type dashboard struct {
	UID, Title, Description, Timezone, Refresh string
	Tags                                       []string
	SchemaVersion, Version, GraphTooltip       int
	Editable                                   bool
	Time                                       struct{ From, To string }
	Templating                                 struct {
		List []struct {
			Name, Label, Type string
			Query             any
			Datasource        *datasourceRef
			Current           map[string]any
			Refresh, Hide     int
			IncludeAll, Multi bool
			AllValue          string
		}
	}
	Annotations struct{ List []any }
	Links       []any
	Panels      []struct {
		ID          int
		Type, Title string
		Description string
		Collapsed   bool
		Datasource  *datasourceRef
		GridPos     struct{ H, W, X, Y int }
		Panels      []any
		Options     map[string]any
		FieldConfig *struct {
			Defaults struct {
				Unit  string
				Links []struct {
					Title, URL  string
					TargetBlank bool
				}
			}
			Overrides []any
		}
		Targets []struct {
			RefID        string
			Datasource   *datasourceRef
			Expr         string
			LegendFormat string
		}
	}
}

type datasourceRef struct{ Type, UID string }

func repoFile(t *testing.T, rel string) []byte {
	t.Helper()
	root, err := stack.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(repoFile(t, "deploy/prometheus/meridian-rules.yaml")))
	dec.KnownFields(true)
	var rf ruleFile
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("meridian-rules.yaml: %v", err)
	}
	return rf
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(repoFile(t, "deploy/grafana/meridian-dashboard.json")))
	dec.DisallowUnknownFields()
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("meridian-dashboard.json: %v", err)
	}
	return d
}

// promtool finds the promtool scripts/promtool.sh builds; under CI=true a missing one fails.
func promtool(t *testing.T) string {
	t.Helper()
	if root, err := stack.RepoRoot(); err == nil {
		if p := filepath.Join(root, ".tools", "bin", "promtool"); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true and no promtool: scripts/setup.sh runs scripts/promtool.sh to build it")
	}
	t.Skip("no promtool: run scripts/promtool.sh")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

var (
	reString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	reBraces   = regexp.MustCompile(`\{[^{}]*\}|\[[^\[\]]*\]`)
	reGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	reIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	promqlWord = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "group_left": true, "group_right": true, "e": true, "Inf": true, "NaN": true}
)

// metricNames lists the metric names a PromQL expression selects: what is left once strings,
// label matchers, ranges, grouping clauses, function names and keywords are taken out.
func metricNames(expr string) []string {
	e := reString.ReplaceAllString(expr, "")
	for prev := ""; prev != e; {
		prev, e = e, reBraces.ReplaceAllString(e, " ")
	}
	e = reGrouping.ReplaceAllString(e, " ")
	var out []string
	for _, m := range reIdent.FindAllStringSubmatch(e, -1) {
		name := strings.TrimRight(strings.TrimSuffix(strings.TrimSpace(m[0]), "("), " ")
		if m[1] != "" || promqlWord[name] {
			continue // a function call or a keyword
		}
		out = append(out, name)
	}
	return out
}

func TestMetricNames(t *testing.T) {
	got := metricNames(`sum by (model, le) (rate(meridian_a_total{x="a b",y=~"$m"}[$__rate_interval])) / ignoring (engine) group_left sum(meridian:b) > bool 0.5 and up{job="j"} == 0`)
	if want := []string{"meridian_a_total", "meridian:b", "up"}; !slices.Equal(got, want) {
		t.Fatalf("metricNames = %v, want %v", got, want)
	}
}

func TestDeployRulesAndDashboard(t *testing.T) {
	rules := loadRules(t)
	dash := loadDashboard(t)

	t.Run("promtool accepts the rules", func(t *testing.T) {
		out, err := exec.Command(promtool(t), "check", "rules", "--lint=all", "--lint-fatal",
			filepath.Join(mustRoot(t), "deploy/prometheus/meridian-rules.yaml")).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool check rules: %v\n%s", err, out)
		}
		t.Logf("%s", out)
	})
	t.Run("promtool rule unit tests pass", func(t *testing.T) {
		out, err := exec.Command(promtool(t), "test", "rules",
			filepath.Join(mustRoot(t), "deploy/prometheus/meridian-rules_test.yaml")).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool test rules: %v\n%s", err, out)
		}
	})

	// What the rules and the dashboard select.
	recorded := map[string]bool{}
	var exprs []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if (r.Record == "") == (r.Alert == "") || r.Expr == "" {
				t.Fatalf("group %s: a rule needs exactly one of record and alert, and an expr: %+v", g.Name, r)
			}
			if r.Record != "" {
				recorded[r.Record] = true
			}
			if r.Alert != "" && (r.Labels["severity"] == "" || r.Annotations["summary"] == "") {
				t.Errorf("alert %s has no severity label or summary", r.Alert)
			}
			exprs = append(exprs, r.Expr)
		}
	}
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("dashboard panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W < 1 {
			t.Errorf("panel %q: gridPos %+v is outside Grafana's 24 columns", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: no targets or not on the $datasource variable", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.RefID == "" || tg.Expr == "" {
				t.Errorf("panel %q: target without refId or expr", p.Title)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	if dash.UID == "" || dash.Title == "" || len(exprs) < 20 {
		t.Fatalf("dashboard uid %q title %q, %d expressions in all", dash.UID, dash.Title, len(exprs))
	}

	// A running stack, driven through what the series record: traffic, a shed, a spillover.
	s := startStack(t, stack.Spec{
		Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}},
		Engines: []stack.EngineSpec{
			{Name: "e0", Region: "a", Models: []string{model}, MaxInFlight: 1, Args: []string{"--ttft", "10ms", "--itl", "2ms"}},
			{Name: "e1", Region: "a", Models: []string{model}, MaxInFlight: 1, Args: []string{"--ttft", "10ms", "--itl", "2ms"}},
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exercise(ctx, t, s)

	exported := map[string]bool{"up": true} // up: Prometheus's own, per scrape target
	var control, sidecar stack.Metrics
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if control, err = s.ControlMetrics(ctx); err != nil {
			t.Fatal(err)
		}
		if sidecar, err = s.SidecarMetrics(ctx, "region-a"); err != nil {
			t.Fatal(err)
		}
		if control["meridian_control_demand_rps"] != nil && control["meridian_control_engine_scrape_age_seconds"] != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, fams := range []stack.Metrics{control, sidecar} {
		for name, f := range fams {
			exported[name] = true
			if f.GetType() == dto.MetricType_HISTOGRAM {
				exported[name+"_bucket"], exported[name+"_sum"], exported[name+"_count"] = true, true, true
			}
		}
	}
	missing := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricNames(e) {
			if !exported[n] && !recorded[n] {
				missing[n] = true
			}
		}
	}
	if len(missing) > 0 {
		t.Fatalf("the rules or the dashboard name metrics meridian does not export: %v", keys(missing))
	}

	t.Run("engine weights on /metrics are the published ones", func(t *testing.T) {
		pub, err := s.PublishedWeights(ctx, "region-a")
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]uint32{}
		for _, m := range control["meridian_control_engine_weight"].GetMetric() {
			if label(m, "node") == "region-a" && label(m, "model") == model {
				got[s.Engines[label(m, "engine")].Address] = uint32(m.GetGauge().GetValue())
			}
		}
		want := pub[xdsapi.ClusterName(model)]
		if len(want) != 2 || !maps.Equal(got, want) {
			t.Fatalf("meridian_control_engine_weight %v, published %v", got, want)
		}
	})
}

// exercise sends ordinary traffic, then, with both engines (capped at one request each)
// holding their requests, requests that spill over and get shed.
func exercise(ctx context.Context, t *testing.T, s *stack.Stack) {
	c := sdkClient(s.Nodes["region-a"].URL)
	for i := 0; i < 6; i++ {
		if err := chat2(ctx, c, model); err != nil {
			t.Fatal(err)
		}
		// An engine's in-flight slot frees when Envoy's access log reports the request (it
		// flushes every 50 ms): with a cap of 1, back-to-back requests would be shed.
		time.Sleep(200 * time.Millisecond)
	}
	for _, e := range []string{"e0", "e1"} {
		if err := s.SetFaults(ctx, e, stack.EngineFaults{Hang: true, LatencyMultiplier: 1}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	shed := 0
	var mu sync.Mutex
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			probe, stop := context.WithTimeout(ctx, 1500*time.Millisecond)
			defer stop()
			err := chat2(probe, c, model) // one prompt: one key, so the second pick spills
			var apiErr *openai.Error
			if errors.As(err, &apiErr) && apiErr.StatusCode == 503 {
				mu.Lock()
				shed++
				mu.Unlock()
			}
		}()
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	for _, e := range []string{"e0", "e1"} {
		if err := s.SetFaults(ctx, e, stack.NoFaults()); err != nil {
			t.Fatal(err)
		}
	}
	if shed == 0 {
		t.Fatal("no request was shed with both engines at their cap")
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func mustRoot(t *testing.T) string {
	root, err := stack.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
