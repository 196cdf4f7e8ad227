package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// watchdog says why the sidecar has no routing snapshot: it remembers the last reason the
// xDS stream ended, logs an error naming the node id, the control server and that reason
// every interval while there is no snapshot, and answers /healthz with it.
type watchdog struct {
	node, control string
	ready         func() bool
	connState     func() string // the gRPC connection's state to the control server
	log           *slog.Logger
	started       time.Time

	mu      sync.Mutex
	lastErr error
}

func (w *watchdog) streamError(err error) {
	w.mu.Lock()
	w.lastErr = err
	w.mu.Unlock()
}

// reason is why there is no snapshot yet, for /healthz and the log.
func (w *watchdog) reason() string {
	w.mu.Lock()
	err := w.lastErr
	w.mu.Unlock()
	why := "the control server has sent nothing yet (is it running and reachable, and does its fleet file list this node?)"
	if err != nil {
		why = "the last xDS stream ended with: " + err.Error()
	}
	if w.connState != nil {
		why += "; connection " + w.connState()
	}
	return fmt.Sprintf("no routing snapshot after %s for node %q from control server %s: %s",
		time.Since(w.started).Round(time.Second), w.node, w.control, why)
}

// run logs the reason every interval until the first snapshot or ctx ends. The first line
// comes after one interval: a healthy start takes well under a second.
func (w *watchdog) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.ready() {
			return
		}
		w.log.Error(w.reason()+"; requests pass through to Envoy's fallback balancing meanwhile", "control", w.control)
	}
}
