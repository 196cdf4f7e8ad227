package main

import (
	"log/slog"
	"testing"

	"github.com/meridian-router/meridian/mtls"
)

// Only a sidecar of the same node may watch a sidecar's requests in flight: another
// node's sidecar, and this node's Envoy, are refused at the handshake.
func TestOnlyTheNodesSidecarsArePeers(t *testing.T) {
	allow := sidecarOf("region-a")
	if err := allow(mtls.Sidecar("region-a")); err != nil {
		t.Errorf("the node's sidecar refused: %v", err)
	}
	for _, id := range []mtls.Identity{mtls.Sidecar("region-b"), mtls.Envoy("region-a"), mtls.Control()} {
		if allow(id) == nil {
			t.Errorf("%s allowed to watch a sidecar of region-a", id)
		}
	}
}

// Without TLS, peers off this machine are refused unless --insecure, as --listen is.
func TestPlaintextPeersOffLoopbackNeedInsecure(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	base := flags{listen: "127.0.0.1:1", control: "127.0.0.1:2"}
	for _, f := range []flags{
		func() flags { f := base; f.peerListen = "0.0.0.0:19082"; return f }(),
		func() flags { f := base; f.peers = "127.0.0.1:3, gateway-peers.ns.svc:19082"; return f }(),
	} {
		if _, err := transport(f, log); err == nil {
			t.Errorf("peer-listen %q peers %q accepted in plaintext without --insecure", f.peerListen, f.peers)
		}
		f.insecure = true
		if _, err := transport(f, log); err != nil {
			t.Errorf("with --insecure: %v", err)
		}
	}
	ok := base
	ok.peerListen, ok.peers = "127.0.0.1:19082", "127.0.0.1:19083,localhost:19084"
	if _, err := transport(ok, log); err != nil {
		t.Errorf("loopback peers refused: %v", err)
	}
	if got := peerList(" a:1, ,b:2,"); len(got) != 2 || got[0] != "a:1" || got[1] != "b:2" {
		t.Errorf("peerList = %q", got)
	}
}
