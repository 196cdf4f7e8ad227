package server

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/xds"
	"github.com/meridian-router/meridian/mtls"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
	"github.com/meridian-router/meridian/xdsapi"
)

// Report bounds. A report is the word of one sidecar; these keep what a buggy or forged
// one can say within what the fleet could really see.
const (
	// maxDemandFactor bounds a node's reported demand for a model: at most this many times
	// the capacity of every engine serving the model. Real overload is a few times capacity;
	// a million req/s is not a measurement.
	maxDemandFactor = 4
	// maxReportersPerNode bounds the report streams (and so the state) of one node.
	maxReportersPerNode = 64
)

// reportGate decides which reports and which parts of them the control server believes.
// A sidecar's certificate names its node (mtls.Identity); it may report only for that
// node, only on models of the fleet and engines of that node's snapshot, and only values in
// their range. Refusals and drops are counted and logged (rate-limited, with the reason).
type reportGate struct {
	log   *slog.Logger
	fleet func() *fleet.Fleet
	plan  func() *xds.Plan

	refused *prometheus.CounterVec // streams or reports refused, by reason
	dropped *prometheus.CounterVec // entries dropped or clamped, by reason

	mu     sync.Mutex
	logged map[string]time.Time // by reason, for rate-limited logging
}

func newReportGate(log *slog.Logger, f func() *fleet.Fleet, p func() *xds.Plan) *reportGate {
	return &reportGate{log: log, fleet: f, plan: p, logged: map[string]time.Time{},
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_control_reports_refused_total",
			Help: "Load report streams or reports refused, by reason (see docs/security.md)."}, []string{"reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_control_report_entries_dropped_total",
			Help: "Entries of accepted load reports dropped or clamped, by reason."}, []string{"reason"}),
	}
}

// Refusal reasons (label values of meridian_control_reports_refused_total).
const (
	refuseNoIdentity   = "no_identity"    // TLS is on and the peer proved no sidecar identity
	refuseWrongNode    = "wrong_node"     // the certificate names another node
	refuseUnknownNode  = "unknown_node"   // the node is not a cluster of the fleet file
	refuseTooMany      = "too_many"       // the node has maxReportersPerNode streams already
	refuseInvalid      = "invalid"        // the report fails checkReport
	dropUnknownEngine  = "unknown_engine" // not in the node's snapshot
	dropUnknownModel   = "unknown_model"  // not a model of the fleet
	dropDemandClamped  = "demand_clamped"
	dropPenaltyInvalid = "penalty_out_of_range"
)

// admit checks the first report of a stream: who sent it, and whether its node exists. On
// a TLS connection (tlsOn) the peer's certificate must name a sidecar of the report's node.
func (g *reportGate) admit(ctx context.Context, tlsOn bool, node string, streams int) error {
	if tlsOn {
		id, ok, err := mtls.PeerIdentity(ctx)
		switch {
		case err != nil || !ok:
			return g.refuse(refuseNoIdentity, codes.Unauthenticated, "load reports need a sidecar certificate (spiffe://meridian/node/<node>/sidecar): %v", err)
		case id.Role != mtls.RoleSidecar:
			return g.refuse(refuseNoIdentity, codes.PermissionDenied, "%s may not send load reports; only a node's sidecar may", id)
		case id.Node != node:
			return g.refuse(refuseWrongNode, codes.PermissionDenied, "%s may report only for node %q, not %q", id, id.Node, node)
		}
	}
	f := g.fleet()
	if f == nil || !slices.ContainsFunc(f.Clusters, func(c fleet.Cluster) bool { return c.Name == node }) {
		return g.refuse(refuseUnknownNode, codes.NotFound, "node %q is not a cluster of the fleet file (clusters: %s): check the sidecar's --node-id", node, clusterNames(f))
	}
	if streams >= maxReportersPerNode {
		return g.refuse(refuseTooMany, codes.ResourceExhausted, "node %q already has %d report streams", node, streams)
	}
	return nil
}

