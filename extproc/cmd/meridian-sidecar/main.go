// Command meridian-sidecar is the ext_proc server that runs beside each Envoy. It subscribes
// to the control server with its Envoy's node id and picks, for every request, an ordered
// list of engines from that cached view.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/extproc/xdsclient"
	"github.com/meridian-router/meridian/mtls"
)

type flags struct {
	config     string
	sidecarID  string
	nodeID     string
	listen     string
	httpListen string
	control    string
	peerListen string
	peers      string
	level      slog.Level
	pprof      bool
	otlp       string
	tls        mtls.Files
	tlsReload  time.Duration
	insecure   bool
	// noSnapshotLog is how often the sidecar says why it has no routing snapshot.
	noSnapshotLog time.Duration
}

func main() {
	fs := flag.NewFlagSet("meridian-sidecar", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: meridian-sidecar --node-id NAME [flags]\n\n"+
			"The ext_proc server beside one Envoy: it routes each request from the node's cached\n"+
			"xDS view, learned from the control server.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var f flags
	file := server.DefaultFile() // the flags' defaults; a --config file replaces them below
	fs.StringVar(&f.config, "config", "", "optional YAML config file (docs/configuration.md); flags given explicitly override it")
	fs.StringVar(&f.nodeID, "node-id", "", "the Envoy node id (data-plane cluster name) this sidecar serves")
	host, _ := os.Hostname()
	fs.StringVar(&f.sidecarID, "sidecar-id", fmt.Sprintf("%s-%d", host, os.Getpid()), "this sidecar's name in load reports")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:19001", "gRPC address for Envoy's ext_proc filter")
	fs.StringVar(&f.httpListen, "http-listen", "127.0.0.1:19081", "HTTP address for /healthz and /metrics")
	fs.StringVar(&f.control, "control", "127.0.0.1:18000", "control server xDS address")
	fs.StringVar(&f.peerListen, "peer-listen", "", "gRPC address where the node's other sidecars watch this one's requests in flight (meridian.v1.PeerLoad); empty: not served")
	fs.StringVar(&f.peers, "peers", "", "comma-separated host:port of the node's sidecars' --peer-listen (a name may resolve to all of them, this one included); their requests in flight count in this sidecar's picks")
	var flagged server.File // what explicitly given flags say; applied over the file
	fs.IntVar(&flagged.Request.BlockBytes, "block-bytes", file.Request.BlockBytes, "bytes of canonical prompt per prefix block (request.block_bytes)")
	fs.IntVar(&flagged.Request.MaxBlocks, "max-blocks", file.Request.MaxBlocks, "prefix blocks hashed at most: the routing key's deepest rung (request.max_blocks)")
	fs.IntVar(&flagged.Request.AffinityBlocks, "affinity-blocks", file.Request.AffinityBlocks, "prefix blocks of the routing key's first rung; each next rung is twice as deep (request.affinity_blocks)")
	fs.Int64Var(&flagged.Request.BodyLimitBytes, "body-limit", file.Request.BodyLimitBytes, "Envoy's buffer limit (bootstrap --buffer-limit): the sidecar routes on at most half of it of a body (request.body_limit_bytes)")
	fs.Int64Var(&flagged.Request.MaxRequestBytes.DefaultBytes, "max-request-bytes", file.Request.MaxRequestBytes.DefaultBytes, "largest request body in bytes: 413 in OpenAI's shape above it (request.max_request_bytes.default_bytes; per model in the --config file)")
	fs.IntVar(&flagged.Picker.Fallbacks, "fallbacks", file.Picker.Fallbacks, "engines after the primary in the endpoint list (picker.fallbacks)")
	fs.IntVar(&flagged.Picker.Choices, "choices", file.Picker.Choices, "engines the least-work choice weighs for a key's primary, at least --fallbacks+1 (picker.choices)")
	fs.DurationVar(&flagged.Peers.Interval, "peer-interval", file.Peers.Interval, "how often this sidecar's requests in flight go to the peers watching it (peers.interval)")
	fs.StringVar(&f.otlp, "otlp-endpoint", "", "host:port of an OTLP/gRPC collector (plaintext) to export one span per decision to; empty: no spans")
	fs.StringVar(&f.tls.Cert, "tls-cert", "", "PEM certificate naming spiffe://meridian/node/<node-id>/sidecar; with --tls-key and --tls-ca, mutual TLS to the control server and from Envoy")
	fs.StringVar(&f.tls.Key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&f.tls.CA, "tls-ca", "", "PEM CA bundle that signs the control server's and this node's Envoy's certificates")
	fs.DurationVar(&f.tlsReload, "tls-reload", 2*time.Second, "how often the TLS files are checked for a rotated certificate")
	fs.BoolVar(&f.insecure, "insecure", false, "allow plaintext on a non-loopback --listen or to a non-loopback --control")
	fs.DurationVar(&f.noSnapshotLog, "no-snapshot-log", 10*time.Second, "while there is no routing snapshot, log why this often")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on --http-listen (keep that address private)")
	fs.TextVar(&f.level, "log-level", slog.LevelInfo, "log level: DEBUG, INFO, WARN or ERROR")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: f.level})).With("node", f.nodeID)
	if f.config != "" {
		var err error
		if file, err = server.ReadFile(f.config); err != nil {
			fmt.Fprintln(os.Stderr, "meridian-sidecar:", err)
			os.Exit(2)
		}
	}
	// Explicitly given flags win over the file.
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "block-bytes":
			file.Request.BlockBytes = flagged.Request.BlockBytes
		case "max-blocks":
			file.Request.MaxBlocks = flagged.Request.MaxBlocks
		case "affinity-blocks":
			file.Request.AffinityBlocks = flagged.Request.AffinityBlocks
		case "body-limit":
			file.Request.BodyLimitBytes = flagged.Request.BodyLimitBytes
		case "fallbacks":
			file.Picker.Fallbacks = flagged.Picker.Fallbacks
		case "choices":
			file.Picker.Choices = flagged.Picker.Choices
		case "max-request-bytes":
			file.Request.MaxRequestBytes.DefaultBytes = flagged.Request.MaxRequestBytes.DefaultBytes
		case "peer-interval":
			file.Peers.Interval = flagged.Peers.Interval
		}
	})
	cfg, err := file.Build(log)
	if err != nil {
		where := "flags"
		if f.config != "" {
			where = f.config
		}
		fmt.Fprintf(os.Stderr, "meridian-sidecar: %s: %v\n", where, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, f, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "meridian-sidecar:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f flags, cfg server.Config) error {
	if f.nodeID == "" {
		return errors.New("--node-id is required: the node id of the Envoy this sidecar serves")
	}
	if f.otlp != "" {
		tracer, shutdown, err := newTracer(ctx, f.otlp, f.nodeID)
		if err != nil {
			return err
		}
		defer shutdown()
		cfg.Tracer = tracer
	}
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	tlsSrc, err := transport(f, cfg.Log)
	if err != nil {
		return err
	}
	// conn is set below; the watchdog reads its state only after run has started it.
	var conn *grpc.ClientConn
	dog := &watchdog{node: f.nodeID, control: f.control, ready: srv.Ready, log: cfg.Log, started: time.Now(),
		connState: func() string { return conn.GetState().String() }}
	if err := dog.register(srv.Metrics()); err != nil {
		return err
	}
	clientCreds, serverOpts := insecure.NewCredentials(), []grpc.ServerOption(nil)
	if tlsSrc != nil {
		go tlsSrc.Watch(ctx, f.tlsReload)
		clientCreds = tlsSrc.ClientCredentials(mtls.Control())
		serverOpts = append(serverOpts, grpc.Creds(tlsSrc.ServerCredentials(envoyOf(f.nodeID), dog.handshakeFailed)))
	}
	conn, err = grpc.NewClient(f.control,
		grpc.WithTransportCredentials(clientCreds),
		// gRPC's default reconnect backoff grows to 2 minutes; after a control server
		// restart the sidecar must be back within seconds, so cap it at 2 s, and let streams
		// wait for the connection instead of failing on a channel still in backoff.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}))
	if err != nil {
		return fmt.Errorf("control server %s: %w", f.control, err)
	}
	defer conn.Close()
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.listen, err)
	}
	httpLn, err := net.Listen("tcp", f.httpListen)
	if err != nil {
		ln.Close()
		return fmt.Errorf("http listen on %s: %w", f.httpListen, err)
	}
	gs := grpc.NewServer(append(serverOpts,
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Fixed flow-control windows turn off gRPC's bandwidth estimator, which pings Envoy
		// on every request's stream: a round of wakeups on both sides for nothing on loopback.
		grpc.InitialWindowSize(1<<20), grpc.InitialConnWindowSize(16<<20))...)
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	accesslogv3.RegisterAccessLogServiceServer(gs, outcome.NewReceiver(srv.OnOutcome, cfg.Log))
	// The gRPC health service of the endpoint-picker protocol (liveness, readiness, ext_proc).
	hsrv := health.NewServer()
	healthpb.RegisterHealthServer(gs, hsrv)
	go srv.ServeHealth(ctx, hsrv, 200*time.Millisecond)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(srv.Metrics(), promhttp.HandlerOpts{}))
	mux.Handle("GET /debug/decisions", srv.DecisionsHandler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if !srv.Ready() {
			http.Error(w, dog.reason(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if f.pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	cfg.Log.Info("sidecar listening", "ext_proc", ln.Addr().String(), "http", httpLn.Addr().String(), "control", f.control, "tls", tlsSrc != nil)
	go dog.run(ctx, f.noSnapshotLog)

	go srv.Run(ctx)
	go srv.Report(ctx, conn, f.nodeID, f.sidecarID)
	go srv.ExchangePlacements(ctx, conn, f.nodeID, f.sidecarID)
	errc := make(chan error, 4)
	peerGS, peerAddr, err := servePeers(ctx, f, srv, tlsSrc, errc)
	if err != nil {
		ln.Close()
		httpLn.Close()
		return err
	}
	if peerAddr != "" || f.peers != "" {
		cfg.Log.Info("peer exchange", "listen", peerAddr, "peers", f.peers, "interval", cfg.PeerInterval)
	}
	go func() {
		// Until the first xDS view arrives the sidecar could only pass requests through
		// unsteered; while it does not listen, Envoy fails open to the same weights instead.
		waitReady(ctx, srv, 10*time.Second)
		errc <- gs.Serve(ln)
	}()
	go func() { errc <- hs.Serve(httpLn) }()
	go func() {
		errc <- xdsclient.Run(ctx, xdsclient.Config{NodeID: f.nodeID, Conn: conn, OnUpdate: srv.Update, Log: cfg.Log, MaxBackoff: 2 * time.Second, OnStreamError: dog.streamError})
	}()
	select {
	case <-ctx.Done():
		err = nil
	case err = <-errc:
	}
	if peerGS != nil {
		peerGS.Stop() // its streams never end by themselves
	}
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		gs.Stop() // streams Envoy keeps open must not hold the exit
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	return err
}

// waitReady returns when srv has a routing snapshot, ctx ends, or limit passes.
func waitReady(ctx context.Context, srv *server.Server, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for !srv.Ready() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
}
