package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/control/leader"
	"github.com/meridian-router/meridian/control/xds"
)

// ha is a replica's part in a leader-elected control plane (Config.Leader). A follower
// serves HTTP (health, metrics, state) but not xDS: its gRPC listener opens only when it
// wins the Lease, so Envoys and sidecars, which reach every replica through one name, can
// only connect to the leader. A follower keeps the leader's published weights (read from
// the leader's /debug/state), and a new leader publishes exactly those first and holds them
// for TakeoverHold, while the sidecars reconnect and its demand estimates fill again: the
// failover itself moves no share.
type ha struct {
	s *Server

	mu        sync.Mutex
	leaderID  string
	leading   bool
	held      map[string]map[string]map[string]uint32 // node -> model -> engine -> weight
	holdUntil time.Time
	holdEnded bool // the hold ended and the optimizer's weights were not published since

	elected chan struct{} // closed when this replica leads
	once    sync.Once
	gauge   prometheus.Gauge
}

func newHA(s *Server) *ha {
	h := &ha{s: s, elected: make(chan struct{}), gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_control_leader",
		Help: "1 while this replica serves xDS: always without --leader-elect, while it holds the Lease with it."})}
	if s.cfg.Leader == nil {
		h.gauge.Set(1)
	}
	s.metrics.reg.MustRegister(h.gauge)
	return h
}

// listenXDS listens on the xDS address now, or, under leader election, returns a listener
// that binds it once this replica leads.
func (s *Server) listenXDS() (net.Listener, error) {
	if s.cfg.Leader == nil {
		ln, err := net.Listen("tcp", s.cfg.XDSListen)
		if err != nil {
			return nil, fmt.Errorf("xds listen on %s: %w", s.cfg.XDSListen, err)
		}
		return ln, nil
	}
	return &electedListener{h: s.ha, addr: s.cfg.XDSListen, closed: make(chan struct{})}, nil
}

// runElection campaigns until ctx ends; it returns an error when leadership was lost.
func (h *ha) run(ctx context.Context) error {
	if h.s.cfg.Leader == nil {
		<-ctx.Done()
		return nil
	}
	cfg := *h.s.cfg.Leader
	go h.follow(ctx, cfg.Identity)
	return leader.Run(ctx, cfg, h.lead, func(id string) {
		h.mu.Lock()
		h.leaderID = id
		h.mu.Unlock()
	})
}

// lead takes over: publish the held weights, then open the xDS port.
func (h *ha) lead(ctx context.Context) {
	h.mu.Lock()
	h.leading = true
	h.holdUntil = time.Now().Add(h.s.cfg.TakeoverHold)
	held := len(h.held) > 0
	h.mu.Unlock()
	h.s.mu.Lock()
	f := h.s.fleet
	h.s.mu.Unlock()
	if f != nil {
		if err := h.s.apply(ctx, f); err != nil {
			h.s.cfg.Log.Error("publishing on takeover failed", "err", err)
		}
	}
	h.s.cfg.Log.Info("took over as leader; serving xDS", "held_weights", held, "hold", h.s.cfg.TakeoverHold.String())
	h.gauge.Set(1)
	h.once.Do(func() { close(h.elected) })
	<-ctx.Done()
}

// follow reads the leader's published weights every 500ms while another replica leads.
func (h *ha) follow(ctx context.Context, self string) {
	client := &http.Client{Timeout: time.Second}
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		id, leading := h.leaderID, h.leading
		h.mu.Unlock()
		if leading {
			return
		}
		if id == "" || id == self {
			continue
		}
		w, err := fetchWeights(ctx, client, "http://"+id+"/debug/state")
		if err != nil {
			h.s.cfg.Log.Debug("reading the leader's weights failed", "leader", id, "err", err)
			continue
		}
		h.mu.Lock()
		if !h.leading {
			h.held = w
		}
		h.mu.Unlock()
	}
}

func fetchWeights(ctx context.Context, c *http.Client, url string) (map[string]map[string]map[string]uint32, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	var st State
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 32<<20)).Decode(&st); err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	out := map[string]map[string]map[string]uint32{}
	for node, ns := range st.Nodes {
		for model, ms := range ns.Models {
			if len(ms.Weights) == 0 {
				continue
			}
			if out[node] == nil {
				out[node] = map[string]map[string]uint32{}
			}
			out[node][model] = ms.Weights
		}
	}
	return out, nil
}

// over returns wf with the held weights in front while a follower, and during the hold
// after takeover; forcePublish reports (once) that the hold just ended, so the optimizer's
// weights get published even if it saw no change of its own.
func (h *ha) over(wf xds.WeightFunc) (_ xds.WeightFunc, forcePublish bool) {
	if h == nil || h.s.cfg.Leader == nil {
		return wf, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	holding := !h.leading || time.Now().Before(h.holdUntil)
	if !holding {
		if !h.holdEnded && len(h.held) > 0 {
			h.holdEnded = true
			return wf, true
		}
		return wf, false
	}
	held := h.held
	if len(held) == 0 {
		return wf, false
	}
	return func(node, model string) map[string]uint32 {
		if w := held[node][model]; len(w) > 0 {
			return w
		}
		return wf(node, model)
	}, false
}

// electedListener binds its address when the replica leads; until then Accept waits.
type electedListener struct {
	h      *ha
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	closed chan struct{}
	once   sync.Once
}

func (l *electedListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	ln := l.ln
	l.mu.Unlock()
	if ln == nil {
		select {
		case <-l.closed:
			return nil, net.ErrClosed
		case <-l.h.elected:
		}
		var err error
		// The old leader's port may take a moment to be released (same host in tests).
		for i := 0; ; i++ {
			if ln, err = net.Listen("tcp", l.addr); err == nil || i == 50 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			return nil, fmt.Errorf("xds listen on %s: %w", l.addr, err)
		}
		l.mu.Lock()
		select {
		case <-l.closed:
			l.mu.Unlock()
			ln.Close()
			return nil, net.ErrClosed
		default:
		}
		l.ln = ln
		l.mu.Unlock()
	}
	return ln.Accept()
}

func (l *electedListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		return l.ln.Close()
	}
	return nil
}

func (l *electedListener) Addr() net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		return l.ln.Addr()
	}
	return standbyAddr(l.addr)
}

// standbyAddr is the address a follower will listen on.
type standbyAddr string

func (a standbyAddr) Network() string { return "tcp" }
func (a standbyAddr) String() string  { return string(a) + " (when leading)" }