func clusterNames(f *fleet.Fleet) string {
	if f == nil {
		return "none yet"
	}
	names := make([]string, 0, len(f.Clusters))
	for _, c := range f.Clusters {
		names = append(names, c.Name)
	}
	return fmt.Sprint(names)
}

// refuse counts and logs a refusal and returns it as a gRPC status.
func (g *reportGate) refuse(reason string, code codes.Code, format string, args ...any) error {
	g.refused.WithLabelValues(reason).Inc()
	err := status.Errorf(code, format, args...)
	g.note(reason, "load report stream refused", err)
	return err
}

// note logs at most once per reason every 30 s.
func (g *reportGate) note(reason, msg string, err error) {
	now := time.Now()
	g.mu.Lock()
	quiet := now.Sub(g.logged[reason]) < 30*time.Second
	if !quiet {
		g.logged[reason] = now
	}
	g.mu.Unlock()
	if !quiet {
		g.log.Warn(msg, "reason", reason, "err", err)
	}
}

// filter returns the part of rep the control server believes: demand only for the fleet's
// models, clamped to the plausible range; engines only of the node's snapshot, penalties
// only in (0, 1]. rep is not modified.
func (g *reportGate) filter(rep *meridianv1.LoadReport) *meridianv1.LoadReport {
	f, plan := g.fleet(), g.plan()
	out := proto.CloneOf(rep)
	out.Demand = out.Demand[:0]
	for _, d := range rep.GetDemand() {
		limit, known := demandLimit(f, d.GetModel())
		if !known {
			g.drop(dropUnknownModel, rep, d.GetModel())
			continue
		}
		if v := d.GetRequestsPerSecond(); v > limit {
			g.drop(dropDemandClamped, rep, fmt.Sprintf("%s: %.0f req/s > %.0f", d.GetModel(), v, limit))
			d = proto.CloneOf(d)
			d.RequestsPerSecond = limit
		}
		out.Demand = append(out.Demand, d)
	}
	allowed := nodeEngines(plan, rep.GetNodeId())
	out.Engines = out.Engines[:0]
	for _, o := range rep.GetEngines() {
		if !allowed[o.GetEngine()] {
			g.drop(dropUnknownEngine, rep, o.GetEngine())
			continue
		}
		if p := o.GetPenalty(); p != 0 && !(p > 0 && p <= 1) {
			g.drop(dropPenaltyInvalid, rep, fmt.Sprintf("%s: %v", o.GetEngine(), p))
			o = proto.CloneOf(o)
			o.Penalty = 0 // unset: the entry's counts still count
		}
		out.Engines = append(out.Engines, o)
	}
	return out
}

func (g *reportGate) drop(reason string, rep *meridianv1.LoadReport, what string) {
	g.dropped.WithLabelValues(reason).Inc()
	g.note(reason, "load report entry dropped", fmt.Errorf("node %q sidecar %q: %s", rep.GetNodeId(), rep.GetSidecarId(), what))
}

// demandLimit is the most demand for model a node may report, and whether model exists.
func demandLimit(f *fleet.Fleet, model string) (float64, bool) {
	if f == nil || !slices.ContainsFunc(f.Models, func(m fleet.Model) bool { return m.Name == model }) {
		return 0, false
	}
	capacity := 0.0
	for _, e := range f.Engines {
		if e.Serves(model) {
			capacity += e.CapacityRPS
		}
	}
	return math.Max(1, maxDemandFactor*capacity), true
}

// nodeEngines are the engines of node's snapshot (any model, any priority).
func nodeEngines(plan *xds.Plan, node string) map[string]bool {
	return nodeEndpoints(plan, node, func(e xdsapi.Endpoint) string { return e.Engine })
}

// nodeEndpoints is the set of key(endpoint) over the endpoints the plan gives node, for
// any model.
func nodeEndpoints(plan *xds.Plan, node string, key func(xdsapi.Endpoint) string) map[string]bool {
	out := map[string]bool{}
	if plan == nil {
		return out
	}
	for _, eps := range plan.Assignments[node] {
		for _, e := range eps {
			out[key(e)] = true
		}
	}
	return out
}
