package server

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/mtls"
)

// checkTransport refuses plaintext gRPC on an address other peers can reach, unless the
// operator said --insecure.
func (c Config) checkTransport() error {
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if c.TLS.Enabled() || c.Insecure {
		return nil
	}
	if !mtls.Loopback(c.XDSListen) {
		return fmt.Errorf("--xds-listen %s is not a loopback address and TLS is off: give --tls-cert, --tls-key and --tls-ca (docs/security.md), or --insecure to accept unauthenticated peers steering the fleet", c.XDSListen)
	}
	return nil
}

// transportOption is the gRPC server's credentials: mutual TLS from s.tls when configured.
// Every client must hold a certificate of meridian's CA naming a sidecar or an Envoy; what
// each may fetch or report is checked per stream (adsAuth, reportGate).
func (s *Server) transportOption() []grpc.ServerOption {
	if s.tls == nil {
		if !mtls.Loopback(s.cfg.XDSListen) {
			s.cfg.Log.Error("INSECURE: the xDS and load-report port accepts plaintext from anyone who can reach it; any peer can read every node's routing and steer the fleet with forged reports (--insecure)",
				"xds", s.cfg.XDSListen)
		}
		return nil
	}
	authorize := func(id mtls.Identity) error {
		if id.Role == mtls.RoleSidecar || id.Role == mtls.RoleEnvoy {
			return nil
		}
		return fmt.Errorf("identity %s is not allowed here: only a node's sidecar or Envoy connects to the control server", id)
	}
	return []grpc.ServerOption{grpc.Creds(s.tls.ServerCredentials(authorize, func(reason string) {
		s.metrics.handshakeFailures.WithLabelValues(reason).Inc()
	}))}
}

// adsAuth binds each ADS stream to the node its first request names, and refuses that node
// when the peer's certificate names another one or the fleet has no such cluster: an
// Envoy or a sidecar fetches only its own node's resources, and a wrong --node-id is told
// at once instead of waiting forever for a snapshot.
type adsAuth struct {
	tlsOn   bool
	fleet   func() *fleet.Fleet
	refused *prometheus.CounterVec
	note    func(reason, msg string, err error)

	mu      sync.Mutex
	streams map[int64]*adsStream
}

type adsStream struct {
	id    mtls.Identity
	hasID bool
	node  string // bound by the first request
}

func (a *adsAuth) open(ctx context.Context, stream int64) error {
	st := &adsStream{}
	if a.tlsOn {
		id, ok, err := mtls.PeerIdentity(ctx)
		if err != nil || !ok {
			a.refused.WithLabelValues(refuseNoIdentity).Inc()
			return status.Errorf(codes.Unauthenticated, "xDS needs a certificate naming a node's Envoy or sidecar: %v", err)
		}
		st.id, st.hasID = id, true
	}
	a.mu.Lock()
	a.streams[stream] = st
	a.mu.Unlock()
	return nil
}

func (a *adsAuth) closed(stream int64) {
	a.mu.Lock()
	delete(a.streams, stream)
	a.mu.Unlock()
}

// request checks one request of a stream; node is the request's node (nil after the first).
func (a *adsAuth) request(stream int64, node *corev3.Node) error {
	a.mu.Lock()
	st := a.streams[stream]
	a.mu.Unlock()
	if st == nil {
		return status.Error(codes.Internal, "xDS stream not opened")
	}
	if node == nil {
		if st.node == "" {
			return status.Error(codes.InvalidArgument, "the first xDS request must carry the node")
		}
		return nil
	}
	id := node.GetId()
	if st.node != "" && id != st.node {
		a.refused.WithLabelValues(refuseWrongNode).Inc()
		return status.Errorf(codes.PermissionDenied, "node changed from %q to %q on one stream", st.node, id)
	}
	if st.hasID && st.id.Node != id {
		err := status.Errorf(codes.PermissionDenied, "%s may fetch only node %q's resources, not %q", st.id, st.id.Node, id)
		a.refused.WithLabelValues(refuseWrongNode).Inc()
		a.note("ads_"+refuseWrongNode, "xDS stream refused", err)
		return err
	}
	f := a.fleet()
	if f == nil || !slices.ContainsFunc(f.Clusters, func(c fleet.Cluster) bool { return c.Name == id }) {
		err := status.Errorf(codes.NotFound, "node %q is not a cluster of the fleet file (clusters: %s): check --node-id", id, clusterNames(f))
		a.refused.WithLabelValues(refuseUnknownNode).Inc()
		a.note("ads_"+refuseUnknownNode, "xDS stream refused", err)
		return err
	}
	st.node = id
	return nil
}
