// Package engineload is the sidecar's scrape of its engines' load gauges: every Interval
// it reads vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
// and vllm:cache_config_info from each engine the decision core routes to (at the metrics
// URL the control server publishes with the endpoint) and hands them to the core, which
// counts what the engine holds beyond its own requests as other routers' work
// (decide.Core.ObserveEngineLoad).
//
// Why: a region runs several sidecars, and each sees only its own share of the requests
// in flight. Bounded loads and the least-work choice judged on that share alone rarely see
// an engine as busy. The llm-d router's endpoint picker reads the same gauges from every
// engine every 50 ms (its --refresh-metrics-interval default; DefaultRefreshMetricsInterval
// in kubernetes-sigs/gateway-api-inference-extension's pkg/epp/server, which llm-d builds
// on; sim/llmd.go cites the rest), and this is the same feed.
//
// A scrape that fails, or does not finish within Timeout, forgets the engine's observed
// load (the core falls back to its own counts) and is counted; the first failure of a run
// of failures is logged, and so is the recovery.
package engineload

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"
	"github.com/meridian-router/meridian/extproc/decide"
)

// Core is the part of the decision core the scrape feeds.
type Core interface {
	LoadTargets(dst []decide.LoadTarget) []decide.LoadTarget
	ObserveEngineLoad(addr string, l enginemetrics.Load)
	ForgetEngineLoad(addr string)
}

// Config configures Run.
type Config struct {
	// Interval is the time between the starts of two scrape rounds; a round that runs
	// longer delays the next one instead of overlapping it.
	Interval time.Duration
	// Timeout bounds one engine's scrape.
	Timeout time.Duration
	// Parallel bounds the scrapes in flight at once (0: 16).
	Parallel int
	// Client fetches the metrics (nil: a client with Timeout and keep-alive).
	Client *http.Client
	// OnScrape, when set, is called after every scrape with its success.
	OnScrape func(ok bool)
	Log      *slog.Logger
}

// Run scrapes until ctx ends. It returns at once when Interval is not positive.
func Run(ctx context.Context, cfg Config, core Core) {
	if cfg.Interval <= 0 {
		return
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{Timeout: cfg.Timeout, Transport: &http.Transport{
			MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute, ResponseHeaderTimeout: cfg.Timeout}}
	}
	sc := &enginemetrics.Scraper{Client: client}
	failing := map[string]bool{}
	var targets []decide.LoadTarget
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		targets = core.LoadTargets(targets[:0])
		round(ctx, cfg, sc, core, targets, failing)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round scrapes every target once, at most Parallel at a time, and waits for all.
func round(ctx context.Context, cfg Config, sc *enginemetrics.Scraper, core Core, targets []decide.LoadTarget, failing map[string]bool) {
	for addr := range failing { // engines that left the view
		if !slices.ContainsFunc(targets, func(t decide.LoadTarget) bool { return t.Address == addr }) {
			delete(failing, addr)
		}
	}
	sem := make(chan struct{}, max(cmp.Or(cfg.Parallel, 16), 1))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, tg := range targets {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			sctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
			l, err := sc.ScrapeLoad(sctx, tg.MetricsURL)
			cancel()
			if ctx.Err() != nil {
				return // shutting down: neither an observation nor a failure
			}
			if err != nil {
				core.ForgetEngineLoad(tg.Address)
			} else {
				core.ObserveEngineLoad(tg.Address, l)
			}
			if cfg.OnScrape != nil {
				cfg.OnScrape(err == nil)
			}
			mu.Lock()
			defer mu.Unlock()
			switch was := failing[tg.Address]; {
			case err != nil && !was:
				failing[tg.Address] = true
				cfg.Log.Warn("engine load scrape failed; routing on this sidecar's own counts for the engine until it succeeds",
					"engine", tg.Address, "url", tg.MetricsURL, "err", err)
			case err == nil && was:
				delete(failing, tg.Address)
				cfg.Log.Info("engine load scrape recovered", "engine", tg.Address)
			}
		}()
	}
	wg.Wait()
}
