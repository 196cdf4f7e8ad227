package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// Fleet is a validated fleet file. See docs/configuration.md for the schema.
type Fleet struct {
	// Models are the model names the fleet serves, in file order.
	Models []Model `yaml:"models"`
	// DefaultModel receives requests the sidecar could not classify (for example while the
	// sidecar is down and Envoy fails open). Defaults to the first model.
	DefaultModel string `yaml:"default_model"`
	// Clusters are the data-plane clusters. Each name is the node.id of its Envoys.
	Clusters []Cluster `yaml:"clusters"`
	Engines  []Engine  `yaml:"engines"`
	// RTTMillis is the network round trip in milliseconds from each data-plane cluster
	// (outer key) to each engine region (inner key).
	RTTMillis map[string]map[string]float64 `yaml:"rtt_ms"`
	// Weights are static EDS weights per data-plane cluster and engine name. When a
	// cluster has an entry here, the optimizer does not set that cluster's weights.
	// A weight of 0 leaves the engine out of that cluster's assignment.
	Weights map[string]map[string]uint32 `yaml:"weights"`
	// Discovery, when set, finds more engines in a Kubernetes cluster; Engines may then be
	// empty. See Discovery.
	Discovery *Discovery `yaml:"discovery"`
}

// Model is one served model.
type Model struct {
	Name string `yaml:"name"`
	// CapacityRPS is the capacity of a discovered engine serving this model when neither
	// its objects nor its discovery source say (optional).
	CapacityRPS float64 `yaml:"capacity_rps"`
	// PrefillShare is the share of a request's engine time its prompt's prefill takes
	// when nothing of it is cached, for this model's traffic (optional, in [0, 1); 0: no
	// credit). It is the part of an engine's capacity_rps the prefix cache can give back:
	// see Fleet.PrefillShare.
	PrefillShare float64 `yaml:"prefill_share"`
}

// Cluster is one data-plane cluster: a set of Envoys (and their sidecars) that share a node id.
type Cluster struct {
	Name   string `yaml:"name"`
	Region string `yaml:"region"`
	// DecisionsURL is the cluster's sidecar /debug/decisions as an operator's browser
	// reaches it (optional; http or https). The dashboard links each engine to the recent
	// decisions there that picked it. With several sidecar replicas it is one replica's.
	DecisionsURL string `yaml:"decisions_url,omitempty"`
}

// Engine is one inference engine (a vLLM server or compatible).
type Engine struct {
	Name string `yaml:"name"`
	// Address is "ip:port". Envoy's override_host needs a literal IP.
	Address string   `yaml:"address"`
	Region  string   `yaml:"region"`
	Models  []string `yaml:"models"`
	// CapacityRPS is the request rate the engine sustains at its latency target, for
	// requests none of whose prompt is in its prefix cache.
	CapacityRPS float64 `yaml:"capacity_rps"`
	// PrefillShare overrides its models' prefill_share for this engine (optional, in
	// [0, 1); 0: the models' value).
	PrefillShare float64 `yaml:"prefill_share"`
	// MaxInFlight is the local hard limit of concurrent requests a sidecar sends it (0: none).
	MaxInFlight int `yaml:"max_in_flight"`
	// MetricsURL is where the engine's Prometheus metrics are scraped. Defaults to
	// http://<address>/metrics.
	MetricsURL string `yaml:"metrics_url"`
	// Draining engines keep their in-flight requests but receive no new ones.
	Draining bool `yaml:"draining"`
}

// FieldError is a validation error for one field of one fleet file.
type FieldError struct {
	File   string
	Path   string
	Reason string
}

func (e *FieldError) Error() string {
	if e.File == "" {
		return fmt.Sprintf("%s: %s", e.Path, e.Reason)
	}
	return fmt.Sprintf("%s: %s: %s", e.File, e.Path, e.Reason)
}

// Load reads, decodes and validates the fleet file at path.
func Load(path string) (*Fleet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read fleet file: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and validates a fleet file's contents; name is used in error messages.
func Parse(name string, data []byte) (*Fleet, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f Fleet
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &FieldError{File: name, Path: "(file)", Reason: "is empty"}
		}
		return nil, fmt.Errorf("%s: decode YAML: %w", name, err)
	}
	f.applyDefaults()
	if errs := f.Validate(); len(errs) > 0 {
		for _, e := range errs {
			var fe *FieldError
			if errors.As(e, &fe) {
				fe.File = name
			}
		}
		return nil, errors.Join(errs...)
	}
	return &f, nil
}

