package load

import (
	"context"
	"encoding/json"
	"iter"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

func testConfig(t *testing.T, url string) Config {
	t.Helper()
	syn, err := trace.NewSynthesizer(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		BaseURL: url, Model: "m", Stream: true, IncludeUsage: true,
		Concurrency: 16, Timeout: 5 * time.Second, Synth: syn,
	}
}

// burst is n requests at once with the given output length.
func burst(n, out int) iter.Seq[trace.Request] {
	reqs := make([]trace.Request, n)
	for i := range reqs {
		reqs[i] = trace.Request{InputTokens: 100, OutputTokens: out}
	}
	return slices.Values(reqs)
}

func run(t *testing.T, cfg Config, sched iter.Seq[trace.Request]) Summary {
	t.Helper()
	r, err := NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Run(context.Background(), sched)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func within(t *testing.T, name string, got, lo, hi float64) {
	t.Helper()
	if got < lo || got > hi {
		t.Errorf("%s = %.3f, want within [%.1f, %.1f]", name, got, lo, hi)
	}
}

func TestStreamingLatencies(t *testing.T) {
	const ttft, itl, tokens = 60 * time.Millisecond, 15 * time.Millisecond, 6
	tests := []struct {
		name       string
		endpoint   Endpoint
		noUsage    bool
		wantTokens int
	}{
		{"chat with usage", Chat, false, 1000 + tokens},
		{"completions counting chunks", Completions, true, tokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := &fakeEngine{name: "e1", ttft: ttft, itl: itl, tokens: tokens, noUsage: tt.noUsage}
			cfg := testConfig(t, eng.start(t))
			cfg.Endpoint = tt.endpoint
			cfg.Header = http.Header{"X-Priority": {"low"}}
			var results []Result
			cfg.OnResult = func(r Result) { results = append(results, r) }
			s := run(t, cfg, burst(4, 50))

			if s.OK != 4 || s.Requests != 4 || s.Engines["e1"] != 4 || s.ErrorsTotal != 0 {
				t.Fatalf("summary %+v", s)
			}
			// Timers fire late, never early, so the nominal delays bound the
			// measurements from below. From above, the client must see each
			// chunk soon after the server flushed it: comparing instants on
			// the shared clock leaves out connection set-up and server
			// scheduling, which a busy machine makes unbounded.
			slack := 50 * time.Millisecond
			within(t, "ttft p50", s.TTFTP50, ms(ttft), 10*ms(ttft))
			within(t, "itl p50", s.ITLP50, ms(itl)/2, 10*ms(itl))
			within(t, "e2e p50", s.E2EP50, ms(ttft+(tokens-1)*itl), 10*ms(ttft+(tokens-1)*itl))
			for _, r := range results {
				if len(r.ITLs) != tokens-1 || r.Tokens != tt.wantTokens {
					t.Errorf("result %d: %d gaps and %d tokens, want %d and %d", r.Index, len(r.ITLs), r.Tokens, tokens-1, tt.wantTokens)
				}
				srv, ok := eng.servedAt(cfg.Synth.Prompt(trace.Request{InputTokens: 100}, uint64(r.Index)))
				if !ok {
					t.Fatalf("result %d: the server did not stream its prompt", r.Index)
				}
				firstSeen := r.Sent.Add(r.TTFT)
				lastSeen := firstSeen
				for _, g := range r.ITLs {
					lastSeen = lastSeen.Add(g)
				}
				for _, c := range []struct {
					name         string
					seen, served time.Time
				}{{"first chunk", firstSeen, srv.first}, {"last chunk", lastSeen, srv.last}} {
					if d := c.seen.Sub(c.served); d < 0 || d > slack {
						t.Errorf("result %d: %s seen %v after the server flushed it, want within [0, %v]", r.Index, c.name, d, slack)
					}
				}
				if r.TTFT < ttft {
					t.Errorf("result %d: ttft %v below the server's %v", r.Index, r.TTFT, ttft)
				}
			}
			bodies, paths, headers := eng.seen()
			for i, b := range bodies {
				isChat := tt.endpoint == Chat
				if paths[i] != tt.endpoint.path() || (len(b.Messages) == 1) != isChat || (b.Prompt != "") == isChat {
					t.Errorf("request %d: path %s, body %+v", i, paths[i], b)
				}
				if b.Model != "m" || !b.Stream || b.StreamOptions == nil || b.MaxTokens != 50 {
					t.Errorf("request %d body %+v", i, b)
				}
				if headers[i].Get("X-Priority") != "low" || headers[i].Get("Accept") != "text/event-stream" {
					t.Errorf("request %d headers %v", i, headers[i])
				}
			}
		})
	}
}

func TestNonStreaming(t *testing.T) {
	eng := &fakeEngine{name: "e2", ttft: 20 * time.Millisecond, itl: time.Millisecond, tokens: 7}
	cfg := testConfig(t, eng.start(t))
	cfg.Stream = false
	s := run(t, cfg, burst(2, 3))
	if s.OK != 2 || s.OutputTokens != 14 || s.TTFTP50 != 0 || s.E2EP50 < 20 {
		t.Fatalf("summary %+v", s)
	}
	if b, _, _ := eng.seen(); b[0].Stream || b[0].StreamOptions != nil {
		t.Fatalf("non-streamed request body %+v", b[0])
	}
}

func TestShedAndErrorClasses(t *testing.T) {
	eng := &fakeEngine{name: "e", tokens: 2, status: func(n int) int {
		return []int{http.StatusOK, http.StatusServiceUnavailable, http.StatusInternalServerError}[n%3]
	}}
	cfg := testConfig(t, eng.start(t))
	cfg.Concurrency = 1 // keeps the server's request order equal to ours
	s := run(t, cfg, burst(9, 2))
	if s.OK != 3 || s.Shed != 3 || s.ErrorsTotal != 3 || s.Errors["500"] != 3 || len(s.Errors) != 1 {
		t.Fatalf("summary %+v", s)
	}
	if s.Engines["e"] != 9 {
		t.Errorf("engines %v: every response carried the header", s.Engines)
	}
}

func TestFailureClasses(t *testing.T) {
	refused := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return "http://" + addr
	}
	tests := []struct {
		name string
		eng  *fakeEngine
		url  string
		want string
	}{
		{"timeout before headers", &fakeEngine{hang: true}, "", ClassTimeout},
		{"timeout mid-stream", &fakeEngine{ttft: time.Second, tokens: 1}, "", ClassTimeout},
		{"no [DONE]", &fakeEngine{tokens: 2, noDone: true}, "", ClassIncomplete},
		{"error chunk", &fakeEngine{tokens: 2, streamError: true}, "", ClassStreamError},
		{"bad request", &fakeEngine{status: func(int) int { return http.StatusBadRequest }}, "", "400"},
		{"connection refused", nil, refused(), ClassTransport},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := tt.url
			if tt.eng != nil {
				url = tt.eng.start(t)
			}
			cfg := testConfig(t, url)
			cfg.Timeout = 200 * time.Millisecond
			begin := time.Now()
			s := run(t, cfg, burst(2, 2))
			if s.OK != 0 || s.Errors[tt.want] != 2 || s.ErrorsTotal != 2 {
				t.Fatalf("summary %+v, want 2 errors of class %s", s, tt.want)
			}
			if took := time.Since(begin); took > 2*time.Second {
				t.Errorf("took %v with a 200ms timeout", took)
			}
		})
	}
}

