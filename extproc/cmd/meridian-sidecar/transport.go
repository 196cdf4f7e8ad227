package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meridian-router/meridian/extproc/server"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"

	"github.com/meridian-router/meridian/mtls"
)

// transport loads the sidecar's certificate when TLS is configured (nil without), and
// refuses plaintext off this machine unless --insecure.
func transport(f flags, log *slog.Logger) (*mtls.Source, error) {
	if err := f.tls.Validate(); err != nil {
		return nil, err
	}
	if !f.tls.Enabled() {
		if f.insecure {
			log.Warn("INSECURE: plaintext ext_proc, control and peer (--peer-listen, --peers) connections; any peer that reaches them can steer or read this node's routing (--insecure)")
			return nil, nil
		}
		addrs := map[string]string{"--listen": f.listen, "--control": f.control}
		if f.peerListen != "" {
			addrs["--peer-listen"] = f.peerListen
		}
		for _, p := range peerList(f.peers) {
			addrs["--peers "+p] = p
		}
		for name, addr := range addrs {
			if !mtls.Loopback(addr) {
				return nil, fmt.Errorf("%s %s is not a loopback address and TLS is off: give --tls-cert, --tls-key and --tls-ca (docs/security.md), or --insecure", name, addr)
			}
		}
		return nil, nil
	}
	if f.tlsReload <= 0 {
		return nil, fmt.Errorf("--tls-reload must be > 0 (got %s)", f.tlsReload)
	}
	src, err := mtls.NewSource(f.tls, mtls.Sidecar(f.nodeID), log)
	if err != nil {
		return nil, fmt.Errorf("sidecar TLS: %w", err)
	}
	return src, nil
}

// peerList splits --peers into its host:port entries.
func peerList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// sidecarOf allows only the sidecars of node to watch this one (meridian.v1.PeerLoad).
func sidecarOf(node string) mtls.Authorize {
	want := mtls.Sidecar(node)
	return func(id mtls.Identity) error {
		if id != want {
			return fmt.Errorf("identity %s is not allowed here: only %s watches this sidecar's requests in flight", id, want)
		}
		return nil
	}
}

// maxPeerStreams bounds the WatchInFlight streams one peer connection may hold open.
const maxPeerStreams = 16

// servePeers serves meridian.v1.PeerLoad on --peer-listen (when given) and watches
// --peers (when given), both with the sidecar's mutual TLS identity when TLS is on: a
// peer must be a sidecar of the same node. It returns the peer gRPC server and its address
// (nil and "" when not serving); Serve's end goes to errc.
func servePeers(ctx context.Context, f flags, srv *server.Server, tlsSrc *mtls.Source, errc chan<- error) (*grpc.Server, string, error) {
	var gs *grpc.Server
	var addr string
	if f.peerListen != "" {
		ln, err := net.Listen("tcp", f.peerListen)
		if err != nil {
			return nil, "", fmt.Errorf("peer listen on %s: %w", f.peerListen, err)
		}
		addr = ln.Addr().String()
		// A node runs a few sidecars; each watches this one on one stream (two if it reaches
		// it at two addresses).
		opts := []grpc.ServerOption{grpc.MaxConcurrentStreams(maxPeerStreams)}
		if tlsSrc != nil {
			opts = append(opts, grpc.Creds(tlsSrc.ServerCredentials(sidecarOf(f.nodeID), nil)))
		}
		gs = grpc.NewServer(opts...)
		meridianv1.RegisterPeerLoadServer(gs, srv.PeerLoad(f.nodeID, f.sidecarID))
		go func() { errc <- gs.Serve(ln) }()
	}
	if peers := peerList(f.peers); len(peers) > 0 {
		creds := insecure.NewCredentials()
		if tlsSrc != nil {
			creds = tlsSrc.ClientCredentials(mtls.Sidecar(f.nodeID))
		}
		dial := func(target string) (*grpc.ClientConn, error) {
			return grpc.NewClient(target, grpc.WithTransportCredentials(creds))
		}
		go srv.WatchPeers(ctx, peers, dial, f.nodeID, f.sidecarID)
	}
	return gs, addr, nil
}

// envoyOf allows only the Envoy of node to call the sidecar (ext_proc and the access log).
func envoyOf(node string) mtls.Authorize {
	want := mtls.Envoy(node)
	return func(id mtls.Identity) error {
		if id != want {
			return fmt.Errorf("identity %s is not allowed here: only %s calls this sidecar", id, want)
		}
		return nil
	}
}
