package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

	// streamErrors counts ended xDS streams, handshakes failed TLS handshakes on the ext_proc
	// port, by reason (registered by register).
	streamErrors prometheus.Counter
	handshakes   *prometheus.CounterVec

	mu      sync.Mutex
	lastErr error
}

// register adds the watchdog's series to reg: meridian_sidecar_routing_ready (1 once there
// is a routing snapshot), meridian_sidecar_xds_stream_errors_total and
// meridian_sidecar_tls_handshake_failures_total{reason}.
func (w *watchdog) register(reg *prometheus.Registry) error {
	w.streamErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_sidecar_xds_stream_errors_total",
		Help: "xDS streams to the control server that ended with an error (see the log for why)."})
	w.handshakes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_sidecar_tls_handshake_failures_total",
		Help: "TLS handshakes refused on the ext_proc port, by reason."}, []string{"reason"})
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meridian_sidecar_routing_ready",
		Help: "1 once the sidecar has a routing snapshot from the control server, else 0."}, func() float64 {
		if w.ready() {
			return 1
		}
		return 0
	})
	for _, c := range []prometheus.Collector{w.streamErrors, w.handshakes, ready} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// handshakeFailed counts a refused handshake on the ext_proc port.
func (w *watchdog) handshakeFailed(reason string) {
	if w.handshakes != nil {
		w.handshakes.WithLabelValues(reason).Inc()
	}
}

func (w *watchdog) streamError(err error) {
	if w.streamErrors != nil {
		w.streamErrors.Inc()
	}
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
