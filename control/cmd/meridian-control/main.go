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
	"strconv"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/control/optimizer"
	"github.com/meridian-router/meridian/control/server"
	"github.com/meridian-router/meridian/control/signals"
	"github.com/meridian-router/meridian/policy"
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
	cfg.Optimizer = optimizer.DefaultConfig()
	fs.DurationVar(&cfg.SolvePeriod, "solve-period", time.Second, "how often the optimizer re-solves")
	cfg.Signals = signals.DefaultConfig()
	fs.DurationVar(&cfg.ScrapeInterval, "scrape-interval", 2*time.Second, "how often every engine's /metrics is scraped")
	fs.DurationVar(&cfg.Signals.HalfLife, "signal-half-life", cfg.Signals.HalfLife, "EWMA half-life of demand and engine signals")
	fs.Float64Var(&cfg.Signals.DemandEvidence, "demand-evidence", cfg.Signals.DemandEvidence, "requests a node's demand estimate rests on at least: at low rates its half-life grows to this / demand, up to --max-demand-half-life (0: --signal-half-life at every rate)")
	fs.DurationVar(&cfg.Signals.CacheHalfLife, "cache-half-life", cfg.Signals.CacheHalfLife, "half-life of the prompt tokens engines are asked for and find in their prefix caches, whose ratio credits capacity (prefill_share in the fleet file)")
	fs.DurationVar(&cfg.Signals.MaxDemandHalfLife, "max-demand-half-life", cfg.Signals.MaxDemandHalfLife, "longest half-life --demand-evidence may give a demand estimate")
	fs.DurationVar(&cfg.Signals.StaleAfter, "stale-after", cfg.Signals.StaleAfter, "an engine neither scraped nor seen answering for this long is suspect and gets no traffic")
	fs.Float64Var(&cfg.Optimizer.Params.RhoMax, "rho-max", cfg.Optimizer.Params.RhoMax, "highest utilization the optimizer plans for an engine, in (0,1)")
	fs.Float64Var(&cfg.Optimizer.Params.MoveCost, "move-cost", cfg.Optimizer.Params.MoveCost, "price in seconds of moving 1 req/s between engines (anti-oscillation)")
	fs.Float64Var(&cfg.Optimizer.MinShareChange, "min-share-change", cfg.Optimizer.MinShareChange, "smallest share change worth publishing, in [0,1)")
	fs.Float64Var(&cfg.Optimizer.MaxShareStep, "max-share-step", cfg.Optimizer.MaxShareStep, "most an engine's share moves per solve while its engines stay healthy, in (0,1] (1: no limit)")
	fs.DurationVar(&cfg.Optimizer.ShedBacklog, "shed-backlog", cfg.Optimizer.ShedBacklog, "send the plan's shed fraction only while the engines a cluster uses queue this much work (waiting / capacity; 0: whenever the plan sheds)")
	fs.Float64Var(&cfg.Optimizer.DefaultCurve.Base, "default-latency", cfg.Optimizer.DefaultCurve.Base, "engine latency in seconds at no load, until one is learned")
	fs.Float64Var(&cfg.Optimizer.DefaultCurve.Queue, "default-queueing", cfg.Optimizer.DefaultCurve.Queue, "engine queueing coefficient in seconds, until one is learned")
	rb := &cfg.Optimizer.RetryBudget
	fs.Func("retry-max-idle", fmt.Sprintf("retries per request the sidecars grant while utilization <= --retry-generous-below, 0..%d (default %d)", policy.MaxRetriesCap, rb.MaxRetriesIdle),
		func(v string) error {
			n, err := strconv.ParseUint(v, 10, 32)
			rb.MaxRetriesIdle = uint32(n)
			return err
		})
	fs.Float64Var(&rb.GenerousBelow, "retry-generous-below", rb.GenerousBelow, "utilization up to which the full retry budget applies")
	fs.Float64Var(&rb.ZeroAt, "retry-zero-at", rb.ZeroAt, "utilization from which no budgeted retries are granted")
	fs.StringVar(&rb.RetryOn, "retry-on", rb.RetryOn, "x-envoy-retry-on for budgeted retries (Envoy's retry conditions, comma-separated)")
	le := addLeaderFlags(fs)
	fs.StringVar(&cfg.TLS.Cert, "tls-cert", "", "PEM certificate naming spiffe://meridian/control; with --tls-key and --tls-ca turns on mutual TLS on --xds-listen")
	fs.StringVar(&cfg.TLS.Key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&cfg.TLS.CA, "tls-ca", "", "PEM CA bundle that signs every sidecar's and Envoy's certificate")
	fs.DurationVar(&cfg.TLSReload, "tls-reload", 2*time.Second, "how often the TLS files are checked for a rotated certificate")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "allow plaintext gRPC on a non-loopback --xds-listen: anyone who reaches it can steer the fleet")
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
	var err error
	if cfg.Leader, err = le.config(cfg.Log, cfg.HTTPListen); err != nil {
		fmt.Fprintln(os.Stderr, "meridian-control:", err)
		os.Exit(2)
	}
	cfg.TakeoverHold = le.hold
	srv, err := server.New(cfg)
	if err == nil {
		err = srv.Run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "meridian-control:", err)
		os.Exit(1)
	}
}
