package chaos

import (
	"bytes"
	"context"
	"maps"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/envoy/stack"
)

// badFleet is one kind of mistake in a fleet file and what its error must name.
type badFleet struct {
	name  string
	edit  func(f *fleet.Fleet) // a mistake the YAML can carry
	raw   func(good []byte) []byte
	field string // field path (or line) the error names
	why   string // part of the reason
}

func badFleets() []badFleet {
	return []badFleet{
		{name: "YAML syntax", raw: func([]byte) []byte { return []byte("models: [\n  - name: x\n") }, field: "line", why: "decode YAML"},
		{name: "empty file", raw: func([]byte) []byte { return nil }, field: "(file)", why: "is empty"},
		{name: "unknown field", raw: func(g []byte) []byte {
			return bytes.Replace(g, []byte("capacity_rps:"), []byte("capacity: 5\n      capacity_rps:"), 1)
		}, field: "field capacity not found", why: "line"},
		{name: "wrong type", raw: func(g []byte) []byte {
			return bytes.Replace(g, []byte("capacity_rps: 25"), []byte("capacity_rps: fast"), 1)
		}, field: "line", why: "cannot unmarshal"},
		{name: "no models", edit: func(f *fleet.Fleet) { f.Models = nil }, field: "models", why: "at least one model"},
		{name: "duplicate engine", edit: func(f *fleet.Fleet) { f.Engines[1].Name = f.Engines[0].Name }, field: "engines[1].name", why: "listed twice"},
		{name: "host name address", edit: func(f *fleet.Fleet) { f.Engines[0].Address = "localhost:8000" }, field: "engines[0].address", why: "not ip:port"},
		{name: "duplicate address", edit: func(f *fleet.Fleet) { f.Engines[2].Address = f.Engines[0].Address }, field: "engines[2].address", why: "also the address"},
		{name: "unknown model on an engine", edit: func(f *fleet.Fleet) { f.Engines[0].Models = []string{"nope"} }, field: "engines[0].models[0]", why: "not one of models"},
		{name: "zero capacity", edit: func(f *fleet.Fleet) { f.Engines[1].CapacityRPS = 0 }, field: "engines[1].capacity_rps", why: "> 0"},
		{name: "negative max_in_flight", edit: func(f *fleet.Fleet) { f.Engines[0].MaxInFlight = -1 }, field: "engines[0].max_in_flight", why: ">= 0"},
		{name: "missing RTT", edit: func(f *fleet.Fleet) { f.RTTMillis = nil }, field: "rtt_ms." + node, why: "missing"},
		{name: "weight for an unknown engine", edit: func(f *fleet.Fleet) { f.Weights[node]["ghost"] = 5 }, field: "weights." + node + ".ghost", why: "not one of engines"},
		{name: "all weights zero", edit: func(f *fleet.Fleet) {
			for e := range f.Weights[node] {
				f.Weights[node][e] = 0
			}
		}, field: "weights." + node, why: "every weight is 0"},
		{name: "unknown default model", edit: func(f *fleet.Fleet) { f.DefaultModel = "nope" }, field: "default_model", why: "not one of models"},
		{name: "infinite capacity", edit: func(f *fleet.Fleet) { f.Engines[0].CapacityRPS = math.Inf(1) }, field: "engines[0].capacity_rps", why: "finite"},
		{name: "infinite RTT", edit: func(f *fleet.Fleet) { f.RTTMillis[node]["a"] = math.Inf(1) }, field: "rtt_ms." + node + ".a", why: "finite"},
		// Envoy does not NACK this: its Maglev fallback assumes validated weights.
		{name: "weights summing past 2^32", edit: func(f *fleet.Fleet) {
			f.Weights[node] = map[string]uint32{"e0": 1<<32 - 1, "e1": 1<<32 - 1, "e2": 1}
		}, field: "weights." + node, why: "4294967295"},
	}
}

