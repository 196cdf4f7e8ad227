package fleet

import (
	"errors"
	"strings"
	"testing"
)

const discoveryFleet = `
models:
  - {name: llama, capacity_rps: 8}
clusters:
  - {name: edge, region: a}
rtt_ms:
  edge: {a: 1, b: 30}
discovery:
  kubernetes:
    namespace: inference
    zone_regions: {a-1: a}
    services:
      - {selector: "app=vllm", port: http, models: [llama]}
`

func TestDiscoveryFileNeedsNoEngines(t *testing.T) {
	f, err := Parse("fleet.yaml", []byte(discoveryFleet))
	if err != nil {
		t.Fatalf("a fleet file with a discovery section and no engines is valid: %v", err)
	}
	if got := f.Discovery.Kubernetes.Services[0].Port; got != "http" {
		t.Fatalf("port = %q", got)
	}
	// Without the section, the file still needs engines and regions still need engines.
	noDisc := strings.Split(discoveryFleet, "discovery:")[0]
	_, err = Parse("fleet.yaml", []byte(noDisc))
	if err == nil || !strings.Contains(err.Error(), "engines: at least one engine is required") {
		t.Fatalf("err = %v", err)
	}
}

func TestDiscoverySectionErrorsNameFields(t *testing.T) {
	for _, c := range []struct{ edit, want string }{
		{`{selector: "app=vllm", port: http, models: [llama]}`, ""},
		{`{selector: "", models: [llama]}`, "discovery.kubernetes.services[0].selector: is required"},
		{`{selector: "a=b", models: [mistral]}`, `discovery.kubernetes.services[0].models[0]: "mistral" is not one of models[].name`},
		{`{selector: "a=b", capacity_rps: -1}`, "discovery.kubernetes.services[0].capacity_rps: must be a finite number > 0"},
		{`{selector: "a=b", metrics_path: metrics}`, `discovery.kubernetes.services[0].metrics_path: "metrics" must start with /`},
		{`{selector: "a=b", bogus: 1}`, "field bogus not found"},
	} {
		data := strings.Replace(discoveryFleet, `{selector: "app=vllm", port: http, models: [llama]}`, c.edit, 1)
		_, err := Parse("fleet.yaml", []byte(data))
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", c.edit, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.edit, err, c.want)
		}
	}
}

func TestWithDiscoveredSkipsBadEnginesAndNamesTheObject(t *testing.T) {
	f, err := Parse("fleet.yaml", []byte(discoveryFleet))
	if err != nil {
		t.Fatal(err)
	}
	eng := func(name, addr, region string, capacity float64) Discovered {
		return Discovered{
			Engine: Engine{Name: name, Address: addr, Region: region, Models: []string{"llama"}, CapacityRPS: capacity},
			Object: "EndpointSlice inference/" + name,
			Fields: map[string]string{"address": "endpoints[0].addresses[0]", "capacity_rps": "metadata.annotations[meridian.dev/capacity-rps]", "region": "endpoints[0].zone"},
		}
	}
	found := []Discovered{
		eng("e0", "10.0.0.1:8000", "a", 8),
		eng("e1", "10.0.0.2:8000", "a", 0),  // bad capacity
		eng("e2", "10.0.0.1:8000", "a", 8),  // address taken by e0
		eng("e3", "10.0.0.3:8000", "c", 8),  // no RTT to region c
		eng("e4", "10.0.0.2:8000", "b", 8),  // takes the address e1 (left out) did not keep
		eng("e5", "not-an-ip:8000", "a", 8), // bad address
	}
	got, problems := f.WithDiscovered(found)
	if got == nil {
		t.Fatalf("no fleet: %v", problems)
	}
	var names []string
	for _, e := range got.Engines {
		names = append(names, e.Name)
	}
	if strings.Join(names, ",") != "e0,e4" {
		t.Fatalf("engines = %v, want e0,e4 (the others are invalid)", names)
	}
	want := map[string]string{
		"EndpointSlice inference/e1": "metadata.annotations[meridian.dev/capacity-rps]: must be a finite number > 0",
		"EndpointSlice inference/e2": "endpoints[0].addresses[0]: 10.0.0.1:8000 is also the address of engine \"e0\"",
		"EndpointSlice inference/e3": `endpoints[0].zone: no RTT from cluster "edge" to region "c": add rtt_ms.edge.c`,
		"EndpointSlice inference/e5": "endpoints[0].addresses[0]: \"not-an-ip:8000\" is not ip:port",
	}
	if len(problems) != len(want) {
		t.Fatalf("problems = %v", problems)
	}
	for _, p := range problems {
		var fe *FieldError
		if !errors.As(p, &fe) {
			t.Fatalf("problem %v is not a *FieldError", p)
		}
		if w, ok := want[fe.File]; !ok || !strings.Contains(fe.Error(), w) {
			t.Errorf("problem %q, want for %s: %q", fe.Error(), fe.File, w)
		}
	}
	if len(f.Engines) != 0 {
		t.Fatal("WithDiscovered changed its receiver")
	}
	if none, problems := f.WithDiscovered(nil); none != nil || len(problems) != 1 {
		t.Fatalf("no engines at all: fleet %v, problems %v; want nil and one problem", none, problems)
	}
}

// TestDiscoveredServedModels: an engine whose models are what it serves (its /v1/models)
// keeps the fleet's models among them and drops the rest; serving none of them leaves it
// out, naming where the models came from.
func TestDiscoveredServedModels(t *testing.T) {
	f, err := Parse("fleet.yaml", []byte(discoveryFleet))
	if err != nil {
		t.Fatal(err)
	}
	served := []string{"llama", "sql-lora"}
	fields := map[string]string{"models": "GET http://10.0.0.2:8000/v1/models"}
	found := []Discovered{
		{Engine: Engine{Name: "ns/p/a", Address: "10.0.0.1:8000", Region: "a", Models: []string{"llama", "sql-lora"}, CapacityRPS: 8}, Object: "Pod ns/a", ServedModels: true},
		{Engine: Engine{Name: "ns/p/b", Address: "10.0.0.2:8000", Region: "a", Models: []string{"mistral"}, CapacityRPS: 8}, Object: "Pod ns/b", Fields: fields, ServedModels: true},
		{Engine: Engine{Name: "ns/p/c", Address: "10.0.0.3:8000", Region: "a", Models: served, CapacityRPS: 8}, Object: "Pod ns/c"},
	}
	got, problems := f.WithDiscovered(found)
	if got == nil || len(got.Engines) != 1 || got.Engines[0].Name != "ns/p/a" || strings.Join(got.Engines[0].Models, ",") != "llama" {
		t.Fatalf("engines %+v, want ns/p/a serving llama only", got)
	}
	if strings.Join(found[0].Engine.Models, ",") != "llama,sql-lora" {
		t.Errorf("the caller's models were changed: %v", found[0].Engine.Models)
	}
	all := errors.Join(problems...).Error()
	for _, want := range []string{
		`GET http://10.0.0.2:8000/v1/models: the engine serves ["mistral"], none of them one of models[].name`,
		`models[1]: "sql-lora" is not one of models[].name`, // a user's list is checked whole
	} {
		if !strings.Contains(all, want) {
			t.Errorf("problems %q lack %q", all, want)
		}
	}
}
