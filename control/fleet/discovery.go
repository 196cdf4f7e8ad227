package fleet

import (
	"fmt"
	"math"
	"strings"
)

// Discovery says where engines are found besides the file's engines list. The file keeps
// everything else (models, clusters, the RTT matrix, static weights).
type Discovery struct {
	Kubernetes *KubernetesDiscovery `yaml:"kubernetes"`
}

// KubernetesDiscovery finds engines in a Kubernetes cluster: the endpoints of Services
// selected by label (through their EndpointSlices), and the member pods of Gateway API
// Inference Extension InferencePools (inference.networking.k8s.io/v1).
type KubernetesDiscovery struct {
	// Kubeconfig is a kubeconfig file; empty means the pod's in-cluster service account.
	Kubeconfig string `yaml:"kubeconfig"`
	// Namespace is the namespace watched; empty means every namespace (and cluster-wide RBAC).
	Namespace string `yaml:"namespace"`
	// ZoneRegions maps a topology zone (an endpoint's zone, or a pod's
	// topology.kubernetes.io/zone label) to the fleet region its engines are in.
	ZoneRegions map[string]string `yaml:"zone_regions"`
	// Services are label selectors of EndpointSlices (which carry their Service's labels).
	Services []ServiceSource `yaml:"services"`
	// InferencePools are label selectors of InferencePools.
	InferencePools []PoolSource `yaml:"inference_pools"`
}

// ServiceSource is one set of Services whose ready endpoints are engines.
type ServiceSource struct {
	// Selector is a Kubernetes label selector ("app=vllm,tier in (gpu)"), matched against
	// EndpointSlice labels. Required.
	Selector string `yaml:"selector"`
	// Port is the EndpointSlice port name to use; empty means the slice's only port.
	Port           string `yaml:"port"`
	EngineDefaults `yaml:",inline"`
}

// PoolSource is one set of InferencePools whose member pods are engines, one per target port.
type PoolSource struct {
	// Selector is a label selector matched against InferencePool labels; empty means every
	// InferencePool in the namespace.
	Selector       string `yaml:"selector"`
	EngineDefaults `yaml:",inline"`
}

// EngineDefaults are what a discovered engine gets when its objects do not say otherwise
// (annotations meridian.dev/models and meridian.dev/capacity-rps, the label
// topology.kubernetes.io/region).
type EngineDefaults struct {
	Models []string `yaml:"models"`
	Region string   `yaml:"region"`
	// CapacityRPS defaults to the smallest capacity_rps of the engine's models.
	CapacityRPS float64 `yaml:"capacity_rps"`
	MaxInFlight int     `yaml:"max_in_flight"`
	// MetricsPath is the path of the engine's Prometheus metrics (default /metrics).
	MetricsPath string `yaml:"metrics_path"`
}

func (d *Discovery) validate(models map[string]bool) []*FieldError {
	var errs []*FieldError
	bad := func(path, format string, args ...any) {
		errs = append(errs, &FieldError{Path: path, Reason: fmt.Sprintf(format, args...)})
	}
	k := d.Kubernetes
	if k == nil {
		bad("discovery.kubernetes", "is required: the only discovery source is kubernetes")
		return errs
	}
	if len(k.Services) == 0 && len(k.InferencePools) == 0 {
		bad("discovery.kubernetes", "needs at least one of services or inference_pools")
	}
	for _, z := range sortedKeys(k.ZoneRegions) {
		if k.ZoneRegions[z] == "" {
			bad("discovery.kubernetes.zone_regions."+z, "region must not be empty")
		}
	}
	defaults := func(p string, d EngineDefaults) {
		for j, m := range d.Models {
			if !models[m] {
				bad(fmt.Sprintf("%s.models[%d]", p, j), "%q is not one of models[].name", m)
			}
		}
		if d.CapacityRPS < 0 || math.IsNaN(d.CapacityRPS) || math.IsInf(d.CapacityRPS, 0) {
			bad(p+".capacity_rps", "must be a finite number > 0, or absent (got %v)", d.CapacityRPS)
		}
		if d.MaxInFlight < 0 {
			bad(p+".max_in_flight", "must be >= 0 (got %d)", d.MaxInFlight)
		}
		if d.MetricsPath != "" && !strings.HasPrefix(d.MetricsPath, "/") {
			bad(p+".metrics_path", "%q must start with /", d.MetricsPath)
		}
	}
	for i, s := range k.Services {
		p := fmt.Sprintf("discovery.kubernetes.services[%d]", i)
		if strings.TrimSpace(s.Selector) == "" {
			bad(p+".selector", "is required: a label selector of the engines' Services")
		}
		defaults(p, s.EngineDefaults)
	}
	for i, s := range k.InferencePools {
		defaults(fmt.Sprintf("discovery.kubernetes.inference_pools[%d]", i), s.EngineDefaults)
	}
	return errs
}

