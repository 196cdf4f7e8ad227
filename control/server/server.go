package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"k8s.io/client-go/rest"

	"github.com/meridian-router/meridian/control/dashboard"
	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/leader"
	"github.com/meridian-router/meridian/control/optimizer"
	"github.com/meridian-router/meridian/control/signals"
	"github.com/meridian-router/meridian/control/xds"
	"github.com/meridian-router/meridian/enginemetrics"
	"github.com/meridian-router/meridian/mtls"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
	"github.com/meridian-router/meridian/xdsapi"
)

// Config configures a control server.
type Config struct {
	FleetPath    string
	XDSListen    string // gRPC: ADS and the sidecars' load reports
	HTTPListen   string // health, metrics, introspection
	PollInterval time.Duration
	// SolvePeriod is how often the optimizer runs.
	SolvePeriod time.Duration
	// ScrapeInterval is how often every engine's /metrics is scraped.
	ScrapeInterval time.Duration
	Signals        signals.Config
	Optimizer      optimizer.Config
	Log            *slog.Logger
	// KubeREST, when set, is the API server a fleet file's discovery section uses instead
	// of its kubeconfig or the in-cluster service account (tests).
	KubeREST *rest.Config
	// Leader, when set, runs this replica under leader election: only the leader serves
	// xDS; see ha.go. TakeoverHold is how long a new leader keeps the old leader's weights.
	Leader       *leader.Config
	TakeoverHold time.Duration
	// TLS, when set, makes the gRPC port mutual TLS: peers prove a sidecar's or an
	// Envoy's identity (docs/security.md). The files are re-read every TLSReload.
	TLS       mtls.Files
	TLSReload time.Duration
	// Insecure allows plaintext gRPC on a non-loopback XDSListen.
	Insecure bool
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	switch {
	case c.FleetPath == "":
		return errors.New("--fleet is required: the path of the fleet file")
	case c.XDSListen == "":
		return errors.New("--xds-listen is required")
	case c.HTTPListen == "":
		return errors.New("--http-listen is required")
	case c.PollInterval <= 0:
		return fmt.Errorf("--poll-interval must be > 0 (got %s)", c.PollInterval)
	case c.SolvePeriod <= 0:
		return fmt.Errorf("--solve-period must be > 0 (got %s)", c.SolvePeriod)
	case c.ScrapeInterval <= 0:
		return fmt.Errorf("--scrape-interval must be > 0 (got %s)", c.ScrapeInterval)
	case c.Log == nil:
		return errors.New("a logger is required")
	case c.TakeoverHold < 0:
		return fmt.Errorf("--takeover-hold must be >= 0 (got %s)", c.TakeoverHold)
	}
	if c.Leader != nil {
		if err := c.Leader.Validate(); err != nil {
			return err
		}
	}
	if c.TLS.Enabled() && c.TLSReload <= 0 {
		return fmt.Errorf("--tls-reload must be > 0 (got %s)", c.TLSReload)
	}
	if err := c.checkTransport(); err != nil {
		return err
	}
	if err := c.Signals.Validate(); err != nil {
		return err
	}
	return c.Optimizer.Validate()
}

// Server is a running control server.
type Server struct {
	cfg     Config
	pub     *xds.Publisher
	metrics *metrics
	reports *loadReports
	signals *signals.Aggregator
	ha      *ha
	tls     *mtls.Source // nil: plaintext
	ads     *adsAuth
	scrapes *scrapeLog

	// ctlMu serializes the control loop: fleet reloads and periodic solves.
	ctlMu sync.Mutex
	opt   *optimizer.Optimizer

	mu       sync.Mutex // guards what /debug/state reads
	fleet    *fleet.Fleet
	last     *optimizer.Result
	snap     signals.Snapshot
	solveErr error
}

