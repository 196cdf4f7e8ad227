package server

import (
	"context"

	"google.golang.org/grpc"

	"github.com/meridian-router/meridian/extproc/decide"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// ExchangePlacements keeps a placement stream to the control server open until ctx is
// done: every PlacementInterval it sends the keys this sidecar placed since the last
// batch, and it adopts every batch the node's other sidecars placed, which the control
// server relays. A conversation whose turns reach different sidecars then finds the
// engine its previous turn went to (decide.Core.AdoptPlacements). It reconnects with
// backoff; while disconnected, placements made meanwhile are sent on reconnection (up to
// the journal's size) and keys fall back to their consistent-hash order.
func (s *Server) ExchangePlacements(ctx context.Context, conn grpc.ClientConnInterface, nodeID, sidecarID string) {
	client := meridianv1.NewLoadReportingClient(conn)
	s.keepStream(ctx, func(ctx context.Context) error { return s.exchangeOnce(ctx, client, nodeID, sidecarID) })
}

func (s *Server) exchangeOnce(ctx context.Context, client meridianv1.LoadReportingClient, nodeID, sidecarID string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.ExchangePlacements(ctx)
	if err != nil {
		return err
	}
	// The first message opens the stream for the node, placements or not.
	if err := stream.Send(&meridianv1.Placements{NodeId: nodeID, SidecarId: sidecarID}); err != nil {
		return err
	}
	var in []decide.Placement
	var out []decide.Placement
	return tickStream(ctx, s.cfg.PlacementInterval, func() error {
		b, err := stream.Recv()
		if err != nil {
			return err
		}
		in = in[:0]
		for _, p := range b.GetPlacements() {
			in = append(in, decide.Placement{Key: p.GetKey(), Address: p.GetAddress(), KVStamp: p.GetKvStamp()})
		}
		s.metrics.placements(0, s.core.AdoptPlacements(in))
		return nil
	}, func() error {
		out = s.core.AppendPlacements(out[:0])
		for len(out) > 0 {
			n := min(len(out), meridianv1.MaxPlacementsPerBatch)
			if err := stream.Send(placementBatch(out[:n])); err != nil {
				return err
			}
			s.metrics.placements(n, 0)
			out = out[n:]
		}
		return nil
	})
}

// placementBatch is ps as the wire carries them.
func placementBatch(ps []decide.Placement) *meridianv1.Placements {
	out := &meridianv1.Placements{Placements: make([]*meridianv1.Placement, len(ps))}
	for i, p := range ps {
		out.Placements[i] = &meridianv1.Placement{Key: p.Key, Address: p.Address, KvStamp: p.KVStamp}
	}
	return out
}