// Discovered is an engine found outside the fleet file, and where: Object names it for a
// user ("EndpointSlice inference/llama-x7k2p"), and Fields maps an Engine field name
// (address, region, models, capacity_rps, ...) to where the object set it.
type Discovered struct {
	Engine Engine
	Object string
	Fields map[string]string
	// ServedModels says Engine.Models is what the engine itself serves (its /v1/models,
	// LoRA adapters included), not what a user named: models the fleet does not know are
	// dropped rather than refused, and only an engine serving none of them is left out.
	ServedModels bool
}

// WithDiscovered returns a copy of f whose engines are f's followed by the discovered ones
// that pass the checks an engine of the file passes (and have an RTT from every cluster).
// Each left-out engine's problems are returned as *FieldError whose File is the object and
// whose Path is the object's field. The result has at least one engine, or is nil.
func (f *Fleet) WithDiscovered(found []Discovered) (*Fleet, []error) {
	models := map[string]bool{}
	for _, m := range f.Models {
		models[m.Name] = true
	}
	engines := map[string]bool{}
	addrs := map[string]string{}
	for _, e := range f.Engines {
		engines[e.Name] = true
		addrs[e.Address] = e.Name
	}
	out := *f
	out.Engines = append([]Engine(nil), f.Engines...)
	var errs []error
	for _, d := range found {
		var mine []error
		bad := func(field, format string, args ...any) {
			path := field
			if p, ok := d.Fields[strings.SplitN(field, "[", 2)[0]]; ok {
				path = p
			}
			mine = append(mine, &FieldError{File: d.Object, Path: path, Reason: fmt.Sprintf(format, args...)})
		}
		if d.ServedModels {
			var known, other []string
			for _, m := range d.Engine.Models {
				if models[m] {
					known = append(known, m)
				} else {
					other = append(other, m)
				}
			}
			if len(known) == 0 {
				bad("models", "the engine serves %q, none of them one of models[].name: add its model to the fleet file, or name it in the meridian.dev/models annotation", other)
				errs = append(errs, mine...)
				continue
			}
			d.Engine.Models = known
		}
		probe := map[string]string{} // an engine left out must not claim its address
		for k, v := range addrs {
			probe[k] = v
		}
		validateEngine(d.Engine, models, engines, probe, bad)
		if d.Engine.Region != "" {
			for _, c := range f.Clusters {
				if _, ok := f.RTTMillis[c.Name][d.Engine.Region]; !ok {
					bad("region", "no RTT from cluster %q to region %q: add rtt_ms.%s.%s to the fleet file", c.Name, d.Engine.Region, c.Name, d.Engine.Region)
				}
			}
		}
		if len(mine) > 0 {
			errs = append(errs, mine...)
			continue
		}
		engines[d.Engine.Name] = true
		addrs[d.Engine.Address] = d.Engine.Name
		out.Engines = append(out.Engines, d.Engine)
	}
	if len(out.Engines) == 0 {
		return nil, append(errs, &FieldError{Path: "engines", Reason: "no engine in the file and none discovered yet"})
	}
	if more := out.Validate(); len(more) > 0 {
		return nil, append(errs, more...)
	}
	return &out, errs
}
