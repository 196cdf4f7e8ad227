package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/mtls"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
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

// The peer service as the sidecar serves it with TLS: a sidecar of the same node watches
// and gets snapshots; another node's sidecar, the node's Envoy and a plaintext client are
// refused before any snapshot.
func TestPeerServiceAnswersOnlyTheNodesSidecars(t *testing.T) {
	dir := t.TempDir()
	ca, err := mtls.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	ids := []mtls.Identity{mtls.Sidecar("a"), mtls.Sidecar("b"), mtls.Envoy("a")}
	for _, id := range ids {
		if _, err := ca.WriteIdentity(dir, id, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.DiscardHandler)
	source := func(id mtls.Identity) *mtls.Source {
		s, err := mtls.NewSource(mtls.FilesIn(dir, id), id, log)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	srv, err := server.New(server.DefaultConfig(log))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	gs, addr, err := servePeers(ctx, flags{nodeID: "a", sidecarID: "s1", peerListen: "127.0.0.1:0"}, srv, source(mtls.Sidecar("a")), errc)
	if err != nil {
		t.Fatal(err)
	}
	defer gs.Stop()
	watch := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second) // a bound, not a timing assertion
		defer wcancel()
		st, err := meridianv1.NewPeerLoadClient(conn).WatchInFlight(wctx, &meridianv1.PeerHello{NodeId: "a", SidecarId: "s2"})
		if err != nil {
			return err
		}
		m, err := st.Recv()
		if err == nil && m.GetSidecarId() != "s1" {
			t.Errorf("snapshot from %q, want s1", m.GetSidecarId())
		}
		return err
	}
	if err := watch(source(mtls.Sidecar("a")).ClientCredentials(mtls.Sidecar("a"))); err != nil {
		t.Errorf("the node's sidecar could not watch: %v", err)
	}
	for _, id := range []mtls.Identity{mtls.Sidecar("b"), mtls.Envoy("a")} {
		if err := watch(source(id).ClientCredentials(mtls.Sidecar("a"))); err == nil {
			t.Errorf("%s got a snapshot of node a's sidecar", id)
		}
	}
	if err := watch(insecure.NewCredentials()); err == nil {
		t.Error("a plaintext client got a snapshot")
	}
}
