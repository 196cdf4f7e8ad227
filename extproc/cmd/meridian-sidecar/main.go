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
	"os"
	"os/signal"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/extproc/xdsclient"
)

type flags struct {
	nodeID     string
	listen     string
	httpListen string
	control    string
	level      slog.Level
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
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := server.DefaultConfig(log)
	fs.StringVar(&f.nodeID, "node-id", "", "the Envoy node id (data-plane cluster name) this sidecar serves")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:19001", "gRPC address for Envoy's ext_proc filter")
	fs.StringVar(&f.httpListen, "http-listen", "127.0.0.1:19081", "HTTP address for /healthz and /metrics")
	fs.StringVar(&f.control, "control", "127.0.0.1:18000", "control server xDS address")
	fs.IntVar(&cfg.Request.BlockBytes, "block-bytes", cfg.Request.BlockBytes, "bytes of canonical prompt per prefix block")
	fs.IntVar(&cfg.Request.MaxBlocks, "max-blocks", cfg.Request.MaxBlocks, "prefix blocks hashed at most")
	fs.IntVar(&cfg.AffinityBlocks, "affinity-blocks", cfg.AffinityBlocks, "prefix blocks that form the routing key")
	fs.IntVar(&cfg.Fallbacks, "fallbacks", cfg.Fallbacks, "engines after the primary in the endpoint list")
	fs.TextVar(&f.level, "log-level", slog.LevelInfo, "log level: DEBUG, INFO, WARN or ERROR")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: f.level})).With("node", f.nodeID)
	cfg.Log = log
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
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(f.control,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
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
	gs := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}))
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if !srv.Ready() {
			http.Error(w, "no routing snapshot yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	cfg.Log.Info("sidecar listening", "ext_proc", ln.Addr().String(), "http", httpLn.Addr().String(), "control", f.control)

	errc := make(chan error, 3)
	go func() { errc <- gs.Serve(ln) }()
	go func() { errc <- hs.Serve(httpLn) }()
	go func() {
		errc <- xdsclient.Run(ctx, xdsclient.Config{NodeID: f.nodeID, Conn: conn, OnUpdate: srv.Update, Log: cfg.Log})
	}()
	select {
	case <-ctx.Done():
		err = nil
	case err = <-errc:
	}
	gs.GracefulStop()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	return err
}