func TestBounds(t *testing.T) {
	tests := []struct {
		name      string
		cfg       func(*Config)
		sched     OpenLoop
		wantSent  int
		maxWallMs float64
	}{
		{"count", nil, OpenLoop{Rate: 500, Count: 25}, 25, 2000},
		{"duration, uniform", nil, OpenLoop{Rate: 50, Uniform: true, Duration: 300 * time.Millisecond}, 15, 300 + 400},
		{"duration beats count", nil, OpenLoop{Rate: 50, Uniform: true, Duration: 100 * time.Millisecond, Count: 1000}, 5, 100 + 400},
		{"config duration", func(c *Config) { c.Duration = 200 * time.Millisecond }, OpenLoop{Rate: 50, Uniform: true, Count: 1000}, 10, 200 + 400},
		{"config max requests", func(c *Config) { c.MaxRequests = 7 }, OpenLoop{Rate: 1000, Count: 1000}, 7, 2000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := &fakeEngine{name: "e", tokens: 1}
			cfg := testConfig(t, eng.start(t))
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			tt.sched.PromptTokens, tt.sched.OutputTokens = 10, 1
			if err := tt.sched.Validate(); err != nil {
				t.Fatal(err)
			}
			begin := time.Now()
			s := run(t, cfg, tt.sched.Requests())
			wall := float64(time.Since(begin).Milliseconds())
			if s.Requests != tt.wantSent || int(eng.count.Load()) != tt.wantSent || s.OK != tt.wantSent {
				t.Fatalf("sent %d, server saw %d, ok %d; want %d", s.Requests, eng.count.Load(), s.OK, tt.wantSent)
			}
			if wall > tt.maxWallMs || s.DurationS*1000 > tt.maxWallMs {
				t.Errorf("run took %.0f ms (summary %.3f s), bound %.0f ms", wall, s.DurationS, tt.maxWallMs)
			}
		})
	}
}