// TestChaosBadConfig feeds a running control server invalid fleet files of every kind:
// each is rejected with an error naming the file, the field and the reason, counted in
// meridian_control_fleet_reload_errors_total, and the last good snapshot keeps being
// served (Envoy's weights do not move, nothing reaches Envoy to NACK). A good file
// afterwards is applied at once.
func TestChaosBadConfig(t *testing.T) {
	good := map[string]uint32{"e0": 10, "e1": 20, "e2": 30}
	s := startStack(t, withCapacity(oneNode(3, good), 25))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	goodYAML, err := os.ReadFile(s.FleetPath)
	if err != nil {
		t.Fatal(err)
	}
	version := publishedVersion(ctx, t, s)
	rejected := 0
	for _, c := range badFleets() {
		data := c.mutate(t, goodYAML)
		if _, err := fleet.Parse(s.FleetPath, data); err == nil {
			t.Errorf("%s: the fleet parser accepts it", c.name)
			continue
		}
		logBefore := controlLog(t, s)
		errsBefore := controlValue(ctx, t, s, "meridian_control_fleet_reload_errors_total")
		if err := s.WriteFleetRaw(data); err != nil {
			t.Fatal(err)
		}
		if !waitFor(5*time.Second, func() bool {
			return controlValue(ctx, t, s, "meridian_control_fleet_reload_errors_total") > errsBefore
		}) {
			t.Errorf("%s: not counted in meridian_control_fleet_reload_errors_total within 5s", c.name)
			continue
		}
		rejected++
		line := lastRejection(controlLog(t, s)[len(logBefore):])
		for _, want := range []string{s.FleetPath, c.field, c.why} {
			if !strings.Contains(line, want) {
				t.Errorf("%s: the control server's error does not name %q: %s", c.name, want, line)
			}
		}
		if v := publishedVersion(ctx, t, s); v != version {
			t.Errorf("%s: the control server published version %s (was %s) from an invalid file", c.name, v, version)
		}
	}
	figure(t, "bad_fleet_kinds_rejected", rejected)
	if got := envoyWeightsByName(ctx, t, s); !maps.Equal(got, good) {
		t.Errorf("after %d invalid fleet files Envoy holds %v, want the last good %v", rejected, got, good)
	}

	nacks := controlValue(ctx, t, s, "meridian_control_xds_nacks_total")
	figure(t, "xds_nacks", nacks)
	if nacks != 0 {
		t.Errorf("Envoy NACKed %v responses: something invalid was published", nacks)
	}

	next := map[string]uint32{"e0": 30, "e1": 20, "e2": 10}
	if err := s.WriteFleet(map[string]map[string]uint32{node: next}); err != nil {
		t.Fatal(err)
	}
	waitEnvoyWeights(ctx, t, s, next, 5*time.Second)
}

// mutate returns the bad file's bytes, made from the good file.
func (c badFleet) mutate(t *testing.T, good []byte) []byte {
	t.Helper()
	if c.raw != nil {
		return c.raw(good)
	}
	var f fleet.Fleet
	if err := yaml.Unmarshal(good, &f); err != nil {
		t.Fatal(err)
	}
	c.edit(&f)
	out, err := yaml.Marshal(&f)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func publishedVersion(ctx context.Context, t *testing.T, s *stack.Stack) string {
	t.Helper()
	v, err := s.ControlVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func controlValue(ctx context.Context, t *testing.T, s *stack.Stack, name string) float64 {
	t.Helper()
	m, err := s.ControlMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m.Value(name)
}

func controlLog(t *testing.T, s *stack.Stack) string {
	t.Helper()
	b, err := os.ReadFile(s.Control.Log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lastRejection is the last "fleet file rejected" line of a log excerpt.
func lastRejection(log string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "fleet file rejected") {
			return lines[i]
		}
	}
	return "(no rejection logged)"
}

func waitFor(d time.Duration, ok func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if ok() {
			return true
		}
	}
	return ok()
}
