package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/mtls"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// TestTrustThroughEnvoy runs the issue's attacks against a real stack (mutual TLS on, the
// default): an oversized body, an engine that resets, a client reusing x-request-id to
// release other requests' in-flight tickets, and peers without the node's certificate.
func TestTrustThroughEnvoy(t *testing.T) {
	spec := evenThree()
	spec.SidecarArgs = []string{"--max-request-bytes", "4194304"}
	s := startStack(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t.Run("a 10 MB body over a 4 MB limit is an OpenAI 413 that no engine sees", func(t *testing.T) { oversized(ctx, t, s) })
	t.Run("an engine reset before headers is an OpenAI-shaped 503 naming the engine in a header", func(t *testing.T) { resetShaped(ctx, t, s) })
	t.Run("reusing x-request-id does not release other requests' in-flight caps", func(t *testing.T) { requestIDReuse(ctx, t, s) })
	t.Run("peers without the node's certificate are refused", func(t *testing.T) { peersRefused(ctx, t, s) })
}

func oversized(ctx context.Context, t *testing.T, s *stack.Stack) {
	before := len(accessLog(t, s, 0))
	body := chatBody(strings.Repeat("lorem ipsum ", 10<<20/12))
	r := post(ctx, t, s.Nodes[node].URL, body, nil)
	if r.status != 413 {
		t.Fatalf("a %d-byte body against a 4 MiB limit: status %d, want 413: %.200s", len(body), r.status, r.body)
	}
	if typ, err := openAIError(r.body); err != nil || typ != "invalid_request_error" {
		t.Errorf("413 body %.200s: %v (type %q), want OpenAI's error shape", r.body, err, typ)
	}
	if r.servedBy != "" {
		t.Errorf("answered by engine %s", r.servedBy)
	}
	entries := accessLog(t, s, before+1)[before:]
	if len(entries) != 1 || entries[0].UpstreamHost != "" || entries[0].Attempts != 0 {
		t.Errorf("access log %+v: want one entry that reached no engine", entries)
	}
	if r := post(ctx, t, s.Nodes[node].URL, chatBody(strings.Repeat("lorem ipsum ", 3<<20/12)), nil); r.status != 200 {
		t.Errorf("a 3 MB body under the 4 MiB limit: status %d, want 200: %.200s", r.status, r.body)
	}
	figure(t, "oversized_body_status", 413)
}

func resetShaped(ctx context.Context, t *testing.T, s *stack.Stack) {
	closing := stack.NoFaults()
	closing.CloseConnections = true
	for name := range s.Engines {
		if err := s.SetFaults(ctx, name, closing); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for name := range s.Engines {
			if err := s.SetFaults(ctx, name, stack.NoFaults()); err != nil {
				t.Error(err)
			}
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.Nodes[node].URL+"/v1/chat/completions", strings.NewReader(string(chatBody("reset probe"))))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 && resp.StatusCode != 502 {
		t.Fatalf("every engine resetting: status %d, want 502 or 503: %s", resp.StatusCode, b)
	}
	if _, err := openAIError(b); err != nil {
		t.Errorf("reset answer %q: %v, want OpenAI's error shape (not Envoy's plain text)", b, err)
	}
	up := resp.Header.Get("x-meridian-upstream")
	if s.EngineByAddress(up) == "" {
		t.Errorf("x-meridian-upstream %q names no engine of the stack", up)
	}
	if strings.Contains(string(b), up) {
		t.Errorf("the body names the engine %s; it belongs in the header only", up)
	}
	figure(t, "reset_answer", fmt.Sprintf("%d %s", resp.StatusCode, b))
}

// requestIDReuse: three engines capped at 2 in flight, all holding their requests. Six
// held streams carry x-request-id victim-N; a malformed request with each same id gets
// its 400. Before the fix that 400's outcome released the victim's ticket; now Envoy
// replaces client ids, so six more requests are shed and no engine holds more than 2.
func requestIDReuse(ctx context.Context, t *testing.T, s *stack.Stack) {
	const capPerEngine = 2
	setMaxInFlight(ctx, t, s, capPerEngine)
	defer setMaxInFlight(ctx, t, s, 0)
	hang := stack.NoFaults()
	hang.Hang = true
	for name := range s.Engines {
		if err := s.SetFaults(ctx, name, hang); err != nil {
			t.Fatal(err)
		}
	}
	url := s.Nodes[node].URL
	held := capPerEngine * len(s.Engines)
	var wg sync.WaitGroup
	hctx, release := context.WithCancel(ctx)
	defer func() {
		for name := range s.Engines {
			if err := s.SetFaults(ctx, name, stack.NoFaults()); err != nil {
				t.Error(err)
			}
		}
		release()
		wg.Wait()
	}()
	inFlight := func() float64 {
		m, err := s.SidecarMetrics(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		return m.Value("meridian_sidecar_engine_in_flight")
	}
	// One at a time: picks that run at once read the counts without coordination and may
	// overshoot a cap by the number of concurrent pickers (picker.Table.Pick), which would
	// leave another engine below its cap.
	for i := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = send(hctx, url, chatBody(fmt.Sprintf("victim %d", i)), map[string]string{"x-request-id": fmt.Sprintf("victim-%d", i)})
		}()
		for deadline := time.Now().Add(10 * time.Second); inFlight() < float64(i+1); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("held request %d never started: in flight %v, want %d", i, inFlight(), i+1)
			}
		}
	}
	// Envoy tells each client the id it gave the request, never the one the client sent.
	idReq, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader("hello"))
	idReq.Header.Set("x-request-id", "victim-0")
	if r, err := http.DefaultClient.Do(idReq); err != nil {
		t.Fatal(err)
	} else {
		r.Body.Close()
		if id := r.Header.Get("x-request-id"); id == "" || id == "victim-0" {
			t.Errorf("response x-request-id %q to a request sent with victim-0, want Envoy's own", id)
		}
	}
	// The attack: a 400 with each victim's id.
	for i := range held {
		if r := post(ctx, t, url, []byte("hello"), map[string]string{"x-request-id": fmt.Sprintf("victim-%d", i)}); r.status != 400 {
			t.Fatalf("malformed request: status %d, want 400", r.status)
		}
	}
	time.Sleep(500 * time.Millisecond) // the access log's outcomes reach the sidecar every 50 ms
	if got := inFlight(); got != float64(held) {
		t.Errorf("after the id-reusing 400s the sidecar counts %v in flight, want %d: tickets were released", got, held)
	}
	shed := 0
	for i := range held {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := send(rctx, url, chatBody(fmt.Sprintf("more %d", i)), map[string]string{"x-request-id": fmt.Sprintf("victim-%d", i)})
		cancel()
		if err == nil && r.status == 503 {
			shed++
		}
	}
	// What the engines carry, from Envoy's own count of active requests per host.
	most := 0
	for host, active := range activePerHost(ctx, t, s) {
		most = max(most, active)
		if active > capPerEngine {
			t.Errorf("engine %s carries %d requests at once, over its cap of %d", s.EngineByAddress(host), active, capPerEngine)
		}
	}
	figure(t, "requests_shed_after_id_reuse", fmt.Sprintf("%d/%d", shed, held))
	figure(t, "most_running_on_one_engine", most)
	if shed != held {
		t.Errorf("%d of %d requests over the caps were shed; want all (caps of %d on %d engines are full)", shed, held, capPerEngine, len(s.Engines))
	}
}