func TestConcurrencyCap(t *testing.T) {
	eng := &fakeEngine{name: "e", ttft: 40 * time.Millisecond, tokens: 1}
	cfg := testConfig(t, eng.start(t))
	cfg.Concurrency = 2
	s := run(t, cfg, burst(8, 1))
	if got := eng.maxInFlight.Load(); got != 2 {
		t.Errorf("server saw up to %d concurrent requests, want exactly the cap 2", got)
	}
	if s.OK != 8 || s.ClientLate < 6 {
		t.Errorf("ok %d, client late %d; want 8 ok and >= 6 late", s.OK, s.ClientLate)
	}
}

func TestCancelEndsRunPromptly(t *testing.T) {
	eng := &fakeEngine{hang: true}
	cfg := testConfig(t, eng.start(t))
	r, err := NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	begin := time.Now()
	s, err := r.Run(ctx, OpenLoop{Rate: 20, Uniform: true, Count: 100, PromptTokens: 1, OutputTokens: 1}.Requests())
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took > time.Second {
		t.Errorf("canceled run took %v", took)
	}
	// Arrivals every 50 ms until the context ends, which a busy machine may
	// notice late: no more than the run's own duration allows.
	if maxSent := int(s.DurationS*20) + 1; !s.Interrupted || s.Requests < 2 || s.Requests > maxSent || s.Errors[ClassCanceled] != s.Requests {
		t.Errorf("summary %+v", s)
	}
	if _, err := r.Run(context.Background(), burst(1, 1)); err == nil {
		t.Error("a second Run was accepted")
	}
}

func TestProgress(t *testing.T) {
	eng := &fakeEngine{name: "e", ttft: 30 * time.Millisecond, tokens: 1, status: func(n int) int {
		if n == 0 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}}
	cfg := testConfig(t, eng.start(t))
	cfg.Concurrency = 1
	r, err := NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(context.Background(), burst(3, 1)); err != nil {
		t.Fatal(err)
	}
	p := r.Progress()
	if p.Sent != 3 || p.OK != 2 || p.Shed != 1 || p.InFlight != 0 || p.RecentTTFTSamples != 2 {
		t.Fatalf("progress %+v", p)
	}
	within(t, "recent ttft", ms(p.RecentTTFTP50), 30, 3000)
	line := p.String()
	for _, want := range []string{"sent 3", "ok 2", "shed(503) 1", "errors 0", "ttft p50 " + p.RecentTTFTP50.Round(100*time.Microsecond).String()} {
		if !strings.Contains(line, want) {
			t.Errorf("progress line %q lacks %q", line, want)
		}
	}
}

func TestSummaryJSONShape(t *testing.T) {
	b, err := json.Marshal(summarize(nil, time.Second, SLO{}))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"requests", "ok", "errors", "shed", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
		"itl_p50_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "goodput_rps", "duration_s", "engines"} {
		if _, ok := m[k]; !ok {
			t.Errorf("summary JSON lacks %q: %s", k, b)
		}
	}
	if _, ok := m["errors"].(map[string]any); !ok {
		t.Errorf("errors is not an object: %s", b)
	}
}

