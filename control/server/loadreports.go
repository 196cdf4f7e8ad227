package server

import (
	"errors"
	"io"
	"log/slog"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meridian-router/meridian/control/optimizer"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// loadReports serves meridian.v1.LoadReporting: it keeps each sidecar's latest report and
// pushes each node's current Policy down every stream of that node.
type loadReports struct {
	meridianv1.UnimplementedLoadReportingServer
	log *slog.Logger
	now func() time.Time

	mu       sync.Mutex
	latest   map[sidecarKey]received
	streams  map[string]map[*policyStream]struct{} // node -> streams
	policies map[string]*meridianv1.Policy
}

type sidecarKey struct{ node, sidecar string }

type received struct {
	rep *meridianv1.LoadReport
	at  time.Time
	// demand is the sidecar's request rate per model, smoothed over reports: one report
	// counts a second of Poisson arrivals, noisy enough to make a fleet near capacity shed
	// for nothing.
	demand map[string]float64
}

// demandTimeConstant is the smoothing of reported demand: a step in demand is 63% visible
// after this long.
const demandTimeConstant = 3 * time.Second

// policyStream hands policies to one stream's sender; only the newest one matters.
type policyStream struct{ ch chan *meridianv1.Policy }

func newLoadReports(log *slog.Logger, now func() time.Time) *loadReports {
	return &loadReports{log: log, now: now, latest: map[sidecarKey]received{},
		streams: map[string]map[*policyStream]struct{}{}, policies: map[string]*meridianv1.Policy{}}
}

// StreamLoad receives one sidecar's reports and sends it its node's policies.
func (l *loadReports) StreamLoad(stream meridianv1.LoadReporting_StreamLoadServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	node := first.GetNodeId()
	if node == "" {
		return status.Error(codes.InvalidArgument, "load report without node_id")
	}
	ps := &policyStream{ch: make(chan *meridianv1.Policy, 1)}
	l.mu.Lock()
	if l.streams[node] == nil {
		l.streams[node] = map[*policyStream]struct{}{}
	}
	l.streams[node][ps] = struct{}{}
	if p := l.policies[node]; p != nil {
		ps.ch <- p
	}
	l.mu.Unlock()
	key := sidecarKey{node, first.GetSidecarId()}
	defer func() {
		l.mu.Lock()
		delete(l.streams[node], ps)
		// A sidecar whose stream ended no longer offers demand; a restarted one reports
		// under a new id, and counting both would double the node's demand.
		delete(l.latest, key)
		l.mu.Unlock()
	}()
	l.store(first)

	sendErr := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stream.Context().Done():
				return
			case p := <-ps.ch:
				if err := stream.Send(p); err != nil {
					sendErr <- err
					return
				}
			}
		}
	}()
	for {
		rep, err := stream.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		if rep.GetNodeId() != node {
			return status.Errorf(codes.InvalidArgument, "node_id changed from %q to %q on one stream", node, rep.GetNodeId())
		}
		l.store(rep)
		select {
		case err := <-sendErr:
			return err
		default:
		}
	}
}

func (l *loadReports) store(rep *meridianv1.LoadReport) {
	key := sidecarKey{rep.GetNodeId(), rep.GetSidecarId()}
	l.mu.Lock()
	defer l.mu.Unlock()
	prev, seen := l.latest[key]
	a := 1 - math.Exp(-rep.GetWindowSeconds()/demandTimeConstant.Seconds())
	demand := map[string]float64{}
	for _, d := range rep.GetDemand() {
		x := d.GetRequestsPerSecond()
		if old, ok := prev.demand[d.GetModel()]; seen && ok {
			x = old + a*(x-old)
		}
		demand[d.GetModel()] = x
	}
	for m, old := range prev.demand {
		if _, ok := demand[m]; !ok && old*(1-a) > 1e-3 {
			demand[m] = old * (1 - a) // no arrivals for m in this window
		}
	}
	l.latest[key] = received{rep: rep, at: l.now(), demand: demand}
}

// setPolicies records each node's policy and pushes the changed ones.
func (l *loadReports) setPolicies(ps map[string]*meridianv1.Policy) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for node, p := range ps {
		if old := l.policies[node]; old != nil && proto.Equal(old, p) {
			continue
		}
		l.policies[node] = p
		for s := range l.streams[node] {
			select {
			case <-s.ch: // drop the unsent older policy
			default:
			}
			s.ch <- p
		}
	}
}

// EngineView is what the sidecars' reports say about one engine, merged over sidecars.
type EngineView struct {
	Requests  float64
	Errors    float64
	TTFTP50   float64 // seconds, request-weighted mean of the sidecars' p50s
	InFlight  float64
	Penalty   float64 // request-weighted mean of the sidecars' factors (1 = none)
	Reporters int
	weight    float64
}

// snapshot merges the reports received within staleAfter: demand per node and model
// (summed over a node's sidecars) and per-engine views.
func (l *loadReports) snapshot(staleAfter time.Duration) (optimizer.Inputs, map[string]EngineView) {
	now := l.now()
	in := optimizer.Inputs{Demand: map[string]map[string]float64{}, Engines: map[string]optimizer.EngineInput{}}
	views := map[string]EngineView{}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, r := range l.latest {
		if now.Sub(r.at) > staleAfter {
			delete(l.latest, k) // a sidecar that stopped reporting no longer adds demand
			continue
		}
		if in.Demand[k.node] == nil {
			in.Demand[k.node] = map[string]float64{}
		}
		for m, rate := range r.demand {
			in.Demand[k.node][m] += rate
		}
		for _, e := range r.rep.GetEngines() {
			v := views[e.GetEngine()]
			// Weighted by requests seen, and at least 1, so an idle sidecar's view still counts.
			w := max(float64(e.GetRequests()), 1)
			pen := e.GetPenalty()
			if pen <= 0 || pen > 1 {
				pen = 1
			}
			v.TTFTP50 = weighted(v.TTFTP50, v.weight, e.GetTtftP50Seconds(), w)
			v.Penalty = weighted(v.Penalty, v.weight, pen, w)
			v.weight += w
			v.Requests += float64(e.GetRequests())
			v.Errors += float64(e.GetErrors())
			v.InFlight += e.GetInFlight()
			v.Reporters++
			views[e.GetEngine()] = v
		}
	}
	for name, v := range views {
		in.Engines[name] = optimizer.EngineInput{Penalty: v.Penalty}
	}
	return in, views
}

// weighted folds value b (weight wb > 0) into the running mean a (weight wa).
func weighted(a, wa, b, wb float64) float64 { return (a*wa + b*wb) / (wa + wb) }