// activePerHost reads Envoy's /clusters: the active requests on each model host.
func activePerHost(ctx context.Context, t *testing.T, s *stack.Stack) map[string]int {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Nodes[node].AdminURL+"/clusters", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		// model-x::127.0.0.1:port::rq_active::N
		f := strings.Split(line, "::")
		if len(f) == 4 && strings.HasPrefix(f[0], "model-") && f[2] == "rq_active" {
			var n int
			fmt.Sscan(f[3], &n)
			out[f[1]] += n
		}
	}
	if len(out) == 0 {
		t.Fatalf("no rq_active in Envoy's /clusters:\n%.500s", b)
	}
	return out
}

// peersRefused: the control server refuses a report stream without a certificate, and
// region-b's certificate reporting for region-a; the sidecar refuses an Envoy certificate
// of another node.
func peersRefused(ctx context.Context, t *testing.T, s *stack.Stack) {
	forged := &meridianv1.LoadReport{NodeId: node, SidecarId: "forger", WindowSeconds: 1,
		Demand: []*meridianv1.ModelDemand{{Model: model, RequestsPerSecond: 1_000_000}}}
	if code := reportWith(ctx, t, s.ControlXDS, insecure.NewCredentials(), forged); code == codes.OK {
		t.Error("a plaintext report stream was accepted")
	}
	other, err := s.PKI.Issue(mtls.Sidecar("region-b"))
	if err != nil {
		t.Fatal(err)
	}
	if code := reportWith(ctx, t, s.ControlXDS, clientCreds(t, other, mtls.Sidecar("region-b"), mtls.Control()), forged); code != codes.PermissionDenied {
		t.Errorf("region-b's certificate reporting for %s: %v, want PermissionDenied", node, code)
	}
	m, err := s.ControlMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Value("meridian_control_reports_refused_total", "reason", "wrong_node") < 1 {
		t.Error("the wrong-node refusal was not counted")
	}
	// Another node's Envoy certificate at this node's sidecar: the handshake fails.
	envoyB, err := s.PKI.Issue(mtls.Envoy("region-b"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := tlsConfig(t, envoyB, mtls.Envoy("region-b"), mtls.Sidecar(node))
	conn, err := tls.Dial("tcp", s.Nodes[node].SidecarGRPC, cfg)
	if err == nil {
		// TLS 1.3: the server's verdict on the client certificate arrives with the first read.
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("region-b's Envoy certificate at %s's sidecar: %v, want a refused certificate", node, err)
	}
	sm, err := s.SidecarMetrics(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if sm.Value("meridian_sidecar_tls_handshake_failures_total") < 1 || sm.Value("meridian_sidecar_routing_ready") != 1 {
		t.Errorf("sidecar: handshake failures %v, routing_ready %v; want the refusal counted and ready 1",
			sm.Value("meridian_sidecar_tls_handshake_failures_total"), sm.Value("meridian_sidecar_routing_ready"))
	}
	if l, err := os.ReadFile(s.Control.Log); err != nil || !strings.Contains(string(l), "TLS handshake refused") {
		t.Errorf("the control server did not log the refused plaintext handshake (%v)", err)
	}
}

func reportWith(ctx context.Context, t *testing.T, addr string, creds credentials.TransportCredentials, rep *meridianv1.LoadReport) codes.Code {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	stream, err := meridianv1.NewLoadReportingClient(conn).StreamLoad(rctx)
	if err != nil {
		return status.Code(err)
	}
	if err := stream.Send(rep); err != nil && err != io.EOF {
		return status.Code(err)
	}
	if _, err = stream.Recv(); err == nil || status.Code(err) == codes.DeadlineExceeded {
		return codes.OK
	}
	return status.Code(err)
}

func source(t *testing.T, f mtls.Files, id mtls.Identity) *mtls.Source {
	t.Helper()
	src, err := mtls.NewSource(f, id, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func clientCreds(t *testing.T, f mtls.Files, id, server mtls.Identity) credentials.TransportCredentials {
	return source(t, f, id).ClientCredentials(server)
}

func tlsConfig(t *testing.T, f mtls.Files, id, server mtls.Identity) *tls.Config {
	c := source(t, f, id).ClientConfig(server)
	c.NextProtos = []string{"h2"}
	return c
}

// TestTrustRotationUnderLoad replaces every certificate while a steady load runs: no
// request fails, every process reloads, new handshakes present the new certificates, and
// after the control server restarts, Envoy and the sidecar reconnect with them.
func TestTrustRotationUnderLoad(t *testing.T) {
	s := startStack(t, evenThree())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	oldSerial := serialOf(t, s.PKI.Files(mtls.Control()).Cert)
	lr := startLoad(t, s.Nodes[node].URL, loadSpec{Rate: 20, Duration: 12 * time.Second, Output: 8, Stream: true, Seed: 71})
	lr.sleepTo(3 * time.Second)
	if err := s.PKI.Rotate(); err != nil {
		t.Fatal(err)
	}
	newSerial := serialOf(t, s.PKI.Files(mtls.Control()).Cert)
	if newSerial == oldSerial {
		t.Fatal("rotation kept the serial")
	}
	// Every Go process logs the reload; Envoy shows the new certificate in /certs.
	waitLog(t, s.Control, "TLS certificate reloaded", 5*time.Second)
	waitLog(t, s.Nodes[node].Sidecar, "TLS certificate reloaded", 5*time.Second)
	envoySerial := serialOf(t, s.PKI.Files(mtls.Envoy(node)).Cert)
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(adminCerts(ctx, t, s), envoySerial); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Envoy's /certs does not show the rotated certificate %s:\n%s", envoySerial, adminCerts(ctx, t, s))
		}
	}
	// A new handshake with the control server sees its new certificate.
	conn, err := tls.Dial("tcp", s.ControlXDS, tlsConfig(t, s.PKI.Files(mtls.Sidecar(node)), mtls.Sidecar(node), mtls.Control()))
	if err != nil {
		t.Fatal(err)
	}
	if got := conn.ConnectionState().PeerCertificates[0].SerialNumber.Text(16); strings.TrimLeft(got, "0") != strings.TrimLeft(newSerial, "0") {
		t.Errorf("new handshake: control presents %s, want the rotated %s", got, newSerial)
	}
	conn.Close()
	// The control server restarts: everyone re-handshakes with the rotated certificates.
	lr.sleepTo(6 * time.Second)
	s.Control.Stop(2 * time.Second)
	if err := s.Control.Start(); err != nil {
		t.Fatal(err)
	}
	if err := stack.WaitHTTP(ctx, s.ControlHTTP+"/healthz", 200); err != nil {
		t.Fatal(err)
	}
	sum, results := lr.wait(t)
	if sum.OK != sum.Requests {
		t.Errorf("%d of %d requests failed across the rotation: %v", sum.Requests-sum.OK, sum.Requests, failed(results))
	}
	// Envoy reconnected to the restarted control server over TLS, with its new certificate,
	// and no handshake failed there.
	for deadline := time.Now().Add(10 * time.Second); envoyStat(ctx, t, s, "control_plane.connected_state") != "1"; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Envoy did not reconnect to the restarted control server")
		}
	}
	m, err := s.ControlMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := m.Value("meridian_control_tls_handshake_failures_total"); n != 0 {
		t.Errorf("%v handshakes failed after the rotation", n)
	}
	figure(t, "requests_ok_across_rotation", fmt.Sprintf("%d/%d", sum.OK, sum.Requests))
}

// serialOf is the serial number of the PEM certificate in certFile, in lowercase hex with
// an even number of digits (as Envoy's /certs shows it).
func serialOf(t *testing.T, certFile string) string {
	t.Helper()
	b, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s holds no PEM block", certFile)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	h := c.SerialNumber.Text(16)
	if len(h)%2 == 1 {
		h = "0" + h
	}
	return h
}

func adminCerts(ctx context.Context, t *testing.T, s *stack.Stack) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Nodes[node].AdminURL+"/certs", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.ToLower(string(b))
}

