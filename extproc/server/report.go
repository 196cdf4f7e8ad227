package server

import (
	"context"
	"math"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/meridian-router/meridian/extproc/guard"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// windowStats counts arrivals per model between two load reports.
type windowStats struct {
	mu    sync.Mutex
	start time.Time
	m     map[string]*modelWindow
}

type modelWindow struct {
	requests    int64
	promptBytes int64
}

func newWindowStats() *windowStats {
	return &windowStats{start: time.Now(), m: map[string]*modelWindow{}}
}

func (w *windowStats) arrival(model string, promptBytes int) {
	w.mu.Lock()
	mw := w.m[model]
	if mw == nil {
		mw = &modelWindow{}
		w.m[model] = mw
	}
	mw.requests++
	mw.promptBytes += int64(promptBytes)
	w.mu.Unlock()
}

// cut returns the counts since the last cut and the window's length.
func (w *windowStats) cut(now time.Time) (map[string]*modelWindow, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m, d := w.m, now.Sub(w.start)
	w.m, w.start = map[string]*modelWindow{}, now
	return m, d
}

// bytesPerToken converts prompt bytes to the tokens the control server plans with. It is
// the usual English average; the figure only scales the demand in tokens/s.
const bytesPerToken = 4

// buildReport summarizes the window that ends now.
func (s *Server) buildReport(nodeID, sidecarID string) *meridianv1.LoadReport {
	now := s.clock.Now()
	win, d := s.stats.cut(now)
	secs := max(d.Seconds(), 1e-3)
	rep := &meridianv1.LoadReport{NodeId: nodeID, SidecarId: sidecarID, WindowSeconds: secs, UnixMillis: now.UnixMilli()}
	shedRate := map[string]float64{}
	for _, d := range s.shedder.Demand() {
		shedRate[d.Model] = d.ShedPerSecond
	}
	// Every model this node routes is reported, 0 when nothing arrived: an absent entry
	// would leave the control server's estimate at its last value.
	known := map[string]bool{}
	for m := range win {
		known[m] = true
	}
	if r := s.routing.Load(); r != nil {
		for m := range r.models {
			known[m] = true
		}
	}
	models := make([]string, 0, len(known))
	for m := range known {
		models = append(models, m)
	}
	sort.Strings(models)
	for _, m := range models {
		w := win[m]
		if w == nil {
			w = &modelWindow{}
		}
		rep.Demand = append(rep.Demand, &meridianv1.ModelDemand{
			Model:                 m,
			RequestsPerSecond:     float64(w.requests) / secs,
			PromptTokensPerSecond: float64(w.promptBytes) / bytesPerToken / secs,
			ShedPerSecond:         shedRate[m],
		})
	}
	inflight := s.inFlight()
	addr := map[string]string{}
	if r := s.routing.Load(); r != nil {
		for a, e := range r.engines {
			addr[e] = a
		}
	}
	for _, e := range s.outliers.Penalties().Engines() {
		rep.Engines = append(rep.Engines, &meridianv1.EngineObservation{
			Engine:         e.Engine,
			Address:        addr[e.Engine],
			Requests:       uint64(math.Round(e.Requests)),
			Errors:         uint64(math.Round(e.Errors)),
			TtftP50Seconds: e.TTFTP50.Seconds(),
			TtftP90Seconds: e.TTFTP90.Seconds(),
			ItlMeanSeconds: e.ITLMean.Seconds(),
			InFlight:       float64(inflight[e.Engine]),
			Penalty:        e.Factor,
		})
	}
	return rep
}

// ApplyPolicy takes the control server's shed fractions, retry budget and utilization.
// Parts that fail validation are refused and logged; the rest applies.
func (s *Server) ApplyPolicy(p *meridianv1.Policy) {
	if f, err := guard.FractionsFromProto(p.GetShed()); err != nil {
		s.cfg.Log.Error("policy: shed fractions refused", "version", p.GetVersion(), "err", err)
	} else if err := s.shedder.SetFractions(f); err != nil {
		s.cfg.Log.Error("policy: shed fractions refused", "version", p.GetVersion(), "err", err)
	}
	if b := p.GetRetryBudget(); b != nil {
		c, err := guard.CurveFromProto(b)
		if err == nil {
			err = s.retries.SetCurve(c)
		}
		if err != nil {
			s.cfg.Log.Error("policy: retry budget refused", "version", p.GetVersion(), "err", err)
		}
	}
	if u := p.GetUtilization(); u >= 0 && !math.IsNaN(u) && !math.IsInf(u, 0) {
		s.plannedUtil.Store(math.Float64bits(u))
	}
}

// Report keeps a load-reporting stream to the control server open until ctx is done,
// sending a report every ReportInterval and applying every Policy received. It reconnects
// with backoff; while disconnected the sidecar keeps its last policy.
func (s *Server) Report(ctx context.Context, conn grpc.ClientConnInterface, nodeID, sidecarID string) {
	client := meridianv1.NewLoadReportingClient(conn)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		began := time.Now()
		err := s.reportOnce(ctx, client, nodeID, sidecarID)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		s.cfg.Log.Debug("load report stream ended; reconnecting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (s *Server) reportOnce(ctx context.Context, client meridianv1.LoadReportingClient, nodeID, sidecarID string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.StreamLoad(ctx)
	if err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			p, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			s.ApplyPolicy(p)
		}
	}()
	t := time.NewTicker(s.cfg.ReportInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return err
		case <-t.C:
			if err := stream.Send(s.buildReport(nodeID, sidecarID)); err != nil {
				return err
			}
		}
	}
}
