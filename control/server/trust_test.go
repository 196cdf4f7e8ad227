package server_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meridian-router/meridian/control/server"
	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/mtls"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

const twoNodeFleet = `
models: [{name: m}]
clusters: [{name: region-a, region: a}, {name: region-b, region: b}]
engines:
  - {name: e0, address: "127.0.0.1:1", region: a, models: [m], capacity_rps: 10, metrics_url: "METRICS"}
  - {name: e1, address: "127.0.0.1:2", region: a, models: [m], capacity_rps: 10, metrics_url: "METRICS"}
rtt_ms: {region-a: {a: 1}, region-b: {a: 30}}
`

// trustPKI writes a throwaway CA and the control server's, region-a's and region-b's
// sidecar certificates into a temporary directory.
func trustPKI(t *testing.T) (dir string, ca *mtls.CA) {
	t.Helper()
	dir = t.TempDir()
	ca, err := mtls.NewCA("meridian test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	for _, id := range []mtls.Identity{mtls.Control(), mtls.Sidecar("region-a"), mtls.Sidecar("region-b")} {
		if _, err := ca.WriteIdentity(dir, id, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	return dir, ca
}

func dialAs(t *testing.T, addr string, creds credentials.TransportCredentials) meridianv1.LoadReportingClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return meridianv1.NewLoadReportingClient(conn)
}

func sidecarCreds(t *testing.T, dir, node string) credentials.TransportCredentials {
	t.Helper()
	src, err := mtls.NewSource(mtls.FilesIn(dir, mtls.Sidecar(node)), mtls.Sidecar(node), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return src.ClientCredentials(mtls.Control())
}

// reportOnce opens a stream, sends rep and returns the stream's end status within 2 s
// (codes.OK if it is still open and took the report).
func reportOnce(t *testing.T, c meridianv1.LoadReportingClient, rep *meridianv1.LoadReport) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stream, err := c.StreamLoad(ctx)
	if err != nil {
		return status.Code(err)
	}
	if err := stream.Send(rep); err != nil && err != io.EOF {
		return status.Code(err)
	}
	_, err = stream.Recv()
	if status.Code(err) == codes.DeadlineExceeded {
		return codes.OK
	}
	if err == nil {
		return codes.OK
	}
	return status.Code(err)
}

func forged(node string) *meridianv1.LoadReport {
	return &meridianv1.LoadReport{NodeId: node, SidecarId: "forger", WindowSeconds: 1,
		Demand: []*meridianv1.ModelDemand{{Model: "m", RequestsPerSecond: 1_000_000}}}
}

// TestTrustReportsNeedTheNodesOwnCertificate: with TLS on, a client without a certificate
// cannot even connect, and region-b's sidecar certificate cannot report for region-a; both
// are refused before anything counts, and the refusals are counted.
func TestTrustReportsNeedTheNodesOwnCertificate(t *testing.T) {
	dir, _ := trustPKI(t)
	xdsAddr, base := startServerFleet(t, twoNodeFleet, func(c *server.Config) {
		c.TLS, c.TLSReload = mtls.FilesIn(dir, mtls.Control()), time.Second
	})
	// No certificate at all: plaintext, and TLS without a client certificate.
	if code := reportOnce(t, dialAs(t, xdsAddr, insecure.NewCredentials()), forged("region-a")); code != codes.Unavailable {
		t.Errorf("plaintext report stream: %v, want Unavailable (no connection)", code)
	}
	noCert := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if code := reportOnce(t, dialAs(t, xdsAddr, noCert), forged("region-a")); code == codes.OK {
		t.Error("a TLS client without a certificate opened a report stream")
	}
	// region-b's certificate, region-a's node id.
	if code := reportOnce(t, dialAs(t, xdsAddr, sidecarCreds(t, dir, "region-b")), forged("region-a")); code != codes.PermissionDenied {
		t.Errorf("region-b's sidecar reporting for region-a: %v, want PermissionDenied", code)
	}
	// region-a's own certificate is accepted (and its demand clamped, see below).
	if code := reportOnce(t, dialAs(t, xdsAddr, sidecarCreds(t, dir, "region-a")), forged("region-a")); code != codes.OK {
		t.Errorf("region-a's sidecar reporting for region-a: %v, want the stream kept", code)
	}
	m := controlMetrics(t, base)
	if got := m.Value("meridian_control_reports_refused_total", "reason", "wrong_node"); got < 1 {
		t.Errorf("wrong_node refusals %v, want ≥ 1", got)
	}
	if got := m.ByLabel("meridian_control_tls_handshake_failures_total", "reason"); len(got) == 0 {
		t.Errorf("no handshake failure counted for the certificate-less clients")
	}
	if d := demand(t, base); d != 0 {
		t.Errorf("demand %.0f req/s counted from refused or ended streams", d)
	}
}

// TestTrustReportValuesAreBoundedAndLeaveWithTheStream: the forged reports of the issue,
// from a peer allowed to report for the node. A million req/s is clamped to 4 × the
// model's capacity; an unknown engine is dropped without creating state; an error storm
// with penalty 0.01 on a healthy engine makes it suspect only while the stream lasts: once
// the forging stream closes, the engine is back at penalty 1 (exactly: nothing fades it
// there otherwise) within a few solve periods.
func TestTrustReportValuesAreBoundedAndLeaveWithTheStream(t *testing.T) {
	xdsAddr, base := startServerFleet(t, twoNodeFleet)
	c := dialAs(t, xdsAddr, insecure.NewCredentials())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.StreamLoad(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep := forged("region-a")
	rep.Engines = []*meridianv1.EngineObservation{
		{Engine: "e0", Requests: 100, Errors: 100, Penalty: 0.01},
		{Engine: "no-such-engine", Requests: 5, Penalty: 0.5},
		{Engine: "e1", Requests: 10, Penalty: 7}, // out of range: dropped, counts kept
	}
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
	var st server.State
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := stream.Send(rep); err != nil {
			t.Fatal(err)
		}
		st = debugState(t, base)
		if e := engine(st, "e0"); e.Suspect && e.Penalty != nil && *e.Penalty < 0.1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the error storm never marked e0 suspect: %+v", engine(st, "e0"))
		}
	}
	if d := st.Nodes["region-a"].Models["m"].DemandRPS; d > 4*20+1e-6 || d < 79 {
		t.Errorf("demand %.1f req/s from a report of 1,000,000: want it clamped to 4 × 20 = 80", d)
	}
	if p := engine(st, "e1").Penalty; p == nil || *p != 1 {
		t.Errorf("e1's penalty %v after a report of 7: want the out-of-range value ignored (1)", p)
	}
	for _, e := range st.Engines {
		if e.Name == "no-such-engine" {
			t.Error("an unknown engine name in a report created state")
		}
	}
	m := controlMetrics(t, base)
	for _, reason := range []string{"demand_clamped", "unknown_engine", "penalty_out_of_range"} {
		if m.Value("meridian_control_report_entries_dropped_total", "reason", reason) < 1 {
			t.Errorf("no %s counted", reason)
		}
	}
	// The forger leaves: its influence leaves with it.
	closed := time.Now()
	cancel()
	for ; ; time.Sleep(20 * time.Millisecond) {
		st = debugState(t, base)
		e := engine(st, "e0")
		if !e.Suspect && e.Penalty != nil && *e.Penalty == 1 && st.Nodes["region-a"].Models["m"].DemandRPS == 0 {
			break
		}
		if time.Since(closed) > 3*time.Second { // a few solve periods (100 ms here), with room for -race on a loaded machine
			t.Fatalf("3 s after the forging stream closed: e0 %+v, demand %.1f; want penalty 1, not suspect, demand 0",
				e, st.Nodes["region-a"].Models["m"].DemandRPS)
		}
	}
	t.Logf("forged penalty and demand gone %s after the stream closed", time.Since(closed).Round(time.Millisecond))
}