// envoyStat reads one of Envoy's stats.
func envoyStat(ctx context.Context, t *testing.T, s *stack.Stack, name string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Nodes[node].AdminURL+"/stats?filter=^"+name+"$", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_, v, _ := strings.Cut(strings.TrimSpace(string(b)), ": ")
	return v
}

// waitLog waits until p's log contains want.
func waitLog(t *testing.T, p *stack.Proc, want string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		l, err := os.ReadFile(p.Log)
		if err == nil && strings.Contains(string(l), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %s; log tail:\n%s", p.Name, want, within, tail(string(l), 2000))
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestTrustSilentFailuresAreLogged: each failure an operator must fix says so in the log
// within its stated time: a sidecar with a node id the fleet lacks, or with no control
// server to reach, logs why every --no-snapshot-log (here 2 s) and /healthz says the
// same; an engine down when the control server starts is logged at its first scrape
// (before the first solve), counted, and left out of the published weights.
func TestTrustSilentFailuresAreLogged(t *testing.T) {
	s := startStack(t, withCapacity(oneNode(3, nil), 25)) // the optimizer's weights, not static ones
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bins, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	stray := func(name, nodeID, control string) (*stack.Proc, string) {
		t.Helper()
		files, err := s.PKI.Issue(mtls.Sidecar(nodeID))
		if err != nil {
			t.Fatal(err)
		}
		grpcPort, err := stack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		httpPort, err := stack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		p := &stack.Proc{Name: name, Bin: bins.Sidecar, Log: t.TempDir() + "/" + name + ".log", Args: []string{
			"--node-id", nodeID, "--control", control, "--no-snapshot-log", "2s",
			"--listen", fmt.Sprintf("127.0.0.1:%d", grpcPort), "--http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort),
			"--tls-cert", files.Cert, "--tls-key", files.Key, "--tls-ca", files.CA}}
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(2 * time.Second) })
		return p, fmt.Sprintf("http://127.0.0.1:%d/healthz", httpPort)
	}
	healthz := func(url string) string {
		resp, err := http.Get(url)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b)
	}

	wrong, wrongHealth := stray("sidecar-wrong-node", "region-z", s.ControlXDS)
	free, err := stack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	nowhere := fmt.Sprintf("127.0.0.1:%d", free)
	lost, lostHealth := stray("sidecar-no-control", node, nowhere)
	start := time.Now()
	waitLog(t, wrong, "no routing snapshot after", 5*time.Second)
	waitLog(t, wrong, "is not a cluster of the fleet file", time.Second)
	waitLog(t, lost, "no routing snapshot after", 5*time.Second)
	waitLog(t, lost, nowhere, time.Second)
	figure(t, "wrong_node_and_lost_control_logged_within", time.Since(start).Round(100*time.Millisecond).String())
	if h := healthz(wrongHealth); !strings.HasPrefix(h, "503") || !strings.Contains(h, "not a cluster of the fleet file") {
		t.Errorf("wrong node id: /healthz %q, want 503 saying the fleet lacks the node", h)
	}
	if h := healthz(lostHealth); !strings.HasPrefix(h, "503") || !strings.Contains(h, nowhere) {
		t.Errorf("no control server: /healthz %q, want 503 naming %s", h, nowhere)
	}
	m, err := stack.ScrapeMetrics(ctx, strings.TrimSuffix(wrongHealth, "/healthz")+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if m.Value("meridian_sidecar_routing_ready") != 0 || m.Value("meridian_sidecar_xds_stream_errors_total") < 1 {
		t.Errorf("wrong node id: routing_ready %v, xds_stream_errors_total %v; want 0 and counted",
			m.Value("meridian_sidecar_routing_ready"), m.Value("meridian_sidecar_xds_stream_errors_total"))
	}

	// An engine down when the control server starts.
	down := s.Engines["e2"]
	down.Proc.Stop(2 * time.Second)
	s.Control.Stop(2 * time.Second)
	old, _ := os.ReadFile(s.Control.Log)
	restarted := time.Now()
	if err := s.Control.Start(); err != nil {
		t.Fatal(err)
	}
	if err := stack.WaitHTTP(ctx, s.ControlHTTP+"/healthz", 200); err != nil {
		t.Fatal(err)
	}
	waitLog(t, s.Control, "engine metrics scrape failed", 3*time.Second)
	l, _ := os.ReadFile(s.Control.Log)
	if fresh := string(l[len(old):]); !strings.Contains(fresh, "engine metrics scrape failed") || !strings.Contains(fresh, "engine=e2") {
		t.Errorf("the scrape failure logged does not name e2:\n%s", tail(string(l), 1500))
	}
	figure(t, "engine_down_at_start_logged_within", time.Since(restarted).Round(100*time.Millisecond).String())
	ws, err := s.PublishedWeights(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	for _, hosts := range ws {
		if w, ok := hosts[down.Address]; ok {
			t.Errorf("the engine down at start has weight %d in the first published weights", w)
		}
	}
	if m, err = s.ControlMetrics(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Value("meridian_control_scrape_failures_total", "engine", "e2") < 1 {
		t.Error("meridian_control_scrape_failures_total{engine=e2} did not count the failed scrape")
	}
}
