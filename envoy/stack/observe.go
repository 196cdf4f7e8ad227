package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/meridian-router/meridian/control/fleet"
)

// AccessEntry is one line of a node's JSON access log (bootstrap/envoy.yaml.tmpl).
type AccessEntry struct {
	Start        time.Time `json:"start"`
	Method       string    `json:"method"`
	Path         string    `json:"path"`
	Status       int       `json:"status"`
	Flags        string    `json:"flags"`
	Details      string    `json:"details"`
	UpstreamHost string    `json:"upstream_host"`
	// Destination is the sidecar's endpoint list ("" when the sidecar did not steer).
	Destination string `json:"destination"`
	Cluster     string `json:"cluster"`
	ServedBy    string `json:"served_by"`
	// Attempts counts upstream attempts: 1 + the retries Envoy made; 0 when none was made.
	Attempts   int    `json:"attempts"`
	DurationMS int    `json:"duration_ms"`
	TTFBMS     int    `json:"ttfb_ms"`
	RequestID  string `json:"request_id"`
	// Decision is the sidecar's, from its dynamic metadata (nil when it made none).
	Decision *AccessDecision `json:"decision"`
}

// AccessDecision is the sidecar's decision as the access log prints it (the bootstrap's
// %DYNAMIC_METADATA(meridian.decision)%; the names are /debug/decisions').
type AccessDecision struct {
	Result     string `json:"result"`
	Model      string `json:"model"`
	PrefixKey  string `json:"prefix_key"`
	Priority   int    `json:"priority"`
	Engines    string `json:"engines"`
	PassedOver bool   `json:"passed_over_for_load"`
	Overflowed bool   `json:"overflowed"`
	Retries    int    `json:"retries"`
	RetryOn    string `json:"retry_on"`
	Budget     int    `json:"retry_budget"`
	Status     int    `json:"status"`
}

// UnmarshalJSON takes the decision object, and leaves d empty for Envoy's placeholder of a
// missing value.
func (d *AccessDecision) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		return nil
	}
	type plain AccessDecision
	return json.Unmarshal(b, (*plain)(d))
}

// Primary is the sidecar's first choice ("" when it did not steer).
func (e AccessEntry) Primary() string {
	for i := 0; i < len(e.Destination); i++ {
		if e.Destination[i] == ',' {
			return e.Destination[:i]
		}
	}
	if e.Destination == "-" {
		return ""
	}
	return e.Destination
}

// ReadAccessLog reads every complete entry of a node's access log. Envoy flushes the file
// every 50 ms in a stack, so an entry appears shortly after its request ends.
func ReadAccessLog(path string) ([]AccessEntry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("access log: %w", err)
	}
	var out []AccessEntry
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var e AccessEntry
		if err := json.Unmarshal(line, &e); err != nil {
			if i == bytes.Count(data, []byte("\n")) {
				break // a last line still being written
			}
			return nil, fmt.Errorf("%s line %d: %w", path, i+1, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// Metrics is one scrape of a Prometheus endpoint, by family name.
type Metrics map[string]*dto.MetricFamily

// ScrapeMetrics reads a Prometheus text endpoint.
func ScrapeMetrics(ctx context.Context, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	return Metrics(fams), nil
}

// SidecarMetrics scrapes a node's sidecar.
func (s *Stack) SidecarMetrics(ctx context.Context, node string) (Metrics, error) {
	return ScrapeMetrics(ctx, s.Nodes[node].SidecarHTTP+"/metrics")
}

// ControlMetrics scrapes the control server.
func (s *Stack) ControlMetrics(ctx context.Context) (Metrics, error) {
	return ScrapeMetrics(ctx, s.ControlHTTP+"/metrics")
}

// matches reports whether m carries every label pair of kv (name, value, ...).
func matches(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == kv[i] && l.GetValue() == kv[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Value sums the counters, gauges or untyped samples of family name whose labels include
// the pairs kv (name, value, ...). A missing family sums to 0.
func (m Metrics) Value(name string, kv ...string) float64 {
	sum := 0.0
	for _, s := range m[name].GetMetric() {
		if matches(s, kv) {
			sum += sampleValue(s)
		}
	}
	return sum
}

func sampleValue(s *dto.Metric) float64 {
	switch {
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	case s.Untyped != nil:
		return s.GetUntyped().GetValue()
	}
	return 0
}

// ByLabel returns the summed value of family name per value of label.
func (m Metrics) ByLabel(name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m[name].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] += sampleValue(s)
			}
		}
	}
	return out
}

