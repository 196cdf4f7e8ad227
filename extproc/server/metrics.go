package server

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Decision results, the "result" label of meridian_sidecar_decisions_total.
const (
	resultSteered      = "steered"
	resultShedQuota    = "shed_quota"
	resultShedLimit    = "shed_limit"
	resultBadRequest   = "bad_request"
	resultUnknownModel = "unknown_model"
	resultNoEngine     = "no_engine"
	resultPassThrough  = "pass_through" // not steerable; Envoy's own balancing takes it
)

// metrics are the sidecar's OpenTelemetry instruments, exported for Prometheus scraping.
// Attribute sets are cached per label value so that recording allocates nothing after
// the first request with that value.
type metrics struct {
	Registry *prometheus.Registry

	decisions metric.Int64Counter
	picks     metric.Int64Counter
	spills    metric.Int64Counter
	overflows metric.Int64Counter
	held      metric.Int64Counter
	retries   metric.Int64Histogram
	sheds     metric.Int64Counter
	latency   metric.Float64Histogram
	outcomes  metric.Int64Counter
	servedBy  metric.Int64Counter
	scrapes   metric.Int64Counter
	scrapeOK  metric.MeasurementOption
	scrapeErr metric.MeasurementOption
	placed    metric.Int64Counter
	sentOpt   metric.MeasurementOption
	adoptOpt  metric.MeasurementOption

	mu   sync.RWMutex
	opts map[[6]string]metric.MeasurementOption
}

// gauges are read at scrape time.
type gauges interface {
	penaltyFactors() map[string]float64
	inFlight() map[string]int64
	observedLoad() map[string]int64
	tablesBuilt() (view, penalties int64)
	homesExpired() int64
	peerCount() int64
	peerInFlight() map[string]int64
}

