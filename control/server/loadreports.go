package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// loadReports serves meridian.v1.LoadReporting: it keeps each sidecar's latest report and
// pushes each node's current Policy down every stream of that node.
type loadReports struct {
	meridianv1.UnimplementedLoadReportingServer
	log *slog.Logger

	// observe ingests each report; forget drops a sidecar whose stream ended.
	observe func(*meridianv1.LoadReport) error
	forget  func(node, sidecar string)
	// gate authorizes streams and filters reports; tlsOn says peers prove identities.
	gate  *reportGate
	tlsOn bool

	// placements relays the sidecars' prefix placements within each node.
	placements *placementRelay

	mu       sync.Mutex
	streams  map[string]map[*policyStream]struct{} // node -> streams
	policies map[string]*meridianv1.Policy
}

// policyStream hands policies to one stream's sender; only the newest one matters.
type policyStream struct{ ch chan *meridianv1.Policy }

func newLoadReports(log *slog.Logger, gate *reportGate, tlsOn bool, observe func(*meridianv1.LoadReport) error, forget func(node, sidecar string)) *loadReports {
	return &loadReports{log: log, gate: gate, tlsOn: tlsOn, observe: observe, forget: forget,
		streams: map[string]map[*policyStream]struct{}{}, policies: map[string]*meridianv1.Policy{}}
}

// ExchangePlacements relays one sidecar's prefix placements to its node's other sidecars
// and theirs to it (placements.go).
func (l *loadReports) ExchangePlacements(stream meridianv1.LoadReporting_ExchangePlacementsServer) error {
	return l.placements.exchange(stream)
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
	if err := l.gate.admit(stream.Context(), l.tlsOn, node, len(l.streams[node])); err != nil {
		l.mu.Unlock()
		return err
	}
	if l.streams[node] == nil {
		l.streams[node] = map[*policyStream]struct{}{}
	}
	l.streams[node][ps] = struct{}{}
	if p := l.policies[node]; p != nil {
		ps.ch <- p
	}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.streams[node], ps)
		l.mu.Unlock()
		// A sidecar whose stream ended no longer offers demand; a restarted one reports
		// under a new id, and counting both would double the node's demand.
		l.forget(node, first.GetSidecarId())
	}()
	l.store(first)

	sendErr := sendAll(stream.Context(), ps.ch, stream.Send)
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

// sendAll sends every message from ch on a stream until ctx is done, in its own
// goroutine; the returned channel gets the first send error.
func sendAll[T any](ctx context.Context, ch <-chan T, send func(T) error) <-chan error {
	errc := make(chan error, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-ch:
				if err := send(m); err != nil {
					errc <- err
					return
				}
			}
		}
	}()
	return errc
}

func (l *loadReports) store(rep *meridianv1.LoadReport) {
	if err := l.observe(l.gate.filter(rep)); err != nil {
		l.gate.refused.WithLabelValues(refuseInvalid).Inc()
		l.gate.note(refuseInvalid, "load report refused", fmt.Errorf("node %q sidecar %q: %w", rep.GetNodeId(), rep.GetSidecarId(), err))
	}
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