type metrics struct {
	reg          *prometheus.Registry
	solveSeconds prometheus.Histogram
	solveErrors  prometheus.Counter
	objective    prometheus.Gauge
	shedRPS      prometheus.Gauge
	reloads      prometheus.Counter
	reloadErrors prometheus.Counter
	publishes    prometheus.Counter
	nacks        *prometheus.CounterVec
	version      prometheus.Gauge
	// handshakeFailures counts refused TLS handshakes on the gRPC port, by reason.
	handshakeFailures *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		solveSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meridian_control_solve_seconds", Help: "Time one optimizer solve took.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		solveErrors:  prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_control_solve_errors_total", Help: "Solves that failed; the last good weights stayed."}),
		objective:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_control_objective", Help: "Objective of the last solve (latency-seconds per second)."}),
		shedRPS:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_control_shed_rps", Help: "Requests/s the last solve asks the data plane to shed."}),
		reloads:      prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_control_fleet_reloads_total", Help: "Fleet files loaded and applied."}),
		reloadErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_control_fleet_reload_errors_total", Help: "Fleet files rejected; the last good one stayed in use."}),
		publishes:    prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_control_publishes_total", Help: "Snapshot versions published."}),
		nacks:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_control_xds_nacks_total", Help: "xDS responses rejected by a client."}, []string{"node", "type_url"}),
		version:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_control_snapshot_version", Help: "Number of snapshot versions this server instance has published."}),
		handshakeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_control_tls_handshake_failures_total",
			Help: "TLS handshakes on the gRPC port that failed, by reason."}, []string{"reason"}),
	}
	m.reg.MustRegister(m.solveSeconds, m.solveErrors, m.objective, m.shedRPS, m.reloads, m.reloadErrors, m.publishes, m.nacks, m.version, m.handshakeFailures,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// New builds a server; Run starts it.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opt, err := optimizer.New(cfg.Optimizer)
	if err != nil {
		return nil, err
	}
	agg, err := signals.NewAggregator(cfg.Signals, time.Now)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		pub:     xds.NewPublisher(cfg.Log, xdsapi.DefaultClusterOptions(), xdsapi.DefaultRouteOptions()),
		metrics: newMetrics(),
		signals: agg,
		opt:     opt,
	}
	if cfg.TLS.Enabled() {
		if s.tls, err = mtls.NewSource(cfg.TLS, mtls.Control(), cfg.Log); err != nil {
			return nil, fmt.Errorf("control server TLS: %w", err)
		}
	}
	gate := newReportGate(cfg.Log, s.currentFleet, s.pub.Plan)
	s.reports = newLoadReports(cfg.Log, gate, s.tls != nil, agg.ObserveReport, agg.ForgetSidecar)
	s.reports.placements = newPlacementRelay(gate, s.tls != nil, s.pub.Plan)
	s.ads = &adsAuth{tlsOn: s.tls != nil, fleet: s.currentFleet, refused: gate.refused, note: gate.note, streams: map[int64]*adsStream{}}
	s.scrapes = newScrapeLog(cfg.Log)
	s.metrics.reg.MustRegister(fleetCollector{s}, gate.refused, gate.dropped, s.scrapes.failures, s.reports.placements.relayed)
	s.ha = newHA(s)
	return s, nil
}

// currentFleet is the fleet in use (nil before the first).
func (s *Server) currentFleet() *fleet.Fleet {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fleet
}