// TestTrustUnknownNodeIsToldSo: a sidecar with a node id the fleet does not have is refused
// with NotFound naming the fleet's clusters, instead of waiting forever.
func TestTrustUnknownNodeIsToldSo(t *testing.T) {
	xdsAddr, _ := startServerFleet(t, twoNodeFleet)
	c := dialAs(t, xdsAddr, insecure.NewCredentials())
	if code := reportOnce(t, c, forged("region-z")); code != codes.NotFound {
		t.Errorf("report for an unknown node: %v, want NotFound", code)
	}
}

func debugState(t *testing.T, base string) server.State {
	t.Helper()
	resp, err := http.Get(base + "/debug/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st server.State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func engine(st server.State, name string) server.EngineState {
	for _, e := range st.Engines {
		if e.Name == name {
			return e
		}
	}
	return server.EngineState{}
}

func controlMetrics(t *testing.T, base string) stack.Metrics {
	t.Helper()
	m, err := stack.ScrapeMetrics(context.Background(), base+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestTrustADSServesOnlyTheCertificatesNode: an Envoy certificate of region-b asking for
// region-a's resources is refused; asking for its own node it gets them. (A node id the
// fleet lacks: TestTrustSilentFailuresAreLogged in envoy/chaos.)
func TestTrustADSServesOnlyTheCertificatesNode(t *testing.T) {
	dir, ca := trustPKI(t)
	if _, err := ca.WriteIdentity(dir, mtls.Envoy("region-b"), time.Hour); err != nil {
		t.Fatal(err)
	}
	xdsAddr, _ := startServerFleet(t, twoNodeFleet, func(c *server.Config) {
		c.TLS, c.TLSReload = mtls.FilesIn(dir, mtls.Control()), time.Second
	})
	src, err := mtls.NewSource(mtls.FilesIn(dir, mtls.Envoy("region-b")), mtls.Envoy("region-b"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(src.ClientCredentials(mtls.Control())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fetch := func(node string) (int, codes.Code) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			return 0, status.Code(err)
		}
		if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: resourcev3.ClusterType}); err != nil {
			return 0, status.Code(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			return 0, status.Code(err)
		}
		return len(resp.GetResources()), codes.OK
	}
	if _, code := fetch("region-a"); code != codes.PermissionDenied {
		t.Errorf("region-b's Envoy fetching region-a: %v, want PermissionDenied", code)
	}
	if n, code := fetch("region-b"); code != codes.OK || n == 0 {
		t.Errorf("region-b's Envoy fetching region-b: %v with %d clusters, want its clusters", code, n)
	}
}