func newMetrics(g gauges) (*metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	meter := mp.Meter("github.com/meridian-router/meridian/extproc")
	m := &metrics{Registry: reg, opts: map[[6]string]metric.MeasurementOption{}}
	var errs [20]error
	m.decisions, errs[0] = meter.Int64Counter("meridian_sidecar_decisions", metric.WithDescription("Requests the sidecar decided on, by model and result."))
	m.picks, errs[1] = meter.Int64Counter("meridian_sidecar_picks", metric.WithDescription("Requests steered to each engine as primary."))
	m.spills, errs[2] = meter.Int64Counter("meridian_sidecar_spillovers", metric.WithDescription("Picks whose primary is not the key's first engine because of load."))
	m.overflows, errs[16] = meter.Int64Counter("meridian_sidecar_overflows",
		metric.WithDescription("Picks sent to an engine the node gives no share, because the engine picked would have queued them (picker.overflow_at)."))
	m.held, errs[17] = meter.Int64Counter("meridian_sidecar_quota_held",
		metric.WithDescription("Requests admitted while the control server asks to shed a share of their model, because their engine had room (shed.quota_at)."))
	m.retries, errs[3] = meter.Int64Histogram("meridian_sidecar_retries_allowed", metric.WithDescription("x-envoy-max-retries granted per request."),
		metric.WithExplicitBucketBoundaries(0, 1, 2, 3, 5))
	m.sheds, errs[4] = meter.Int64Counter("meridian_sidecar_sheds", metric.WithDescription("Requests answered 503 by the sidecar, by model, reason and priority."))
	m.latency, errs[5] = meter.Float64Histogram("meridian_sidecar_decision_duration_seconds", metric.WithUnit("s"),
		metric.WithDescription("Time from receiving the body to answering Envoy."),
		metric.WithExplicitBucketBoundaries(5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 1e-2))
	m.outcomes, errs[6] = meter.Int64Counter("meridian_sidecar_outcomes", metric.WithDescription("Completed requests reported by Envoy's access log, by engine and class."))
	m.servedBy, errs[10] = meter.Int64Counter("meridian_sidecar_served", metric.WithDescription("Steered requests by where a GIE gateway's served report says they were served: primary, fallback or unlisted."))
	m.scrapes, errs[12] = meter.Int64Counter("meridian_sidecar_engine_load_scrapes",
		metric.WithDescription("Scrapes of the engines' load gauges (engine_load), by result: ok or error."))
	m.scrapeOK, m.scrapeErr = metric.WithAttributes(attribute.String("result", "ok")), metric.WithAttributes(attribute.String("result", "error"))
	m.placed, errs[14] = meter.Int64Counter("meridian_sidecar_placements",
		metric.WithDescription("Prefix placements exchanged with the node's other sidecars, by direction: sent (this sidecar's) or adopted (its peers')."))
	m.sentOpt, m.adoptOpt = metric.WithAttributes(attribute.String("direction", "sent")), metric.WithAttributes(attribute.String("direction", "adopted"))
	var penalty, inflightGauge, observedGauge metric.Float64ObservableGauge
	var builds, expired metric.Int64ObservableCounter
	var peersGauge, peerInFlightGauge metric.Int64ObservableGauge
	peerInFlightGauge, errs[19] = meter.Int64ObservableGauge("meridian_sidecar_engine_peer_in_flight",
		metric.WithDescription("Requests in flight per engine from the node's other sidecars, as they last sent them (--peers)."))
	peersGauge, errs[18] = meter.Int64ObservableGauge("meridian_sidecar_peers",
		metric.WithDescription("The node's other sidecars whose requests in flight this sidecar holds (--peers)."))
	expired, errs[15] = meter.Int64ObservableCounter("meridian_sidecar_homes_expired",
		metric.WithDescription("Requests whose key's home had expired: its engine had written more into its KV cache than the cache holds since the key was placed there."))
	penalty, errs[7] = meter.Float64ObservableGauge("meridian_sidecar_engine_penalty", metric.WithDescription("Outlier weight multiplier per engine (1 = none)."))
	inflightGauge, errs[8] = meter.Float64ObservableGauge("meridian_sidecar_engine_in_flight", metric.WithDescription("Requests in flight from this sidecar per engine."))
	observedGauge, errs[13] = meter.Float64ObservableGauge("meridian_sidecar_engine_observed_work",
		metric.WithDescription("Work (prompt-token equivalents) other routers hold per engine, from its scraped queue (engine_load)."))
	builds, errs[11] = meter.Int64ObservableCounter("meridian_sidecar_routing_table_builds",
		metric.WithDescription("Routing tables built, by cause: an EDS update (view) or a change of the published penalties (penalties)."))
	viewCause, penaltyCause := metric.WithAttributes(attribute.String("cause", "view")), metric.WithAttributes(attribute.String("cause", "penalties"))
	_, errs[9] = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for e, f := range g.penaltyFactors() {
			o.ObserveFloat64(penalty, f, metric.WithAttributes(attribute.String("engine", e)))
		}
		for e, n := range g.inFlight() {
			o.ObserveFloat64(inflightGauge, float64(n), metric.WithAttributes(attribute.String("engine", e)))
		}
		for e, w := range g.observedLoad() {
			o.ObserveFloat64(observedGauge, float64(w), metric.WithAttributes(attribute.String("engine", e)))
		}
		view, pen := g.tablesBuilt()
		o.ObserveInt64(builds, view, viewCause)
		o.ObserveInt64(builds, pen, penaltyCause)
		o.ObserveInt64(expired, g.homesExpired())
		o.ObserveInt64(peersGauge, g.peerCount())
		for e, n := range g.peerInFlight() {
			o.ObserveInt64(peerInFlightGauge, n, metric.WithAttributes(attribute.String("engine", e)))
		}
		return nil
	}, penalty, inflightGauge, observedGauge, builds, expired, peersGauge, peerInFlightGauge)
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("sidecar metrics: %w", err)
		}
	}
	return m, nil
}

// scraped counts one engine-load scrape.
func (m *metrics) scraped(ok bool) {
	o := m.scrapeErr
	if ok {
		o = m.scrapeOK
	}
	m.scrapes.Add(context.Background(), 1, o)
}

// placements counts placements sent to or adopted from the node's other sidecars.
func (m *metrics) placements(sent, adopted int) {
	if sent > 0 {
		m.placed.Add(context.Background(), int64(sent), m.sentOpt)
	}
	if adopted > 0 {
		m.placed.Add(context.Background(), int64(adopted), m.adoptOpt)
	}
}

// opt returns the cached measurement option for up to three label pairs kv (name,
// value, ...). The array key keeps the lookup free of allocations.
func (m *metrics) opt(kv ...string) metric.MeasurementOption {
	var key [6]string
	copy(key[:], kv)
	m.mu.RLock()
	o, ok := m.opts[key]
	m.mu.RUnlock()
	if ok {
		return o
	}
	attrs := make([]attribute.KeyValue, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		attrs = append(attrs, attribute.String(kv[i], kv[i+1]))
	}
	o = metric.WithAttributeSet(attribute.NewSet(attrs...))
	m.mu.Lock()
	m.opts[key] = o
	m.mu.Unlock()
	return o
}

func (m *metrics) decision(ctx context.Context, model, result string) {
	m.decisions.Add(ctx, 1, m.opt("model", model, "result", result))
}

func (m *metrics) shed(ctx context.Context, model, reason string, priority int) {
	m.sheds.Add(ctx, 1, m.opt("model", model, "reason", reason, "priority", strconv.Itoa(priority)))
}
