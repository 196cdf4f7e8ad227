package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/examples/loadgen/load"
)

func demoTopology(t *testing.T) *topology {
	t.Helper()
	root, err := stack.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	topo, err := loadTopology(filepath.Join(root, "examples", "demo", "fleet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

func TestPlanLaysOutTheStory(t *testing.T) {
	topo := demoTopology(t)
	p, err := newPlan(topo, 50*time.Second, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if p.starts[0] != 0 || p.starts[len(story)] != 50*time.Second {
		t.Errorf("phases span %v..%v, want 0..50s", p.starts[0], p.starts[len(story)])
	}
	for i := range story {
		mid := p.starts[i] + p.span(i)/2
		if got := p.phaseAt(mid); got != i {
			t.Errorf("phaseAt(%v) = %d, want %d", mid, got, i)
		}
	}
	busy, other := topo.nodes[0].Name, topo.nodes[1].Name
	surge := slicesIndex(t, "surge")
	if got, want := p.rate(surge, busy), story[surge].busyLoad*topo.localCapacity(busy)*0.5; got != want {
		t.Errorf("surge rate of %s = %v, want %v", busy, got, want)
	}
	if p.rate(surge, busy) <= topo.localCapacity(busy)*0.5 || p.rate(surge, other) >= topo.localCapacity(other)*0.5 {
		t.Error("the surge must push the busy region past its local capacity and leave the other below its own")
	}
	if topo.region(p.slow) != topo.nodeRegion(busy) {
		t.Errorf("slowed engine %s is not in the busy region", p.slow)
	}
	for _, bad := range []struct {
		d     time.Duration
		scale float64
	}{{time.Second, 1}, {time.Minute, 0}} {
		if _, err := newPlan(topo, bad.d, bad.scale); err == nil {
			t.Errorf("newPlan(%v, %v) accepted", bad.d, bad.scale)
		}
	}
}

func slicesIndex(t *testing.T, name string) int {
	t.Helper()
	for i, ph := range story {
		if ph.name == name {
			return i
		}
	}
	t.Fatalf("no phase %q", name)
	return -1
}

func TestSummarize(t *testing.T) {
	topo := demoTopology(t)
	ok := func(node, engine string, ttft time.Duration) result {
		return result{node: node, class: "interactive", res: load.Result{Class: load.ClassOK, Engine: engine, TTFT: ttft}}
	}
	rs := []result{
		ok("region-a", "a-0", 10*time.Millisecond),
		ok("region-a", "a-1", 20*time.Millisecond),
		ok("region-a", "b-0", 50*time.Millisecond), // remote for region-a
		{node: "region-a", class: "batch", res: load.Result{Class: load.ClassShed}},
		{node: "region-a", class: "batch", res: load.Result{Class: load.ClassOK, Engine: "a-0", TTFT: 30 * time.Millisecond}},
		{node: "region-a", class: "interactive", res: load.Result{Class: load.ClassTimeout}},
	}
	s := summarize(rs, 2*time.Second, topo)
	if s.Requests != 6 || s.OK != 4 || s.Shed != 1 || s.Errors != 1 {
		t.Errorf("counts %+v", s)
	}
	if s.OfferedRPS != 3 || s.ShedRPS != 0.5 {
		t.Errorf("rates offered %v shed %v, want 3 and 0.5", s.OfferedRPS, s.ShedRPS)
	}
	if s.RemoteShare != 0.25 {
		t.Errorf("remote share %v, want 0.25 (one of four answered)", s.RemoteShare)
	}
	if s.ShedByClass["batch"] != 0.5 || s.ShedByClass["interactive"] != 0 {
		t.Errorf("shed by class %v", s.ShedByClass)
	}
	if s.Engines["a-0"] != 2 || s.EngineTTFTP50Ms["b-0"] != 50 {
		t.Errorf("engines %v TTFT %v", s.Engines, s.EngineTTFTP50Ms)
	}
	if s.TTFTP50Ms < 20 || s.TTFTP50Ms > 30 || s.TTFTP99Ms < 49 {
		t.Errorf("TTFT p50 %v p99 %v", s.TTFTP50Ms, s.TTFTP99Ms)
	}
}

// TestFindingsSayWhatHappened: a finding reports a reaction only when the state shows one.
func TestFindingsSayWhatHappened(t *testing.T) {
	topo := demoTopology(t)
	p, err := newPlan(topo, time.Minute, 1)
	if err != nil {
		t.Fatal(err)
	}
	phases := func(surgeSnapshot string, penalty map[string]float64, shed int) []phaseReport {
		out := make([]phaseReport, len(story))
		for i, ph := range story {
			out[i] = phaseReport{Name: ph.name, Snapshot: "v1", RemoteWeightShare: map[string]float64{"region-a": 0.5},
				Nodes: map[string]stats{}, All: stats{Requests: 10, OK: 10 - shed, Shed: shed, Engines: map[string]int{},
					EngineTTFTP50Ms: map[string]float64{}, ShedByClass: map[string]float64{"batch": 0.4, "interactive": 0}}}
		}
		out[1].Snapshot, out[1].RemoteWeightShare["region-a"] = surgeSnapshot, 0.2
		out[2].SlowEngine, out[2].Penalties = p.slow, penalty
		return out
	}
	tests := []struct {
		name   string
		phases []phaseReport
		want   []string
	}{
		{"static system", phases("v1", nil, 0), []string{"did not change", "reported no penalty", "Nothing was shed"}},
		{"reacting system", phases("v2", map[string]float64{p.slow: 0.25}, 3),
			[]string{"went from 50% to 20%", "penalty as 0.25", "batch (priority 0) 40%"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			text := strings.Join(findings(p, tc.phases), "\n")
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("findings lack %q:\n%s", w, text)
				}
			}
		})
	}
}