func TestGoodputHonoursSLO(t *testing.T) {
	results := []Result{
		{Class: ClassOK, TTFT: 10 * time.Millisecond, E2E: 50 * time.Millisecond},
		{Class: ClassOK, TTFT: 90 * time.Millisecond, E2E: 100 * time.Millisecond},
		{Class: ClassOK, TTFT: 20 * time.Millisecond, E2E: 900 * time.Millisecond},
		{Class: ClassShed},
	}
	tests := []struct {
		slo  SLO
		want int
	}{
		{SLO{}, 3},
		{SLO{TTFT: 50 * time.Millisecond}, 2},
		{SLO{TTFT: 50 * time.Millisecond, E2E: 500 * time.Millisecond}, 1},
	}
	for _, tt := range tests {
		s := summarize(results, 2*time.Second, tt.slo)
		if s.Good != tt.want || s.GoodputRPS != float64(tt.want)/2 {
			t.Errorf("SLO %+v: good %d goodput %v, want %d", tt.slo, s.Good, s.GoodputRPS, tt.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good := testConfig(t, "http://127.0.0.1:1")
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"url", func(c *Config) { c.BaseURL = "127.0.0.1:1" }, "base URL"},
		{"model", func(c *Config) { c.Model = "" }, "model"},
		{"concurrency", func(c *Config) { c.Concurrency = 0 }, "concurrency"},
		{"timeout", func(c *Config) { c.Timeout = 0 }, "timeout"},
		{"synth", func(c *Config) { c.Synth = nil }, "synthesizer"},
	}
	for _, tt := range tests {
		c := good
		tt.mutate(&c)
		if _, err := NewRunner(c); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tt.name, err, tt.want)
		}
	}
	if _, err := NewRunner(good); err != nil {
		t.Errorf("good config rejected: %v", err)
	}
}

// TestPrefixHeader checks that requests sharing their first PrefixHeaderBytes prompt bytes
// carry the same prefix header value and that the others do not.
func TestPrefixHeader(t *testing.T) {
	eng := &fakeEngine{name: "e1", tokens: 1}
	cfg := testConfig(t, eng.start(t))
	cfg.PrefixHeader, cfg.PrefixHeaderBytes = "x-prefix-hash", 2*64 // two blocks of the 64-byte synthesizer
	reqs := []trace.Request{
		{InputTokens: 1024, OutputTokens: 1, HashIDs: []uint64{1, 2, 3}},
		{InputTokens: 1024, OutputTokens: 1, HashIDs: []uint64{1, 2, 4}}, // same first two blocks
		{InputTokens: 1024, OutputTokens: 1, HashIDs: []uint64{1, 5, 3}}, // differs in the second
		{InputTokens: 512, OutputTokens: 1, HashIDs: []uint64{1}},        // shorter than the prefix
	}
	if s := run(t, cfg, slices.Values(reqs)); s.OK != len(reqs) {
		t.Fatalf("summary %+v", s)
	}
	bodies, _, headers := eng.seen()
	got := make([]string, len(reqs))
	for i, b := range bodies {
		for j, r := range reqs {
			if len(b.Messages) == 1 && b.Messages[0].Content == cfg.Synth.Prompt(r, 0) {
				got[j] = headers[i].Get("x-prefix-hash")
			}
		}
	}
	for j, h := range got {
		if h == "" {
			t.Fatalf("request %d arrived without a prefix header (or not at all)", j)
		}
	}
	if got[0] != got[1] || got[0] == got[2] || got[0] == got[3] || got[2] == got[3] {
		t.Errorf("prefix headers %q: want requests 0 and 1 equal, every other pair different", got)
	}
	if want := PrefixHash(cfg.Synth.Prompt(reqs[0], 0), 128); got[0] != want {
		t.Errorf("request 0 header %q, want PrefixHash of its prompt %q", got[0], want)
	}
	cfg.PrefixHeaderBytes = 0
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "prefix header") {
		t.Errorf("Validate with 0 prefix bytes = %v, want a prefix header error", err)
	}
}