func (f *Fleet) applyDefaults() {
	if f.DefaultModel == "" && len(f.Models) > 0 {
		f.DefaultModel = f.Models[0].Name
	}
	for i := range f.Engines {
		if f.Engines[i].MetricsURL == "" && f.Engines[i].Address != "" {
			f.Engines[i].MetricsURL = "http://" + f.Engines[i].Address + "/metrics"
		}
	}
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

// Validate checks the whole file and returns every problem it finds, each a *FieldError.
// It does not modify f.
func (f *Fleet) Validate() []error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, &FieldError{Path: path, Reason: fmt.Sprintf(format, args...)})
	}
	if len(f.Models) == 0 {
		bad("models", "at least one model is required")
	}
	models := map[string]bool{}
	for i, m := range f.Models {
		p := fmt.Sprintf("models[%d].name", i)
		switch {
		case !nameRE.MatchString(m.Name):
			bad(p, "%q is not a valid model name (letters, digits and ._:/- only, at most 128)", m.Name)
		case models[m.Name]:
			bad(p, "model %q is listed twice", m.Name)
		}
		models[m.Name] = true
		if m.CapacityRPS < 0 || math.IsNaN(m.CapacityRPS) || math.IsInf(m.CapacityRPS, 0) {
			bad(fmt.Sprintf("models[%d].capacity_rps", i), "must be a finite number > 0, or absent (got %v)", m.CapacityRPS)
		}
		if !validShare(m.PrefillShare) {
			bad(fmt.Sprintf("models[%d].prefill_share", i), "must be in [0, 1), or absent (got %v)", m.PrefillShare)
		}
	}
	if f.DefaultModel != "" && !models[f.DefaultModel] {
		bad("default_model", "%q is not one of models[].name", f.DefaultModel)
	}
	if len(f.Clusters) == 0 {
		bad("clusters", "at least one data-plane cluster is required")
	}
	clusters := map[string]bool{}
	for i, c := range f.Clusters {
		p := fmt.Sprintf("clusters[%d]", i)
		switch {
		case !nameRE.MatchString(c.Name):
			bad(p+".name", "%q is not a valid cluster name", c.Name)
		case clusters[c.Name]:
			bad(p+".name", "cluster %q is listed twice", c.Name)
		}
		clusters[c.Name] = true
		if c.Region == "" {
			bad(p+".region", "is required")
		}
		if c.DecisionsURL != "" {
			u, err := url.Parse(c.DecisionsURL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
				bad(p+".decisions_url", "%q is not an http(s) URL without a query (for example http://127.0.0.1:19081/debug/decisions)", c.DecisionsURL)
			}
		}
	}
	if len(f.Engines) == 0 && f.Discovery == nil {
		bad("engines", "at least one engine is required (or a discovery section that finds them)")
	}
	if f.Discovery != nil {
		for _, e := range f.Discovery.validate(models) {
			bad(e.Path, "%s", e.Reason)
		}
	}
	engines := map[string]bool{}
	addrs := map[string]string{}
	regions := map[string]bool{}
	for i, e := range f.Engines {
		p := fmt.Sprintf("engines[%d]", i)
		validateEngine(e, models, engines, addrs, func(field, format string, args ...any) {
			bad(p+"."+field, format, args...)
		})
		engines[e.Name] = true
		regions[e.Region] = true
	}
	for _, c := range f.Clusters {
		row, ok := f.RTTMillis[c.Name]
		if !ok {
			bad("rtt_ms."+c.Name, "missing: every data-plane cluster needs an RTT to every engine region")
			continue
		}
		for _, r := range sortedKeys(regions) {
			if v, ok := row[r]; !ok {
				bad("rtt_ms."+c.Name+"."+r, "missing: no RTT from cluster %q to region %q", c.Name, r)
			} else if !(v >= 0) || math.IsInf(v, 0) {
				bad("rtt_ms."+c.Name+"."+r, "must be a finite number >= 0 (got %v)", v)
			}
		}
	}
	for _, cn := range sortedKeys(f.RTTMillis) {
		if !clusters[cn] {
			bad("rtt_ms."+cn, "%q is not one of clusters[].name", cn)
			continue
		}
		for _, r := range sortedKeys(f.RTTMillis[cn]) {
			// Discovered engines may come from regions no listed engine is in yet.
			if !regions[r] && f.Discovery == nil {
				bad("rtt_ms."+cn+"."+r, "%q is not the region of any engine", r)
			}
		}
	}
	for _, cn := range sortedKeys(f.Weights) {
		if !clusters[cn] {
			bad("weights."+cn, "%q is not one of clusters[].name", cn)
			continue
		}
		var sum uint64
		for _, en := range sortedKeys(f.Weights[cn]) {
			if !engines[en] {
				bad("weights."+cn+"."+en, "%q is not one of engines[].name", en)
			}
			sum += uint64(f.Weights[cn][en])
		}
		switch {
		case sum == 0:
			bad("weights."+cn, "every weight is 0: the cluster would have no engine")
		case sum > math.MaxUint32:
			bad("weights."+cn, "weights sum to %d; Envoy allows at most %d per cluster", sum, uint64(math.MaxUint32))
		}
	}
	return errs
}

