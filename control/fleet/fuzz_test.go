package fleet

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// FuzzParse feeds the fleet parser arbitrary bytes. Whatever it is given, Parse must not
// panic; a rejection must name the file; an accepted fleet must be valid, hold only finite
// numbers (the control server's LP refuses anything else), and survive a YAML round trip
// unchanged. Run it longer with: go test ./control/fleet -run '^$' -fuzz '^FuzzParse$' -fuzztime 30s
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		good,
		"",
		"models: [",
		"models: []\nclusters: []\nengines: []\n",
		strings.Replace(good, "capacity_rps: 20", "capacity_rps: .inf", 1),
		strings.Replace(good, "region-a: {a: 1, b: 40}", "region-a: {a: .nan, b: 40}", 1),
		strings.Replace(good, "a-0: 100", "a-0: 4294967295, a-1: 4294967295", 1),
		strings.Replace(good, "127.0.0.1:8001", "[::1]:8001", 1),
		strings.Replace(good, "max_in_flight: 64", "max_in_flight: -1", 1),
		strings.Replace(good, "capacity_rps: 10}", "capacity_rps: 10, bogus: 1}", 1),
		"models: &a [*a]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const name = "fuzz.yaml"
		fl, err := Parse(name, data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), name+": ") {
				t.Fatalf("the error does not name the file first: %v", err)
			}
			return
		}
		if errs := fl.Validate(); len(errs) > 0 {
			t.Fatalf("Parse accepted a fleet that Validate rejects: %v", errs)
		}
		if bad := nonFinite(fl); bad != "" {
			t.Fatalf("Parse accepted a non-finite number at %s", bad)
		}
		out, err := yaml.Marshal(fl)
		if err != nil {
			t.Fatalf("marshal an accepted fleet: %v", err)
		}
		again, err := Parse(name, out)
		if err != nil {
			t.Fatalf("an accepted fleet does not parse after a round trip: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(fl, again) {
			t.Fatalf("the round trip changed the fleet:\nbefore %+v\nafter  %+v", fl, again)
		}
	})
}

// nonFinite names the first NaN or infinite number of f, or returns "".
func nonFinite(f *Fleet) string {
	bad := func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }
	for _, e := range f.Engines {
		if bad(e.CapacityRPS) {
			return "engines[" + e.Name + "].capacity_rps"
		}
	}
	for c, row := range f.RTTMillis {
		for r, v := range row {
			if bad(v) {
				return "rtt_ms." + c + "." + r
			}
		}
	}
	return ""
}
