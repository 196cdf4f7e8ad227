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

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/meridian-router/meridian/control/dashboard"
	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/xds"
	"github.com/meridian-router/meridian/envoy/resources"
)

// Config configures a control server.
type Config struct {
	FleetPath    string
	XDSListen    string // gRPC: ADS and the sidecars' load reports
	HTTPListen   string // health, metrics, introspection
	PollInterval time.Duration
	Log          *slog.Logger
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
	case c.Log == nil:
		return errors.New("a logger is required")
	}
	return nil
}

// Server is a running control server.
type Server struct {
	cfg     Config
	pub     *xds.Publisher
	metrics *metrics

	mu    sync.Mutex
	fleet *fleet.Fleet
}

type metrics struct {
	reg          *prometheus.Registry
	reloads      prometheus.Counter
	reloadErrors prometheus.Counter
	publishes    prometheus.Counter
	nacks        *prometheus.CounterVec
	version      prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		reg:          prometheus.NewRegistry(),
		reloads:      prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_control_fleet_reloads_total", Help: "Fleet files loaded and applied."}),
		reloadErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_control_fleet_reload_errors_total", Help: "Fleet files rejected; the last good one stayed in use."}),
		publishes:    prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_control_publishes_total", Help: "Snapshot versions published."}),
		nacks:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_control_xds_nacks_total", Help: "xDS responses rejected by a client."}, []string{"node", "type_url"}),
		version:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_control_snapshot_version", Help: "Number of snapshot versions this server instance has published."}),
	}
	m.reg.MustRegister(m.reloads, m.reloadErrors, m.publishes, m.nacks, m.version,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// New builds a server; Run starts it.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Server{
		cfg:     cfg,
		pub:     xds.NewPublisher(cfg.Log, resources.DefaultClusterOptions(), resources.DefaultRouteOptions()),
		metrics: newMetrics(),
	}, nil
}

// Run serves until ctx is done. It fails fast when the fleet file is invalid at start, since
// there is no last good one to fall back on.
func (s *Server) Run(ctx context.Context) error {
	f, err := fleet.Load(s.cfg.FleetPath)
	if err != nil {
		return err
	}
	if err := s.apply(ctx, f); err != nil {
		return err
	}
	xdsLn, err := net.Listen("tcp", s.cfg.XDSListen)
	if err != nil {
		return fmt.Errorf("xds listen on %s: %w", s.cfg.XDSListen, err)
	}
	httpLn, err := net.Listen("tcp", s.cfg.HTTPListen)
	if err != nil {
		xdsLn.Close()
		return fmt.Errorf("http listen on %s: %w", s.cfg.HTTPListen, err)
	}
	grpcSrv := grpc.NewServer(
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	xdsSrv := serverv3.NewServer(ctx, s.pub.Cache(), s.callbacks())
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(grpcSrv, xdsSrv)
	httpSrv := &http.Server{Handler: s.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
	s.cfg.Log.Info("control server listening", "xds", xdsLn.Addr().String(), "http", httpLn.Addr().String())

	errc := make(chan error, 2)
	go func() { errc <- grpcSrv.Serve(xdsLn) }()
	go func() { errc <- httpSrv.Serve(httpLn) }()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go fleet.Watch(watchCtx, s.cfg.FleetPath, s.cfg.PollInterval,
		func(f *fleet.Fleet) {
			if err := s.apply(watchCtx, f); err != nil {
				s.metrics.reloadErrors.Inc()
				s.cfg.Log.Error("fleet file rejected; keeping the last good one", "err", err)
			}
		},
		func(err error) {
			s.metrics.reloadErrors.Inc()
			s.cfg.Log.Error("fleet file rejected; keeping the last good one", "err", err)
		})

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

// apply publishes a new fleet. It is the single place a fleet becomes current: only after its
// snapshots were built and checked.
func (s *Server) apply(ctx context.Context, f *fleet.Fleet) error {
	plan, err := xds.BuildPlan(f, xds.StaticWeights(f))
	if err != nil {
		return err
	}
	changed, err := s.pub.Publish(ctx, plan)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.fleet = f
	s.mu.Unlock()
	s.metrics.reloads.Inc()
	if len(changed) > 0 {
		s.metrics.publishes.Inc()
		s.metrics.version.Set(float64(s.pub.Sequence()))
	}
	return nil
}

func (s *Server) callbacks() serverv3.Callbacks {
	return serverv3.CallbackFuncs{
		StreamRequestFunc: func(id int64, req *discoveryv3.DiscoveryRequest) error {
			if st := req.GetErrorDetail(); st != nil {
				node := req.GetNode().GetId()
				s.metrics.nacks.WithLabelValues(node, req.GetTypeUrl()).Inc()
				s.cfg.Log.Error("xDS NACK", "node", node, "type", req.GetTypeUrl(), "version", req.GetVersionInfo(), "reason", st.GetMessage())
			}
			return nil
		},
	}
}

func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if s.pub.Version() == "" {
			http.Error(w, "no snapshot published yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /dashboard/", http.StripPrefix("/dashboard", dashboard.Handler()))
	mux.Handle("GET /{$}", http.RedirectHandler("/dashboard/", http.StatusFound))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/state", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		s.mu.Lock()
		f := s.fleet
		s.mu.Unlock()
		_ = enc.Encode(buildState(f, s.pub.Plan(), s.pub.Version(), time.Now()))
	})
	return mux
}
