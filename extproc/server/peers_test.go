package server_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meridian-router/meridian/extproc/server"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// servePeerLoad serves srv's PeerLoad on a loopback port and returns its address and
// gRPC server.
func servePeerLoad(t *testing.T, srv *server.Server, id string) (string, *grpc.Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	meridianv1.RegisterPeerLoadServer(g, srv.PeerLoad("region-a", id))
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String(), g
}

// waitGauge waits (up to a bound, not a timing assertion) for a gauge of srv to read want.
func waitGauge(t *testing.T, srv *server.Server, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for gauge(t, srv, name) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v, want %v within 10s", name, gauge(t, srv, name), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Two sidecars of one node over real gRPC: each request one holds in flight shows in the
// other's view within the peer interval and leaves it when it ends; a sidecar watching its
// own address (a headless Service lists every pod) recognizes itself; a peer reached at
// two addresses counts once, and is dropped when it is gone from both; and a watch that
// names another node is refused.
func TestPeersSeeEachOthersRequestsInFlight(t *testing.T) {
	h1, h2 := newHarness(t), newHarness(t)
	a1, g1 := servePeerLoad(t, h1.srv, "s1")
	a1b, g1b := servePeerLoad(t, h1.srv, "s1") // h1 again, at a second address (A and AAAA records)
	a2, _ := servePeerLoad(t, h2.srv, "s2")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	dialPeer := func(target string) (*grpc.ClientConn, error) {
		return grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	wg.Go(func() { h2.srv.WatchPeers(ctx, []string{a1, a1b, a2}, dialPeer, "region-a", "s2") })
	waitGauge(t, h2.srv, "meridian_sidecar_peers", 1)

	// A request Envoy holds open on h1 (its stream not yet closed) is in flight there.
	rctx, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	st, err := h1.proc.Process(rctx)
	if err != nil {
		t.Fatal(err)
	}
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":path", RawValue: []byte("/v1/chat/completions")}, {Key: ":method", RawValue: []byte("POST")}}}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody("llama", "hello")), EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || header(r, "x-gateway-destination-endpoint") == "" {
		t.Fatalf("body response %v, %v: want a steered request", r, err)
	}
	if v := gauge(t, h1.srv, "meridian_sidecar_engine_in_flight"); v != 1 {
		t.Fatalf("h1 holds %v requests in flight, want 1", v)
	}
	waitGauge(t, h2.srv, "meridian_sidecar_engine_peer_in_flight", 1)
	time.Sleep(50 * time.Millisecond) // several peer intervals: a second count would show by now
	if v := gauge(t, h2.srv, "meridian_sidecar_engine_peer_in_flight"); v != 1 {
		t.Errorf("h2 counts %v of h1's requests, want 1: h1 reached at two addresses counts once", v)
	}
	if v := gauge(t, h2.srv, "meridian_sidecar_engine_in_flight"); v != 0 {
		t.Errorf("h2's own in flight = %v: a peer's request is not its own", v)
	}
	// The stream closes: h1 releases the request, and h2 hears it.
	rcancel()
	waitGauge(t, h2.srv, "meridian_sidecar_engine_peer_in_flight", 0)

	// h1 goes away at one address: its other stream still counts. Then at both: h2
	// forgets it.
	g1.Stop()
	time.Sleep(50 * time.Millisecond)
	if v := gauge(t, h2.srv, "meridian_sidecar_peers"); v != 1 {
		t.Errorf("h2 holds %v peers with h1 still reachable at its second address, want 1", v)
	}
	g1b.Stop()
	waitGauge(t, h2.srv, "meridian_sidecar_peers", 0)

	// A sidecar of another node may not watch.
	conn := dial(t, a2)
	ws, err := meridianv1.NewPeerLoadClient(conn).WatchInFlight(ctx, &meridianv1.PeerHello{NodeId: "region-b", SidecarId: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("another node's watch ended with %v, want InvalidArgument", err)
	}
}

// silentPeer sends one snapshot on its first stream and nothing on later ones: a peer that
// is connected and hung.
type silentPeer struct {
	meridianv1.UnimplementedPeerLoadServer
	streams atomic.Int32
}

func (p *silentPeer) WatchInFlight(_ *meridianv1.PeerHello, st meridianv1.PeerLoad_WatchInFlightServer) error {
	if p.streams.Add(1) == 1 {
		if err := st.Send(&meridianv1.InFlight{SidecarId: "hung"}); err != nil {
			return err
		}
	}
	<-st.Context().Done()
	return nil
}

// A peer that stays connected but stops sending is forgotten after its silence.
func TestASilentPeerIsForgotten(t *testing.T) {
	h := newHarness(t)
	addr := serve(t, func(g *grpc.Server) { meridianv1.RegisterPeerLoadServer(g, &silentPeer{}) })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	dialPeer := func(target string) (*grpc.ClientConn, error) {
		return grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	wg.Go(func() { h.srv.WatchPeers(ctx, []string{addr}, dialPeer, "region-a", "s2") })
	waitGauge(t, h.srv, "meridian_sidecar_peers", 1)
	waitGauge(t, h.srv, "meridian_sidecar_peers", 0) // after 3 s of silence (waitGauge's bound is 10 s)
}