// Histogram is a cumulative histogram merged over the matching series of one family.
type Histogram struct {
	Count uint64
	// Bounds are the bucket upper bounds, ascending; Cumulative[i] counts samples <= Bounds[i].
	Bounds     []float64
	Cumulative []uint64
}

// Histogram merges the histograms of family name whose labels include kv.
func (m Metrics) Histogram(name string, kv ...string) Histogram {
	byBound := map[float64]uint64{}
	var h Histogram
	for _, s := range m[name].GetMetric() {
		if s.Histogram == nil || !matches(s, kv) {
			continue
		}
		h.Count += s.GetHistogram().GetSampleCount()
		for _, b := range s.GetHistogram().GetBucket() {
			byBound[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	for b := range byBound {
		h.Bounds = append(h.Bounds, b)
	}
	sort.Float64s(h.Bounds)
	for _, b := range h.Bounds {
		h.Cumulative = append(h.Cumulative, byBound[b])
	}
	return h
}

// Sub is h minus an earlier scrape of the same histogram: the samples in between.
func (h Histogram) Sub(before Histogram) Histogram {
	prev := map[float64]uint64{}
	for i, b := range before.Bounds {
		prev[b] = before.Cumulative[i]
	}
	out := Histogram{Count: h.Count - before.Count, Bounds: h.Bounds}
	for i, b := range h.Bounds {
		out.Cumulative = append(out.Cumulative, h.Cumulative[i]-prev[b])
	}
	return out
}

// QuantileBound is the upper bound of the bucket holding the q-quantile: the quantile is
// at most this. It is +Inf when the quantile lies past the last bound, NaN without samples.
func (h Histogram) QuantileBound(q float64) float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	rank := uint64(math.Ceil(q * float64(h.Count)))
	for i, c := range h.Cumulative {
		if c >= rank {
			return h.Bounds[i]
		}
	}
	return math.Inf(1)
}

// EngineFaults is the body of a mock engine's POST /admin/faults (examples/mockvllm).
type EngineFaults struct {
	ErrorRate         float64 `json:"error_rate"`
	ErrorStatus       int     `json:"error_status,omitempty"` // 0: 500
	LatencyMultiplier float64 `json:"latency_multiplier"`
	Hang              bool    `json:"hang"`
	CloseConnections  bool    `json:"close_connections"`
}

// NoFaults is a healthy engine's fault state.
func NoFaults() EngineFaults { return EngineFaults{LatencyMultiplier: 1} }

// SetFaults replaces an engine's injected faults.
func (s *Stack) SetFaults(ctx context.Context, engine string, f EngineFaults) error {
	e, ok := s.Engines[engine]
	if !ok {
		return fmt.Errorf("no engine %q in the stack", engine)
	}
	body, err := json.Marshal(f)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.Address+"/admin/faults", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("engine %s faults: %w", engine, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("engine %s faults: status %d", engine, resp.StatusCode)
	}
	return nil
}

// EditFleet applies edit to the fleet file the control server reads and rewrites it,
// atomically; the edited fleet must be valid. The control server picks it up on its
// next poll (100 ms in a stack).
func (s *Stack) EditFleet(edit func(*fleet.Fleet)) error {
	f, err := fleet.Load(s.FleetPath)
	if err != nil {
		return err
	}
	edit(f)
	data, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	if _, err := fleet.Parse(s.FleetPath, data); err != nil {
		return fmt.Errorf("edited fleet is invalid: %w", err)
	}
	return s.WriteFleetRaw(data)
}

// WriteFleetRaw replaces the fleet file with data as it is, valid or not (atomically, so
// the control server never reads half a file).
func (s *Stack) WriteFleetRaw(data []byte) error {
	tmp := s.FleetPath + ".raw.tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.FleetPath)
}

// ControlVersion is the snapshot version the control server last published (its
// /debug/state "version").
func (s *Stack) ControlVersion(ctx context.Context) (string, error) {
	var doc struct {
		Version string `json:"version"`
	}
	if err := getJSON(ctx, s.ControlHTTP+"/debug/state", &doc); err != nil {
		return "", err
	}
	return doc.Version, nil
}

// WaitSidecarVersion waits until node's sidecar routes on the snapshot version (its log's
// "routing updated ... version=<version>"): a published change has reached it.
func (s *Stack) WaitSidecarVersion(ctx context.Context, node, version string) error {
	want := []byte("version=" + version + " ")
	for {
		if b, err := os.ReadFile(s.Nodes[node].Sidecar.Log); err == nil && bytes.Contains(b, want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sidecar %s never routed on version %s: %w", node, version, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