// Run serves until ctx is done. It fails fast when the fleet file is invalid at start, since
// there is no last good one to fall back on.
func (s *Server) Run(ctx context.Context) error {
	f, err := fleet.Load(s.cfg.FleetPath)
	if err != nil {
		return err
	}
	if f.Discovery == nil {
		// One scrape before the first solve: an engine not running at start is logged and
		// gets no share of the first weights.
		s.scrapeOnce(ctx, &enginemetrics.Scraper{Client: &http.Client{Timeout: min(s.cfg.ScrapeInterval, 2*time.Second)}}, f)
		if err := s.apply(ctx, f); err != nil {
			return err
		}
	}
	xdsLn, err := s.listenXDS()
	if err != nil {
		return err
	}
	httpLn, err := net.Listen("tcp", s.cfg.HTTPListen)
	if err != nil {
		xdsLn.Close()
		return fmt.Errorf("http listen on %s: %w", s.cfg.HTTPListen, err)
	}
	grpcSrv := grpc.NewServer(append(s.transportOption(),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)...)
	xdsSrv := serverv3.NewServer(ctx, s.pub.Cache(), s.callbacks())
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(grpcSrv, xdsSrv)
	meridianv1.RegisterLoadReportingServer(grpcSrv, s.reports)
	// The dashboard's history: five minutes of /debug/state at 1 s, so a page opened
	// mid-incident shows what led up to it.
	hist, err := dashboard.NewHistory(func() any { return s.state() }, time.Second, 5*time.Minute)
	if err != nil {
		xdsLn.Close()
		httpLn.Close()
		return err
	}
	httpSrv := &http.Server{Handler: s.httpHandler(dashboard.HandlerWithHistory(hist)), ReadHeaderTimeout: 10 * time.Second}
	s.cfg.Log.Info("control server listening", "xds", xdsLn.Addr().String(), "http", httpLn.Addr().String(), "tls", s.tls != nil)

	errc := make(chan error, 3)
	go func() { errc <- grpcSrv.Serve(xdsLn) }()
	go func() { errc <- httpSrv.Serve(httpLn) }()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	comp := &composer{s: s}
	if err := comp.useFile(watchCtx, f); err != nil {
		grpcSrv.Stop()
		_ = httpSrv.Close()
		return err
	}
	if !comp.waitSynced(ctx, 30*time.Second) {
		s.cfg.Log.Warn("kubernetes discovery has not synced after 30s; serving without discovered engines until it does")
	}
	go fleet.Watch(watchCtx, s.cfg.FleetPath, s.cfg.PollInterval,
		func(f *fleet.Fleet) {
			if err := comp.useFile(watchCtx, f); err != nil {
				s.rejectFleet(err)
			}
		},
		func(err error) {
			s.rejectFleet(err)
		})

	go func() {
		if err := s.ha.run(watchCtx); err != nil {
			errc <- err
		}
	}()
	if s.tls != nil {
		go s.tls.Watch(watchCtx, s.cfg.TLSReload)
	}
	go s.solveLoop(watchCtx)
	go s.scrapeLoop(watchCtx)
	go hist.Run(watchCtx)

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	stopWatch()
	grpcSrv.Stop()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = httpSrv.Shutdown(sctx)
	if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// rejectFleet logs a rejected fleet file, then counts it: whoever sees the counter move
// finds the reason already in the log.
func (s *Server) rejectFleet(err error) {
	s.cfg.Log.Error("fleet file rejected; keeping the last good one", "err", err)
	s.metrics.reloadErrors.Inc()
}

// apply makes f the current fleet: solve for it and publish. It is the single place a
// fleet becomes current, and only after its snapshots were built and checked.
func (s *Server) apply(ctx context.Context, f *fleet.Fleet) error {
	s.ctlMu.Lock()
	defer s.ctlMu.Unlock()
	if err := s.step(ctx, f, true); err != nil {
		return err
	}
	s.metrics.reloads.Inc()
	return nil
}

// solveLoop re-solves every SolvePeriod on the fleet's latest reports.
func (s *Server) solveLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.SolvePeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		f := s.fleet
		s.mu.Unlock()
		if f == nil { // discovery has found no engine yet
			continue
		}
		s.ctlMu.Lock()
		if err := s.step(ctx, f, false); err != nil {
			s.cfg.Log.Error("publishing the new solution failed; the last good snapshot stays", "err", err)
		}
		s.ctlMu.Unlock()
	}
}

