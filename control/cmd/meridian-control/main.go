// Command meridian-control is the control server: it serves every Envoy and sidecar its
// node's snapshot over ADS, built from the fleet file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/control/server"
)

func main() {
	fs := flag.NewFlagSet("meridian-control", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: meridian-control --fleet FILE [flags]\n\n"+
			"Serves xDS (ADS) snapshots to Envoys and meridian sidecars, one per node id,\n"+
			"built from the fleet file (see docs/configuration.md).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var cfg server.Config
	var level slog.Level
	fs.StringVar(&cfg.FleetPath, "fleet", "", "fleet file (YAML); reloaded when it changes")
	fs.StringVar(&cfg.XDSListen, "xds-listen", "127.0.0.1:18000", "gRPC address for ADS and sidecar load reports")
	fs.StringVar(&cfg.HTTPListen, "http-listen", "127.0.0.1:18080", "HTTP address for /healthz, /metrics and /debug/state")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", 500*time.Millisecond, "how often the fleet file is checked for changes")
	fs.TextVar(&level, "log-level", slog.LevelInfo, "log level: DEBUG, INFO, WARN or ERROR")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := server.New(cfg)
	if err == nil {
		err = srv.Run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "meridian-control:", err)
		os.Exit(1)
	}
}
