package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestE2EDecisionInTheAccessLog: every steered request's line in Envoy's access log holds
// the sidecar's decision (engines in order, prefix key, whether the first choice was passed
// over, the retry grant), the same as /debug/decisions has for that request id; one prompt
// keeps its key, and different prompts get different ones.
func TestE2EDecisionInTheAccessLog(t *testing.T) {
	s := startStack(t, threeEngines())
	node := s.Nodes["region-a"]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	before := len(readAccessLog(t, node.AccessLog))
	const n = 12
	for i := range n {
		r, err := chat(ctx, node.URL, model, prompt(700+i%4), false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != 200 {
			t.Fatalf("request %d: status %d: %s", i, r.status, r.body)
		}
	}
	var doc struct {
		Decisions []struct {
			RequestID   string `json:"request_id"`
			Result      string `json:"result"`
			PrefixKey   string `json:"prefix_key"`
			Destination string `json:"destination"`
			PassedOver  bool   `json:"passed_over_for_load"`
			Retries     int    `json:"retries"`
			RetryOn     string `json:"retry_on"`
			Budget      int    `json:"retry_budget"`
		} `json:"decisions"`
	}
	if err := getJSONCtx(ctx, node.SidecarHTTP+"/debug/decisions?limit=1000", &doc); err != nil {
		t.Fatal(err)
	}
	explained := map[string]int{}
	for i, d := range doc.Decisions {
		explained[d.RequestID] = i
	}
	keys := map[string]string{} // prompt -> prefix key
	for i, e := range waitAccessLog(t, node.AccessLog, before+n)[before:] {
		d := e.Decision
		if d == nil || d.Result != "steered" || d.Model != model {
			t.Fatalf("entry %d: decision %+v, want a steered one for %s: %+v", i, d, model, e)
		}
		if d.Engines != e.Destination || e.Primary() != e.UpstreamHost {
			t.Fatalf("entry %d: decision engines %q, destination %q, served by %s", i, d.Engines, e.Destination, e.UpstreamHost)
		}
		if _, err := strconv.ParseUint(d.PrefixKey, 16, 64); err != nil || d.Retries < 1 || d.RetryOn == "" {
			t.Fatalf("entry %d: prefix key %q, retries %d on %q: want a hex key and a grant", i, d.PrefixKey, d.Retries, d.RetryOn)
		}
		j, ok := explained[e.RequestID]
		if !ok {
			t.Fatalf("entry %d: request id %q is not in /debug/decisions", i, e.RequestID)
		}
		x := doc.Decisions[j]
		if x.Destination != d.Engines || x.PrefixKey != d.PrefixKey || x.PassedOver != d.PassedOver ||
			x.Retries != d.Retries || x.RetryOn != d.RetryOn || x.Budget != d.Budget {
			t.Fatalf("entry %d: access log %+v, /debug/decisions %+v", i, d, x)
		}
		p := prompt(700 + i%4)
		if k, seen := keys[p]; seen && k != d.PrefixKey {
			t.Fatalf("one prompt got keys %s and %s", k, d.PrefixKey)
		}
		keys[p] = d.PrefixKey
	}
	distinct := map[string]bool{}
	for _, k := range keys {
		distinct[k] = true
	}
	if len(distinct) != 4 {
		t.Fatalf("4 prompts got %d distinct keys: %v", len(distinct), keys)
	}
}

// TestE2ELongPromptReachesTheEngineWhole: long prompts uploaded in pieces, as over a real
// network, with the model first (steered once the key's blocks are in, the rest of the body
// still passing through the sidecar) and last (routed at the body's end), with and without a
// Content-Length, all reach the engine whole: the same prompt token count each time. (This is what failed when the sidecar ended the ext_proc stream after its
// decision to spare Envoy the rest of the body: Envoy 1.40 then sent a chunk twice.)
func TestE2ELongPromptReachesTheEngineWhole(t *testing.T) {
	s := startStack(t, threeEngines())
	node := s.Nodes["region-a"]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	doc := strings.Repeat("A long shared document, paragraph after paragraph. ", 6000) // ~300 KB
	first := []byte(fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":%q}]}`, model, doc))
	last := []byte(fmt.Sprintf(`{"max_tokens":2,"messages":[{"role":"user","content":%q}],"model":%q}`, doc, model))
	send := func(body []byte, withLength bool) int {
		t.Helper()
		// 16 KiB at a time, so that Envoy gets the body in pieces (on loopback it would
		// read all of it at once).
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, node.URL+"/v1/chat/completions", &paced{b: body, piece: 16 << 10, gap: 2 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("content-type", "application/json")
		if withLength {
			req.ContentLength = int64(len(body))
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &out); err != nil || resp.StatusCode != 200 || out.Usage.PromptTokens == 0 {
			t.Fatalf("status %d (length %v): %.300s", resp.StatusCode, withLength, raw)
		}
		return out.Usage.PromptTokens
	}
	before := len(readAccessLog(t, node.AccessLog))
	want := send(first, true)
	for i, c := range []struct {
		body       []byte
		withLength bool
	}{{first, false}, {last, true}, {last, false}} {
		if got := send(c.body, c.withLength); got != want {
			t.Fatalf("case %d: the engine counted %d prompt tokens, %d the first time: it did not get the whole body", i, got, want)
		}
	}
	// The model-first ones are routed once 16 KiB are in; a model-last one only at its end,
	// or, if its upload outlasts hold_timeout (100 ms), passed on unsteered on purpose.
	for i, e := range waitAccessLog(t, node.AccessLog, before+4)[before : before+2] {
		if e.Decision == nil || e.Decision.Result != "steered" || e.Primary() != e.UpstreamHost {
			t.Fatalf("model-first request %d was not served by the sidecar's first choice: %+v", i, e)
		}
	}
}

// paced reads b out piece bytes at a time, gap apart.
type paced struct {
	b     []byte
	piece int
	gap   time.Duration
	n     int
}

func (p *paced) Read(out []byte) (int, error) {
	if len(p.b) == 0 {
		return 0, io.EOF
	}
	if p.n > 0 {
		time.Sleep(p.gap)
	}
	p.n++
	k := copy(out[:min(len(out), p.piece)], p.b)
	p.b = p.b[k:]
	return k, nil
}
