package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meridian-router/meridian/control/server"
	"github.com/meridian-router/meridian/mtls"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// placementPeer is one sidecar's open placement stream and what it has received.
type placementPeer struct {
	stream meridianv1.LoadReporting_ExchangePlacementsClient
	got    chan *meridianv1.Placements
	end    chan error
}

func openPlacements(t *testing.T, ctx context.Context, c meridianv1.LoadReportingClient, node, sidecar string) *placementPeer {
	t.Helper()
	stream, err := c.ExchangePlacements(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&meridianv1.Placements{NodeId: node, SidecarId: sidecar}); err != nil {
		t.Fatal(err)
	}
	p := &placementPeer{stream: stream, got: make(chan *meridianv1.Placements, 64), end: make(chan error, 1)}
	go func() {
		for {
			b, err := stream.Recv()
			if err != nil {
				p.end <- err
				return
			}
			p.got <- b
		}
	}()
	return p
}

// The control server relays a sidecar's placements to the other sidecars of its node: not
// back to the sender, not to another node, and only on endpoints of the node's snapshot
// (with the key's lower 16 bits cleared, as sidecars store keys). Streams are admitted as
// load reports are: region-b's certificate cannot open region-a's.
func TestPlacementsReachOnlyTheNodesOtherSidecars(t *testing.T) {
	dir, _ := trustPKI(t)
	xdsAddr, base := startServerFleet(t, twoNodeFleet, func(c *server.Config) {
		c.TLS, c.TLSReload = mtls.FilesIn(dir, mtls.Control()), time.Second
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	asA, asB := dialAs(t, xdsAddr, sidecarCreds(t, dir, "region-a")), dialAs(t, xdsAddr, sidecarCreds(t, dir, "region-b"))

	forger := openPlacements(t, ctx, asB, "region-a", "forger")
	if err := <-forger.end; status.Code(err) != codes.PermissionDenied {
		t.Errorf("region-b's certificate opening region-a's placements: %v, want PermissionDenied", err)
	}

	a1, a2 := openPlacements(t, ctx, asA, "region-a", "a1"), openPlacements(t, ctx, asA, "region-a", "a2")
	b1 := openPlacements(t, ctx, asB, "region-b", "b1")
	batch := &meridianv1.Placements{Placements: []*meridianv1.Placement{
		{Key: 0x1234_5678_9abc_ffff, Address: "127.0.0.1:1", KvStamp: 123_456},
		{Key: 0x1111_2222_3333_0000, Address: "10.9.9.9:8000"}, // not an endpoint of region-a
	}}
	var got *meridianv1.Placements
	// Streams open asynchronously: resend until a2 has one.
	for deadline := time.Now().Add(10 * time.Second); got == nil && time.Now().Before(deadline); {
		if err := a1.stream.Send(batch); err != nil {
			t.Fatal(err)
		}
		select {
		case got = <-a2.got:
		case <-time.After(200 * time.Millisecond):
		}
	}
	if got == nil {
		t.Fatal("a2 received no placement from a1 within 10 s")
	}
	ps := got.GetPlacements()
	if len(ps) != 1 || ps[0].GetKey() != 0x1234_5678_9abc_0000 || ps[0].GetAddress() != "127.0.0.1:1" || ps[0].GetKvStamp() != 123_456 {
		t.Errorf("a2 received %v, want only the key on 127.0.0.1:1 with its lower 16 bits cleared, and its KV stamp", ps)
	}
	time.Sleep(300 * time.Millisecond) // let anything misrouted arrive
	select {
	case b := <-a1.got:
		t.Errorf("a1 got its own placements back: %v", b)
	case b := <-b1.got:
		t.Errorf("region-b got region-a's placements: %v", b)
	default:
	}
	m := controlMetrics(t, base)
	if v := m.Value("meridian_control_placements_relayed_total"); v < 1 {
		t.Errorf("placements relayed %v, want >= 1", v)
	}
	if v := m.Value("meridian_control_report_entries_dropped_total", "reason", "placement_unknown_address"); v < 1 {
		t.Errorf("placements on unknown addresses dropped %v, want >= 1", v)
	}
	// A batch for another node ends the stream.
	if err := a2.stream.Send(&meridianv1.Placements{NodeId: "region-b"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a2.end:
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("a batch naming another node: %v, want InvalidArgument", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("a batch naming another node did not end the stream")
	}
}
