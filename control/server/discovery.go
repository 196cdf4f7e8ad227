package server

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"time"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/kube"
)

// composer joins the fleet file and the engines discovered in Kubernetes into the fleet the
// server applies. Without a discovery section it passes the file through.
type composer struct {
	s *Server

	mu      sync.Mutex
	base    *fleet.Fleet
	found   []fleet.Discovered
	synced  bool               // the discoverer has delivered once
	running *fleet.Discovery   // the discovery section the discoverer runs with
	disc    *kube.Discoverer   // nil without discovery
	stop    context.CancelFunc // stops disc
	metrics *kube.Metrics
}

// useFile takes a new fleet file: it (re)starts discovery when its section changed, then
// applies the composed fleet. An error means the file's fleet was not applied.
func (c *composer) useFile(ctx context.Context, f *fleet.Fleet) error {
	c.mu.Lock()
	if !reflect.DeepEqual(f.Discovery, c.running) {
		if err := c.restartLocked(ctx, f); err != nil {
			c.mu.Unlock()
			return err
		}
	}
	c.base = f
	disc := c.disc
	c.mu.Unlock()
	if disc != nil {
		// Re-check what was found against the new file; the discoverer applies and reports.
		disc.Resync()
		return nil
	}
	return c.s.apply(ctx, f)
}

// restartLocked stops the running discoverer and starts one for f's discovery section.
func (c *composer) restartLocked(ctx context.Context, f *fleet.Fleet) error {
	var next *kube.Discoverer
	if f.Discovery != nil {
		if c.metrics == nil {
			c.metrics = kube.NewMetrics(c.s.metrics.reg)
		}
		var err error
		next, err = kube.New(kube.Options{Config: *f.Discovery.Kubernetes, Models: f.Models, REST: c.s.cfg.KubeREST,
			Log: c.s.cfg.Log.With("component", "discovery"), Metrics: c.metrics})
		if err != nil {
			return err
		}
	}
	if c.stop != nil {
		c.stop()
	}
	c.disc, c.stop, c.found, c.synced = next, nil, nil, false
	c.running = f.Discovery
	if next != nil {
		dctx, cancel := context.WithCancel(ctx)
		c.stop = cancel
		go next.Run(dctx, func(found []fleet.Discovered) []error { return c.discovered(dctx, found) })
	}
	return nil
}

// discovered applies the file's fleet with the engines found; it returns the problems of
// those left out, for the discoverer to report.
func (c *composer) discovered(ctx context.Context, found []fleet.Discovered) []error {
	c.mu.Lock()
	c.found, c.synced = found, true
	base := c.base
	c.mu.Unlock()
	merged, problems := base.WithDiscovered(found)
	if merged == nil {
		c.s.rejectFleet(errors.Join(problems...))
		return problems
	}
	if err := c.s.apply(ctx, merged); err != nil {
		c.s.rejectFleet(err)
	}
	return problems
}

// waitSynced waits (at most timeout) for the first discovered fleet, so a restarted control
// server publishes the cluster's engines rather than the file's alone.
func (c *composer) waitSynced(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		done := c.disc == nil || c.synced
		c.mu.Unlock()
		if done {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
