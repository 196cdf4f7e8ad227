package server

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meridian-router/meridian/control/xds"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
	"github.com/meridian-router/meridian/xdsapi"
)

// Placement relay bounds. A placement is one sidecar's hint to its peers; these keep what
// a buggy one can make the control server hold and send.
const (
	// placementBacklog is how many batches wait for one slow stream; the next is dropped.
	placementBacklog = 16
	// placementKeyMask keeps a placement key's upper 48 bits, as the sidecars store them.
	placementKeyMask = ^uint64(1<<16 - 1)
)

// Drop reasons of meridian_control_report_entries_dropped_total for placements.
const (
	dropUnknownAddress = "placement_unknown_address" // not an endpoint of the node's snapshot
	dropPlacementSlow  = "placement_slow_stream"     // a stream's backlog was full
)

// placementRelay serves meridian.v1.LoadReporting's ExchangePlacements: each batch a
// sidecar sends goes to every other placement stream of its node, and to no other node.
// Streams are admitted as load report streams are (reportGate.admit: on TLS the
// certificate must name a sidecar of the node), and a batch keeps only placements on
// endpoints of the node's current snapshot.
type placementRelay struct {
	gate  *reportGate
	tlsOn bool
	plan  func() *xds.Plan

	relayed prometheus.Counter

	mu      sync.Mutex
	streams map[string]map[*placementStream]struct{} // node -> streams
}

// placementStream is one sidecar's stream: the batches waiting to be sent to it.
type placementStream struct{ ch chan *meridianv1.Placements }

func newPlacementRelay(gate *reportGate, tlsOn bool, plan func() *xds.Plan) *placementRelay {
	return &placementRelay{gate: gate, tlsOn: tlsOn, plan: plan, streams: map[string]map[*placementStream]struct{}{},
		relayed: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_control_placements_relayed_total",
			Help: "Prefix placements relayed from one sidecar to another of its node (counted per receiving sidecar)."})}
}

// exchange runs one placement stream.
func (r *placementRelay) exchange(stream meridianv1.LoadReporting_ExchangePlacementsServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	node := first.GetNodeId()
	if node == "" {
		return status.Error(codes.InvalidArgument, "placement stream without node_id")
	}
	ps := &placementStream{ch: make(chan *meridianv1.Placements, placementBacklog)}
	r.mu.Lock()
	if err := r.gate.admit(stream.Context(), r.tlsOn, node, len(r.streams[node])); err != nil {
		r.mu.Unlock()
		return err
	}
	if r.streams[node] == nil {
		r.streams[node] = map[*placementStream]struct{}{}
	}
	r.streams[node][ps] = struct{}{}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.streams[node], ps)
		if len(r.streams[node]) == 0 {
			delete(r.streams, node)
		}
		r.mu.Unlock()
	}()

	sendErr := sendAll(stream.Context(), ps.ch, stream.Send)
	for b := first; ; {
		if err := r.relay(node, first.GetSidecarId(), ps, b); err != nil {
			return err
		}
		if b, err = stream.Recv(); errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		} else if err != nil {
			return err
		}
		select {
		case err := <-sendErr:
			return err
		default:
		}
	}
}

// relay checks one batch from the stream from and hands what it keeps to the node's
// other streams. A batch for another node ends the stream.
func (r *placementRelay) relay(node, sidecar string, from *placementStream, b *meridianv1.Placements) error {
	if n := b.GetNodeId(); n != "" && n != node {
		return status.Errorf(codes.InvalidArgument, "node_id changed from %q to %q on one stream", node, n)
	}
	if len(b.GetPlacements()) > meridianv1.MaxPlacementsPerBatch {
		return status.Errorf(codes.InvalidArgument, "%d placements in one batch: at most %d", len(b.GetPlacements()), meridianv1.MaxPlacementsPerBatch)
	}
	if len(b.GetPlacements()) == 0 {
		return nil
	}
	allowed := nodeAddresses(r.plan(), node)
	out := &meridianv1.Placements{Placements: make([]*meridianv1.Placement, 0, len(b.GetPlacements()))}
	unknown := 0
	for _, p := range b.GetPlacements() {
		if !allowed[p.GetAddress()] {
			unknown++
			continue
		}
		out.Placements = append(out.Placements, &meridianv1.Placement{Key: p.GetKey() & placementKeyMask, Address: p.GetAddress(), KvStamp: p.GetKvStamp()})
	}
	if unknown > 0 {
		r.gate.dropped.WithLabelValues(dropUnknownAddress).Add(float64(unknown))
		r.gate.note(dropUnknownAddress, "placements dropped", fmt.Errorf("node %q sidecar %q: %d placements on addresses outside the node's snapshot", node, sidecar, unknown))
	}
	if len(out.Placements) == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for s := range r.streams[node] {
		if s == from {
			continue
		}
		select {
		case s.ch <- out:
			r.relayed.Add(float64(len(out.Placements)))
		default:
			r.gate.dropped.WithLabelValues(dropPlacementSlow).Add(float64(len(out.Placements)))
		}
	}
	return nil
}

// nodeAddresses is the set of endpoint addresses the plan gives node, for any model.
func nodeAddresses(plan *xds.Plan, node string) map[string]bool {
	return nodeEndpoints(plan, node, func(e xdsapi.Endpoint) string { return e.Address })
}
