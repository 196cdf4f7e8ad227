package server

import (
	"context"
	"time"

	"google.golang.org/grpc"

	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// ApplyPolicy hands the control server's policy to the core. Parts that fail validation
// are refused and logged; the rest applies.
func (s *Server) ApplyPolicy(p *meridianv1.Policy) {
	if err := s.core.ApplyPolicy(p); err != nil {
		s.cfg.Log.Error("policy: part refused; keeping the current value", "version", p.GetVersion(), "err", err)
	}
}

// Report keeps a load-reporting stream to the control server open until ctx is done,
// sending a report every ReportInterval and applying every Policy received. It reconnects
// with backoff; while disconnected the sidecar keeps its last policy.
func (s *Server) Report(ctx context.Context, conn grpc.ClientConnInterface, nodeID, sidecarID string) {
	client := meridianv1.NewLoadReportingClient(conn)
	s.keepStream(ctx, func(ctx context.Context) error { return s.reportOnce(ctx, client, nodeID, sidecarID) })
}

// keepStream runs one stream to the control server (once) until ctx is done, again after
// each end: with a backoff from 100 ms doubling to 2 s, back to 100 ms after a stream that
// lasted 10 s, logging refusals (logReportEnd).
func (s *Server) keepStream(ctx context.Context, once func(context.Context) error) {
	backoff := 100 * time.Millisecond
	var refusedLogged time.Time
	for ctx.Err() == nil {
		began := time.Now()
		err := once(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		logReportEnd(s.cfg.Log, err, backoff, &refusedLogged)
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
	return tickStream(ctx, s.cfg.ReportInterval, func() error {
		p, err := stream.Recv()
		if err == nil {
			s.ApplyPolicy(p)
		}
		return err
	}, func() error { return stream.Send(s.core.BuildReport(nodeID, sidecarID)) })
}

// tickStream runs one open stream: recv in its own goroutine, over and over until it
// fails, and tick every period, until ctx is done or either fails (its error is returned).
func tickStream(ctx context.Context, every time.Duration, recv, tick func() error) error {
	recvErr := make(chan error, 1)
	go func() {
		for {
			if err := recv(); err != nil {
				recvErr <- err
				return
			}
		}
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return err
		case <-t.C:
			if err := tick(); err != nil {
				return err
			}
		}
	}
}
