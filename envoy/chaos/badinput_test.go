package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/bootstrap"
	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/server"
	"github.com/meridian-router/meridian/xdsapi"
)

// reply is what a client saw of one request.
type reply struct {
	status   int
	servedBy string
	body     []byte
}

// post sends a chat completion request and fails the test if no answer comes.
func post(ctx context.Context, t *testing.T, url string, body []byte, hdr map[string]string) reply {
	t.Helper()
	r, err := send(ctx, url, body, hdr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// send is post for goroutines other than the test's.
func send(ctx context.Context, url string, body []byte, hdr map[string]string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("POST %d bytes: %w", len(body), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("POST %d bytes: read the answer: %w", len(body), err)
	}
	return reply{status: resp.StatusCode, servedBy: resp.Header.Get("x-served-by"), body: b}, nil
}

// chatBody is a valid request for prompt, with fields overriding or adding to it.
func chatBody(prompt string) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 2,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	return b
}

// openAIError checks OpenAI's error shape: {"error": {"message", "type", "code"}}.
func openAIError(body []byte) (typ string, err error) {
	var doc struct {
		Error *struct {
			Message *string `json:"message"`
			Type    *string `json:"type"`
			Code    any     `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return "", fmt.Errorf("not JSON: %w", err)
	}
	if doc.Error == nil || doc.Error.Message == nil || *doc.Error.Message == "" || doc.Error.Type == nil {
		return "", fmt.Errorf("not OpenAI's error shape")
	}
	return *doc.Error.Type, nil
}

// TestChaosBadInput sends a corpus of hostile and malformed requests through Envoy: each
// gets the right 4xx in OpenAI's error shape from the sidecar (no engine sees it), or is
// passed through when it is merely unsteerable; steering, retry and priority headers a
// client sets are ignored; the sidecar never panics and its memory stays bounded.
func TestChaosBadInput(t *testing.T) {
	s := startStack(t, evenThree())
	n := s.Nodes[node]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pid := n.Sidecar.Pid()
	rssBefore := rss(t, n.Sidecar)
	envoyBefore := rss(t, n.Envoy)

	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	huge := strings.Repeat("lorem ipsum ", 10<<20/12)
	corpus := []struct {
		name   string
		body   []byte
		status int
		typ    string // error type; "" for a served request
		// engine: an engine may give the answer. Envoy sends no body message for an empty
		// body, so the sidecar cannot refuse it; the engine does.
		engine bool
	}{
		{"not JSON", []byte("hello"), 400, "invalid_request_error", false},
		{"truncated JSON", []byte(`{"model":"meridian-demo","messages":[{"role":"user","content":"hi"}`), 400, "invalid_request_error", false},
		{"empty body", nil, 400, "invalid_request_error", true},
		{"JSON array", []byte(`[1,2,3]`), 400, "invalid_request_error", false},
		{"model is a number", []byte(`{"model":42,"messages":[{"role":"user","content":"hi"}]}`), 400, "invalid_request_error", false},
		{"messages is a string", []byte(`{"model":"meridian-demo","messages":"hi"}`), 400, "invalid_request_error", false},
		{"stream is a string", []byte(`{"model":"meridian-demo","stream":"yes","messages":[{"role":"user","content":"hi"}]}`), 400, "invalid_request_error", false},
		{"content is a number", []byte(`{"model":"meridian-demo","messages":[{"role":"user","content":7}]}`), 400, "invalid_request_error", false},
		{"missing model", []byte(`{"messages":[{"role":"user","content":"hi"}]}`), 400, "invalid_request_error", false},
		{"missing messages", []byte(`{"model":"meridian-demo"}`), 400, "invalid_request_error", false},
		{"empty messages", []byte(`{"model":"meridian-demo","messages":[]}`), 400, "invalid_request_error", false},
		{"unknown model", []byte(`{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`), 404, "not_found_error", false},
		{"model name of 100 KB", []byte(`{"model":"` + strings.Repeat("m", 100<<10) + `","messages":[{"role":"user","content":"hi"}]}`), 400, "invalid_request_error", false},
		{"invalid UTF-8", []byte("{\"model\":\"meridian-demo\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\xfd\"}]}"), 400, "invalid_request_error", false},
		{"nested 100000 deep in messages", []byte(`{"model":"meridian-demo","messages":` + deep + `}`), 400, "invalid_request_error", false},
		{"nested 100000 deep in an unknown field", []byte(`{"model":"meridian-demo","x":` + deep + `,"messages":[{"role":"user","content":"hi"}]}`), 400, "invalid_request_error", false},
		{"unknown fields are fine", []byte(`{"model":"meridian-demo","foo":{"bar":[1,2]},"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`), 200, "", true},
		{"10 MB prompt", chatBody(huge), 200, "", true},
		{"10 MB prompt before the model", []byte(`{"messages":[{"role":"user","content":"` + huge + `"}],"max_tokens":2,"model":"meridian-demo"}`), 200, "", true},
	}
	before := len(accessLog(t, s, 0))
	for _, c := range corpus {
		r := post(ctx, t, n.URL, c.body, nil)
		if r.status != c.status {
			t.Errorf("%s: status %d, want %d: %.200s", c.name, r.status, c.status, r.body)
			continue
		}
		if c.typ == "" {
			continue
		}
		typ, err := openAIError(r.body)
		if err != nil || typ != c.typ {
			t.Errorf("%s: error type %q (%v), want %q: %.200s", c.name, typ, err, c.typ, r.body)
		}
		if r.servedBy != "" && !c.engine {
			t.Errorf("%s: answered by engine %s; the sidecar should have refused it", c.name, r.servedBy)
		}
	}
	entries := accessLog(t, s, before+len(corpus))[before:]
	for i, e := range entries {
		if i < len(corpus) && !corpus[i].engine && e.UpstreamHost != "" {
			t.Errorf("%s reached engine %s", corpus[i].name, e.UpstreamHost)
		}
	}
	figure(t, "corpus_requests", len(corpus))

	t.Run("client steering headers are ignored", func(t *testing.T) { steeringIgnored(ctx, t, s) })
	t.Run("client retry and timeout headers are ignored", func(t *testing.T) { retryHeadersIgnored(ctx, t, s) })
	t.Run("client priority header is ignored", func(t *testing.T) { priorityIgnored(ctx, t, s) })
	t.Run("bodies just over the buffer limit complete under load", func(t *testing.T) { overLimitBodies(ctx, t, s) })

	for range 5 { // memory: repeated big bodies must not accumulate
		if r := post(ctx, t, n.URL, chatBody(huge), nil); r.status != 200 {
			t.Fatalf("10 MB prompt: status %d", r.status)
		}
	}
	growth := rss(t, n.Sidecar) - rssBefore
	envoyGrowth := rss(t, n.Envoy) - envoyBefore
	figure(t, "sidecar_rss_growth_mb", round2(float64(growth)/(1<<20)))
	figure(t, "envoy_rss_growth_mb", round2(float64(envoyGrowth)/(1<<20)))
	if growth > 64<<20 || envoyGrowth > 128<<20 {
		t.Errorf("RSS grew by %d MB (sidecar) and %d MB (Envoy) over the corpus and five 10 MB bodies; want bounded (< 64 and < 128)",
			growth>>20, envoyGrowth>>20)
	}
	if n.Sidecar.Pid() != pid || !n.Sidecar.Running() {
		t.Errorf("the sidecar restarted or died (pid %d, was %d)", n.Sidecar.Pid(), pid)
	}
	if log, err := os.ReadFile(n.Sidecar.Log); err != nil || bytes.Contains(log, []byte("panic")) {
		t.Errorf("the sidecar's log mentions a panic (or is unreadable: %v)", err)
	}
}

func rss(t *testing.T, p *stack.Proc) int64 {
	t.Helper()
	v, err := p.RSS()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// steeringIgnored: a client naming an engine or a cluster does not move its request. Each
// request is sent once the sidecar has heard the previous ones end (their access log
// records come a few milliseconds later), so bounded loads see the same idle
// engines every time and only a client header could move the request.
func steeringIgnored(ctx context.Context, t *testing.T, s *stack.Stack) {
	url := s.Nodes[node].URL
	for i := range 4 {
		body := chatBody(fmt.Sprintf("steering probe %d", i))
		waitNothingInFlight(ctx, t, s)
		base := post(ctx, t, url, body, nil)
		for name, e := range s.Engines {
			if name == base.servedBy {
				continue
			}
			waitNothingInFlight(ctx, t, s)
			r := post(ctx, t, url, body, map[string]string{
				xdsapi.HeaderDestination: e.Address, xdsapi.HeaderCluster: "meridian-xds",
			})
			if r.status != 200 || r.servedBy != base.servedBy {
				t.Errorf("client asked for %s: status %d from %q, want 200 from %s", name, r.status, r.servedBy, base.servedBy)
			}
		}
	}
}

// retryHeadersIgnored: with every engine failing, a client asking for 10 retries gets no
// more attempts than the sidecar's budget; a client's 1 ms upstream timeout is dropped.
func retryHeadersIgnored(ctx context.Context, t *testing.T, s *stack.Stack) {
	url := s.Nodes[node].URL
	greedy := map[string]string{"x-envoy-max-retries": "10", "x-envoy-retry-on": "5xx,reset,connect-failure,retriable-status-codes",
		"x-envoy-retriable-status-codes": "500", "x-envoy-upstream-rq-timeout-ms": "1"}
	if r := post(ctx, t, url, chatBody("timeout probe"), greedy); r.status != 200 {
		t.Errorf("healthy engines, client-set 1 ms timeout: status %d, want 200 (the header must be stripped)", r.status)
	}
	failing := stack.NoFaults()
	failing.ErrorRate = 1
	for name := range s.Engines {
		if err := s.SetFaults(ctx, name, failing); err != nil {
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
	before := len(accessLog(t, s, 0))
	const probes = 5
	for i := range probes {
		if r := post(ctx, t, url, chatBody(fmt.Sprintf("retry probe %d", i)), greedy); r.status != 500 {
			t.Errorf("every engine failing: status %d, want 500", r.status)
		}
	}
	budget := int(guard.DefaultRetryConfig().Curve.MaxRetriesIdle)
	most := 0
	for _, e := range accessLog(t, s, before+probes)[before:] {
		most = max(most, e.Attempts)
	}
	figure(t, "max_attempts_with_client_asking_10_retries", most)
	if most > 1+budget {
		t.Errorf("a request made %d attempts; the sidecar's budget allows %d: the client's retry headers were honoured", most, 1+budget)
	}
}

// priorityIgnored: with every engine at its in-flight cap, a request claiming the highest
// priority is shed, and counted at the default priority.
func priorityIgnored(ctx context.Context, t *testing.T, s *stack.Stack) {
	setMaxInFlight(ctx, t, s, 1)
	defer setMaxInFlight(ctx, t, s, 0)
	hang := stack.NoFaults()
	hang.Hang = true
	for name := range s.Engines {
		if err := s.SetFaults(ctx, name, hang); err != nil {
			t.Fatal(err)
		}
	}
	url := s.Nodes[node].URL
	// Concurrent picks may overshoot a cap by the number of pickers (picker.Table.Pick), so
	// two of the first holds can land on one engine and leave another free: hold more, at
	// most extraHolds, until every engine has one.
	const extraHolds = 6
	hung := make(chan reply, len(s.Engines)+extraHolds)
	holds := 0
	hold := func() {
		i := holds
		holds++
		go func() {
			r, err := send(ctx, url, chatBody(fmt.Sprintf("hold %d", i)), nil)
			if err != nil {
				r.status = -1
			}
			hung <- r
		}()
	}
	for range len(s.Engines) {
		hold()
	}
	sheds := func() map[string]float64 {
		m, err := s.SidecarMetrics(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		return m.ByLabel("meridian_sidecar_sheds_total", "priority")
	}
	for start, deadline := time.Now(), time.Now().Add(5*time.Second); ; time.Sleep(20 * time.Millisecond) {
		m, err := s.SidecarMetrics(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		busy := m.ByLabel("meridian_sidecar_engine_in_flight", "engine")
		occupied := 0
		for _, v := range busy {
			if v >= 1 {
				occupied++
			}
		}
		if occupied >= len(s.Engines) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the held requests never occupied every engine: %v", busy)
		}
		if holds < len(s.Engines)+extraHolds && time.Since(start) > time.Duration(holds-len(s.Engines)+1)*500*time.Millisecond {
			hold() // an engine is still free after half a second more: another hold fills it
		}
	}
	r := post(ctx, t, url, chatBody("priority probe"), map[string]string{"x-meridian-priority": "3"})
	got := sheds()
	for name := range s.Engines {
		if err := s.SetFaults(ctx, name, stack.NoFaults()); err != nil {
			t.Fatal(err)
		}
	}
	for range holds {
		<-hung
	}
	if r.status != 503 {
		t.Fatalf("with every engine at its cap the probe got %d, want 503", r.status)
	}
	def := strconv.Itoa(server.DefaultConfig(slog.Default()).Priority.Default)
	figure(t, "sheds_by_priority_with_client_claiming_3", got)
	if got["3"] != 0 || got[def] == 0 {
		t.Errorf("sheds by priority %v: a client's x-meridian-priority was trusted (want it counted at the default %s)", got, def)
	}
}

// overLimitBodies sends bodies a little larger than the bootstrap's buffer limit (the
// sidecar sees their first part, BUFFERED_PARTIAL) beside a steady load: each must be
// answered. The race to hit: the body's end arrives while Envoy waits for the sidecar's
// answer to the partial chunk.
func overLimitBodies(ctx context.Context, t *testing.T, s *stack.Stack) {
	url := s.Nodes[node].URL
	limit := int(bootstrap.DefaultParams().BufferLimitBytes)
	lr := startLoad(t, url, loadSpec{Rate: 30, Duration: 6 * time.Second, Output: 8, Stream: true, Seed: 61})
	const probes = 12
	hung := 0
	for i := range probes {
		size := limit + 64 + i*4096 // up to 48 KiB over
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := send(rctx, url, chatBody(strings.Repeat("a", size)), nil)
		cancel()
		if err != nil || r.status != 200 {
			t.Logf("%d bytes: status %d, %v: %.100s", size, r.status, err, r.body)
			hung++
		}
	}
	lr.wait(t)
	figure(t, "bodies_over_buffer_limit_unanswered", fmt.Sprintf("%d/%d", hung, probes))
	if hung > 0 {
		t.Errorf("%d of %d requests with bodies just over the %d-byte buffer limit got no answer within 2s", hung, probes, limit)
	}
}

// waitNothingInFlight waits until the sidecar counts no request in flight: every outcome
// of the requests before has arrived.
func waitNothingInFlight(ctx context.Context, t *testing.T, s *stack.Stack) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m, err := s.SidecarMetrics(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		if m.Value("meridian_sidecar_engine_in_flight") == 0 {
			return
		}
		if time.Now().After(deadline) { // a bound, not a timing assertion
			t.Fatalf("the sidecar still counts requests in flight after 10s: %v", m.ByLabel("meridian_sidecar_engine_in_flight", "engine"))
		}
	}
}