// scrapeLoop scrapes every engine's metrics every ScrapeInterval.
func (s *Server) scrapeLoop(ctx context.Context) {
	sc := &enginemetrics.Scraper{Client: &http.Client{Timeout: min(s.cfg.ScrapeInterval, 5*time.Second)}}
	t := time.NewTicker(s.cfg.ScrapeInterval)
	defer t.Stop()
	for {
		s.mu.Lock()
		f := s.fleet
		s.mu.Unlock()
		if f != nil {
			s.scrapeOnce(ctx, sc, f)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrapeOnce scrapes every engine of f once, logging and counting failures.
func (s *Server) scrapeOnce(ctx context.Context, sc *enginemetrics.Scraper, f *fleet.Fleet) {
	targets := make([]signals.Target, 0, len(f.Engines))
	names := make([]string, 0, len(f.Engines))
	urls := make(map[string]string, len(f.Engines))
	for _, e := range f.Engines {
		targets = append(targets, signals.Target{Engine: e.Name, URL: e.MetricsURL})
		names = append(names, e.Name)
		urls[e.Name] = e.MetricsURL
	}
	failed := s.signals.ScrapeAll(ctx, sc, targets, 16)
	if ctx.Err() == nil {
		s.scrapes.record(names, urls, failed, time.Now())
	}
}

// inputs turns the aggregated signals into the optimizer's inputs.
func (s *Server) inputs(f *fleet.Fleet) (optimizer.Inputs, signals.Snapshot) {
	specs := make([]signals.EngineSpec, 0, len(f.Engines))
	for _, e := range f.Engines {
		specs = append(specs, signals.EngineSpec{Name: e.Name, Models: e.Models, Capacity: e.CapacityRPS, Curve: s.cfg.Optimizer.DefaultCurve})
	}
	snap := s.signals.Snapshot(specs)
	return optimizer.InputsFrom(snap), snap
}

// step solves for fleet f and publishes when the weights moved enough or the fleet is new.
// A failed solve keeps the published weights (a new fleet without any solution yet gets
// capacity-proportional weights). Callers hold ctlMu.
func (s *Server) step(ctx context.Context, f *fleet.Fleet, newFleet bool) error {
	in, snap := s.inputs(f)
	start := time.Now()
	res, solveErr := s.opt.Step(ctx, f, in)
	s.metrics.solveSeconds.Observe(time.Since(start).Seconds())
	if solveErr != nil {
		s.metrics.solveErrors.Inc()
		s.cfg.Log.Error("solve failed; keeping the published weights", "err", solveErr)
	}
	s.mu.Lock()
	prev := s.last
	s.mu.Unlock()
	use := res
	if use == nil {
		use = prev
	}
	wf, holdEnded := s.ha.over(weightFunc(f, use))
	if newFleet || holdEnded || (res != nil && res.Changed) {
		plan, err := xds.BuildPlan(f, wf)
		if err != nil {
			return err
		}
		changed, err := s.pub.Publish(ctx, plan)
		if err != nil {
			return err
		}
		if len(changed) > 0 {
			s.metrics.publishes.Inc()
			s.metrics.version.Set(float64(s.pub.Sequence()))
		}
	}
	if res != nil {
		s.reports.setPolicies(res.Policies)
		s.metrics.objective.Set(res.Solution.Objective)
		s.metrics.shedRPS.Set(res.ShedRPS())
	}
	s.mu.Lock()
	s.fleet, s.snap, s.solveErr = f, snap, solveErr
	if res != nil {
		s.last = res
	}
	s.mu.Unlock()
	return nil
}

// weightFunc is the plan's weights: the fleet file's, the optimizer's, or by capacity.
func weightFunc(f *fleet.Fleet, res *optimizer.Result) xds.WeightFunc {
	var w map[string]map[string]map[string]uint32
	if res != nil {
		w = res.Weights
	}
	return xds.SolvedWeights(f, w)
}

func (s *Server) callbacks() serverv3.Callbacks {
	return serverv3.CallbackFuncs{
		StreamOpenFunc:         func(ctx context.Context, id int64, _ string) error { return s.ads.open(ctx, id) },
		StreamClosedFunc:       func(id int64, _ *corev3.Node) { s.ads.closed(id) },
		DeltaStreamOpenFunc:    func(ctx context.Context, id int64, _ string) error { return s.ads.open(ctx, id) },
		DeltaStreamClosedFunc:  func(id int64, _ *corev3.Node) { s.ads.closed(id) },
		StreamDeltaRequestFunc: func(id int64, req *discoveryv3.DeltaDiscoveryRequest) error { return s.ads.request(id, req.GetNode()) },
		StreamRequestFunc: func(id int64, req *discoveryv3.DiscoveryRequest) error {
			if err := s.ads.request(id, req.GetNode()); err != nil {
				return err
			}
			// Every node and type a client asks for gets its series at 0, so that the first
			// NACK shows in increase() and dashboards see the series before anything fails.
			node := req.GetNode().GetId()
			nacks := s.metrics.nacks.WithLabelValues(node, req.GetTypeUrl())
			if st := req.GetErrorDetail(); st != nil {
				nacks.Inc()
				s.cfg.Log.Error("xDS NACK", "node", node, "type", req.GetTypeUrl(), "version", req.GetVersionInfo(), "reason", st.GetMessage())
			}
			return nil
		},
	}
}

func (s *Server) httpHandler(dash http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if s.pub.Version() == "" {
			http.Error(w, "no snapshot published yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /dashboard/", http.StripPrefix("/dashboard", dash))
	mux.Handle("GET /{$}", http.RedirectHandler("/dashboard/", http.StatusFound))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/state", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.state())
	})
	return mux
}
