package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go"

	"github.com/meridian-router/meridian/control/signals"
	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/xdsapi"
)

// TestE2EOnLLMDInferenceSim runs meridian on engines it did not write: llm-d-inference-sim
// v0.10.2 (scripts/llmd-sim.sh builds it), driven by the OpenAI SDK through real Envoy. The
// control server scrapes the simulator's vLLM metrics, the sidecar steers every request and
// keeps a prompt on its engine, streams come back whole, and when an engine dies requests
// keep succeeding and the sidecar stops choosing it.
func TestE2EOnLLMDInferenceSim(t *testing.T) {
	stack.RequireEnvoy(t)
	sim := stack.RequireLLMDSim(t)
	bins, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	bins.LLMDSim = sim
	args := []string{"--time-to-first-token", "20ms", "--inter-token-latency", "2ms", "--max-model-len", "65536", "--max-num-seqs", "16", "--mode", "random", "--seed", "7"}
	spec := stack.Spec{Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}}}
	for _, name := range []string{"d0", "d1", "d2"} {
		spec.Engines = append(spec.Engines, stack.EngineSpec{Name: name, Region: "a", Models: []string{model}, LLMDSim: true, Args: args})
	}
	s := stack.StartT(t, bins, spec)
	node := s.Nodes["region-a"]
	c := sdkClient(node.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ask := func(ctx context.Context, prompt string) error {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(4),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are terse."), openai.UserMessage(prompt)}})
		return err
	}

	t.Run("the control server scrapes the simulator's vLLM metrics", func(t *testing.T) {
		deadline := time.Now().Add(15 * time.Second)
		for {
			states, _, err := engineStates(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			if states["d0"] == "ok" && states["d1"] == "ok" && states["d2"] == "ok" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("engine states %v after 15 s, want ok for all three", states)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("the sidecar reads each simulator's queue", func(t *testing.T) {
		// Requests sent to d0 directly, past Envoy and the sidecar (another router's), show
		// in the sidecar's view of d0's load: the control server published d0's metrics URL
		// over EDS, and the sidecar scraped d0's num_requests_running from it.
		hctx, hcancel := context.WithCancel(ctx)
		defer hcancel()
		direct := sdkClient("http://" + s.Engines["d0"].Address)
		for range 3 {
			go func() {
				_, _ = direct.Chat.Completions.New(hctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(4000),
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("A long answer, please.")}})
			}()
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			m, err := s.SidecarMetrics(ctx, "region-a")
			if err != nil {
				t.Fatal(err)
			}
			observed := m.ByLabel("meridian_sidecar_engine_observed_work", "engine")
			scrapes := m.ByLabel("meridian_sidecar_engine_load_scrapes_total", "result")
			if observed["d0"] > 0 && scrapes["ok"] > 0 {
				if observed["d1"] != 0 || observed["d2"] != 0 {
					t.Errorf("observed work %v: only d0 holds other routers' requests", observed)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after 15 s the sidecar observes %v of other routers' work (scrapes %v): want d0's three direct requests", observed, scrapes)
			}
			time.Sleep(100 * time.Millisecond)
		}
		hcancel()
	})

	t.Run("requests are steered over the engines", func(t *testing.T) {
		// d1 and d2 may have answered the control server's first scrapes late (they start
		// after it); the plan then brings them back at most --max-share-step a solve. The
		// sidecar spreads keys over the shares the plan gives, so wait for all three.
		waitEveryEngineWeighted(ctx, t, s, "region-a", 100, 20*time.Second)
		before := len(readAccessLog(t, node.AccessLog))
		for i := 0; i < 24; i++ {
			if err := ask(ctx, fmt.Sprintf("Question %d about something entirely different", i)); err != nil {
				t.Fatal(err)
			}
		}
		used := map[string]int{}
		for _, e := range waitAccessLog(t, node.AccessLog, before+24)[before:] {
			first, _, _ := strings.Cut(e.Destination, ",")
			if e.Status != 200 || first == "" || first == "-" || first != e.UpstreamHost {
				t.Fatalf("not steered to the sidecar's first choice: %+v", e)
			}
			used[s.EngineByAddress(e.UpstreamHost)]++
		}
		if len(used) < 2 {
			t.Fatalf("24 different conversations all went to %v", used)
		}
	})

	t.Run("a peer sidecar of the node adopts its placements", func(t *testing.T) {
		// A second sidecar of region-a (as a second Envoy replica's would be) hears, through
		// the real control server, where the node's sidecar sent each new conversation.
		peer, err := s.StartPeerSidecar(ctx, "region-a")
		if err != nil {
			t.Fatal(err)
		}
		before := len(readAccessLog(t, node.AccessLog))
		// The peer's placement stream may open after the first batches: send until it hears.
		deadline := time.Now().Add(30 * time.Second)
		var adopted float64
		asked := 0
		for adopted < 4 {
			if time.Now().After(deadline) {
				t.Fatalf("after %d new conversations the peer adopted %v placements, want >= 4", asked, adopted)
			}
			if err := ask(ctx, fmt.Sprintf("Conversation %d, new to the peer", asked)); err != nil {
				t.Fatal(err)
			}
			asked++
			time.Sleep(100 * time.Millisecond)
			pm, err := stack.ScrapeMetrics(ctx, peer+"/metrics")
			if err != nil {
				t.Fatal(err)
			}
			adopted = pm.Value("meridian_sidecar_placements_total", "direction", "adopted")
		}
		m, err := s.SidecarMetrics(ctx, "region-a")
		if err != nil {
			t.Fatal(err)
		}
		if sent := m.Value("meridian_sidecar_placements_total", "direction", "sent"); sent < adopted {
			t.Errorf("the node's sidecar sent %v placements, fewer than the peer adopted (%v)", sent, adopted)
		}
		if cm, err := s.ControlMetrics(ctx); err != nil || cm.Value("meridian_control_placements_relayed_total") < adopted {
			t.Errorf("the control server relayed %v placements (err %v), fewer than the peer adopted (%v)",
				cm.Value("meridian_control_placements_relayed_total"), err, adopted)
		}
		// It also watches the node's sidecar's requests in flight, sidecar to sidecar over
		// the stack's mutual TLS, and recognizes its own address among its --peers.
		for peers := 0.0; peers != 1; {
			if time.Now().After(deadline) {
				t.Fatalf("the peer holds %v peers' requests in flight, want 1 (the node's sidecar)", peers)
			}
			pm, err := stack.ScrapeMetrics(ctx, peer+"/metrics")
			if err != nil {
				t.Fatal(err)
			}
			if peers = pm.Value("meridian_sidecar_peers"); peers != 1 {
				time.Sleep(50 * time.Millisecond)
			}
		}
		waitAccessLog(t, node.AccessLog, before+asked) // the next subtest counts entries from here
	})

	t.Run("a conversation keeps its engine", func(t *testing.T) {
		before := len(readAccessLog(t, node.AccessLog))
		for i := 0; i < 4; i++ {
			if err := ask(ctx, "The same question, every time."); err != nil {
				t.Fatal(err)
			}
		}
		hosts := map[string]bool{}
		for _, e := range waitAccessLog(t, node.AccessLog, before+4)[before:] {
			hosts[e.UpstreamHost] = true
		}
		if len(hosts) != 1 {
			t.Fatalf("one prompt went to %v", hosts)
		}
	})

	t.Run("streams arrive whole, with usage", func(t *testing.T) {
		st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(8),
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a story.")},
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
		acc := openai.ChatCompletionAccumulator{}
		chunks := 0
		for st.Next() {
			acc.AddChunk(st.Current())
			chunks++
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if chunks < 2 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" || acc.Usage.CompletionTokens == 0 {
			t.Fatalf("%d chunks, choices %+v, usage %+v", chunks, acc.Choices, acc.Usage)
		}
		if _, missing, err := engineStates(ctx, s); err == nil {
			t.Logf("after traffic, vLLM signals the control server found missing on d0: %v", missing["d0"])
		}
	})

	t.Run("an engine dies: requests succeed and the sidecar stops choosing it", func(t *testing.T) {
		// The engine this conversation lives on is the one to kill.
		before := len(readAccessLog(t, node.AccessLog))
		if err := ask(ctx, "The same question, every time."); err != nil {
			t.Fatal(err)
		}
		// Envoy flushes its log every 50 ms: wait for this request's entry, the last one.
		time.Sleep(300 * time.Millisecond)
		entries := waitAccessLog(t, node.AccessLog, before+1)
		victim := s.Engines[s.EngineByAddress(entries[len(entries)-1].UpstreamHost)]
		victim.Proc.Kill()
		killed := time.Now()
		before = len(readAccessLog(t, node.AccessLog))
		const n = 80
		for i := 0; i < n; i++ {
			prompt := "The same question, every time."
			if i%2 == 1 {
				prompt = fmt.Sprintf("After the death, question %d", i)
			}
			rctx, stop := context.WithTimeout(ctx, 10*time.Second)
			err := ask(rctx, prompt)
			stop()
			if err != nil {
				t.Fatalf("request %d, %s after %s died: %v", i, time.Since(killed).Round(time.Millisecond), victim.Name, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		var lastPrimary time.Time
		for _, e := range waitAccessLog(t, node.AccessLog, before+n)[before:] {
			if e.Start.Before(killed) {
				continue // an entry flushed late
			}
			if first, _, _ := strings.Cut(e.Destination, ","); first == victim.Address {
				lastPrimary = e.Start
			}
			if e.UpstreamHost == victim.Address && e.Status == 200 {
				t.Fatalf("a dead engine served: %+v", e)
			}
		}
		// At this low rate (4-5 req/s) the outlier penalty does not take it out of first place
		// (measured: 4.6 s once, not within 12 s after the class-curve change); the control
		// server's verdict does: no successful scrape for --stale-after (its default, 15 s,
		// counted from the last scrape, up to one 2 s scrape period before the death), then a
		// solve (1 s) and a publish. The bound is that chain plus 5 s for a loaded machine
		// (CI once measured 17.7 s against a 15 s bound that had assumed a 5 s stale-after).
		bound := signals.DefaultConfig().StaleAfter + 5*time.Second
		if !lastPrimary.IsZero() && lastPrimary.Sub(killed) > bound {
			t.Fatalf("the sidecar still chose the dead engine %s after it died (bound %s)", lastPrimary.Sub(killed).Round(time.Millisecond), bound)
		}
		t.Logf("%s killed; last chosen first %v after", victim.Name, max(0, lastPrimary.Sub(killed)).Round(time.Millisecond))
	})
}

// engineStates reads each engine's health state and missing signals from /debug/state.
func engineStates(ctx context.Context, s *stack.Stack) (map[string]string, map[string][]string, error) {
	var doc struct {
		Engines []struct {
			Name    string `json:"name"`
			Signals *struct {
				State   string   `json:"state"`
				Missing []string `json:"missing"`
			} `json:"signals"`
		} `json:"engines"`
	}
	if err := getJSONCtx(ctx, s.ControlHTTP+"/debug/state", &doc); err != nil {
		return nil, nil, err
	}
	states, missing := map[string]string{}, map[string][]string{}
	for _, e := range doc.Engines {
		if e.Signals != nil {
			states[e.Name], missing[e.Name] = e.Signals.State, e.Signals.Missing
		}
	}
	return states, missing, nil
}

func getJSONCtx(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// waitEveryEngineWeighted waits until the control server's published plan gives every
// engine of the stack at least least (of 1000) of the model's traffic at node.
func waitEveryEngineWeighted(ctx context.Context, t *testing.T, s *stack.Stack, node string, least uint32, within time.Duration) {
	t.Helper()
	var got map[string]uint32
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		pw, err := s.PublishedWeights(ctx, node)
		if err != nil {
			continue
		}
		got = map[string]uint32{}
		for addr, w := range pw[xdsapi.ClusterName(model)] {
			got[s.EngineByAddress(addr)] = w
		}
		ok := len(got) == len(s.Engines)
		for _, w := range got {
			ok = ok && w >= least
		}
		if ok {
			return
		}
	}
	t.Fatalf("after %s the plan for %s is %v: want every engine at %d or more", within, node, got, least)
}