// validateEngine checks one engine against the fleet's models and the engines before it
// (names and addresses), reporting each problem with the engine's field name.
func validateEngine(e Engine, models, engines map[string]bool, addrs map[string]string, bad func(field, format string, args ...any)) {
	switch {
	case !nameRE.MatchString(e.Name):
		bad("name", "%q is not a valid engine name", e.Name)
	case engines[e.Name]:
		bad("name", "engine %q is listed twice", e.Name)
	}
	if ap, err := netip.ParseAddrPort(e.Address); err != nil {
		bad("address", "%q is not ip:port (a literal IP is required: Envoy's override_host matches on it)", e.Address)
	} else if ap.Port() == 0 {
		bad("address", "port must not be 0")
	} else if other, dup := addrs[e.Address]; dup {
		bad("address", "%s is also the address of engine %q", e.Address, other)
	} else {
		addrs[e.Address] = e.Name
	}
	if e.Region == "" {
		bad("region", "is required")
	}
	if len(e.Models) == 0 {
		bad("models", "at least one model is required")
	}
	for j, m := range e.Models {
		if !models[m] {
			bad(fmt.Sprintf("models[%d]", j), "%q is not one of models[].name", m)
		}
	}
	if !(e.CapacityRPS > 0) || math.IsInf(e.CapacityRPS, 0) {
		bad("capacity_rps", "must be a finite number > 0 (got %v)", e.CapacityRPS)
	}
	if !validShare(e.PrefillShare) {
		bad("prefill_share", "must be in [0, 1), or absent (got %v)", e.PrefillShare)
	}
	if e.MaxInFlight < 0 {
		bad("max_in_flight", "must be >= 0 (got %d)", e.MaxInFlight)
	}
	if e.MetricsURL != "" && !strings.HasPrefix(e.MetricsURL, "http://") && !strings.HasPrefix(e.MetricsURL, "https://") {
		bad("metrics_url", "%q must start with http:// or https://", e.MetricsURL)
	}
}

// validShare reports whether a prefill share is usable: in [0, 1).
func validShare(v float64) bool { return v >= 0 && v < 1 }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Engine returns the engine with the given name.
func (f *Fleet) Engine(name string) (Engine, bool) {
	for _, e := range f.Engines {
		if e.Name == name {
			return e, true
		}
	}
	return Engine{}, false
}

// PrefillShare is the share of engine e's time a request's prefill takes when none of its
// prompt is cached: e's own prefill_share, else the smallest of its models' (the least
// its prefix cache can give back), 0 when none is set. A prefix cache that serves a
// fraction h of the prompt tokens sent to e saves PrefillShare x h of a cold request's
// engine time, so e then sustains capacity_rps / (1 - PrefillShare x h) requests/s.
func (f *Fleet) PrefillShare(e Engine) float64 {
	if e.PrefillShare > 0 {
		return e.PrefillShare
	}
	share, found := 0.0, false
	for _, fm := range f.Models {
		if e.Serves(fm.Name) && (!found || fm.PrefillShare < share) {
			share, found = fm.PrefillShare, true
		}
	}
	return share
}

// Serves reports whether engine e serves model m.
func (e Engine) Serves(model string) bool {
	for _, m := range e.Models {
		if m == model {
			return true
		}
	}
	return false
}

// RTTSeconds is the round trip from data-plane cluster c to engine e, in seconds.
func (f *Fleet) RTTSeconds(cluster string, e Engine) float64 {
	return f.RTTMillis[cluster][e.Region] / 1000
}
