package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// sseData returns the data lines of an SSE body, and the event names when there are any.
func sseData(t *testing.T, r io.Reader) (data, events []string) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			data = append(data, d)
		} else if e, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			events = append(events, e)
		}
	}
	return data, events
}

type chatChoice struct {
	Index        int     `json:"index"`
	FinishReason *string `json:"finish_reason"`
	Message      struct {
		Content   *string `json:"content"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"message"`
	Delta struct {
		Content   string `json:"content"`
		ToolCalls []struct {
			Index    int    `json:"index"`
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"delta"`
}

type chatDoc struct {
	Choices []chatChoice `json:"choices"`
	Usage   *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

func TestNChoicesEachGetTheirTokens(t *testing.T) {
	base := startMock(t)
	full := decode[chatDoc](t, post(t, base+"/v1/chat/completions", `{"model":"m1","n":3,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`).Body)
	if len(full.Choices) != 3 || full.Choices[2].Index != 2 || full.Usage.CompletionTokens != 12 {
		t.Fatalf("n=3: %d choices, usage %+v", len(full.Choices), full.Usage)
	}
	data, _ := sseData(t, post(t, base+"/v1/chat/completions", `{"model":"m1","n":2,"max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`).Body)
	perChoice := map[int]int{}
	finished := map[int]bool{}
	for _, d := range data[:len(data)-2] {
		c := decode[chatDoc](t, strings.NewReader(d))
		for _, ch := range c.Choices {
			perChoice[ch.Index]++
			finished[ch.Index] = finished[ch.Index] || ch.FinishReason != nil
		}
	}
	usage := decode[chatDoc](t, strings.NewReader(data[len(data)-2]))
	if perChoice[0] != 4 || perChoice[1] != 4 || !finished[0] || !finished[1] || usage.Usage.CompletionTokens != 8 {
		t.Fatalf("streamed n=2: chunks per choice %v, finished %v, usage %+v", perChoice, finished, usage.Usage)
	}
	if resp := post(t, base+"/v1/chat/completions", `{"model":"m1","n":0,"messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 400 {
		t.Fatalf("n=0: status %d, want 400", resp.StatusCode)
	}
}

const weatherTools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",` +
	`"properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city","days"]}}}]`

func TestToolCallsFullAndStreamed(t *testing.T) {
	base := startMock(t)
	full := decode[chatDoc](t, post(t, base+"/v1/chat/completions", `{"model":"m1","max_tokens":5,`+weatherTools+`,"messages":[{"role":"user","content":"Paris?"}]}`).Body)
	ch := full.Choices[0]
	if *ch.FinishReason != "tool_calls" || ch.Message.Content != nil || len(ch.Message.ToolCalls) != 1 {
		t.Fatalf("tool call answer: %+v", ch)
	}
	call := ch.Message.ToolCalls[0]
	var args map[string]any
	if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil || call.Type != "function" ||
		call.Function.Name != "get_weather" || args["city"] != "tok" || args["days"] != 1.0 || !strings.HasPrefix(call.ID, "chatcmpl-tool-") {
		t.Fatalf("call %+v (args %v, %v)", call, args, err)
	}

	data, _ := sseData(t, post(t, base+"/v1/chat/completions", `{"model":"m1","max_tokens":5,"stream":true,`+weatherTools+`,"messages":[{"role":"user","content":"Paris?"}]}`).Body)
	var streamed strings.Builder
	name, id, last := "", "", ""
	for _, d := range data[:len(data)-1] {
		c := decode[chatDoc](t, strings.NewReader(d))
		for _, tc := range c.Choices[0].Delta.ToolCalls {
			streamed.WriteString(tc.Function.Arguments)
			name += tc.Function.Name
			id += tc.ID
		}
		if c.Choices[0].FinishReason != nil {
			last = *c.Choices[0].FinishReason
		}
	}
	if streamed.String() != call.Function.Arguments || name != "get_weather" || id == "" || last != "tool_calls" {
		t.Fatalf("streamed call: args %q name %q id %q finish %q", streamed.String(), name, id, last)
	}

	// After the tool's result the model answers in text; "none" never calls.
	for _, body := range []string{
		`{"model":"m1",` + weatherTools + `,"messages":[{"role":"user","content":"Paris?"},{"role":"tool","tool_call_id":"x","content":"sunny"}]}`,
		`{"model":"m1",` + weatherTools + `,"tool_choice":"none","messages":[{"role":"user","content":"Paris?"}]}`,
	} {
		c := decode[chatDoc](t, post(t, base+"/v1/chat/completions", body).Body)
		if len(c.Choices[0].Message.ToolCalls) != 0 || c.Choices[0].Message.Content == nil {
			t.Fatalf("want a text answer to %s: %+v", body, c.Choices[0])
		}
	}
	for _, body := range []string{
		`{"model":"m1","tool_choice":"required","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m1",` + weatherTools + `,"tool_choice":{"type":"function","function":{"name":"nope"}},"messages":[{"role":"user","content":"x"}]}`,
	} {
		if resp := post(t, base+"/v1/chat/completions", body); resp.StatusCode != 400 {
			t.Fatalf("%s: status %d, want 400", body, resp.StatusCode)
		}
	}
}

func TestEmbeddings(t *testing.T) {
	base := startMock(t, "--embedding-dim", "8")
	type embDoc struct {
		Object string `json:"object"`
		Data   []struct {
			Index     int             `json:"index"`
			Object    string          `json:"object"`
			Embedding json.RawMessage `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	doc := decode[embDoc](t, post(t, base+"/v1/embeddings", `{"model":"m1","input":["alpha beta","gamma","alpha beta"]}`).Body)
	if doc.Object != "list" || len(doc.Data) != 3 || doc.Data[1].Index != 1 || doc.Data[0].Object != "embedding" || doc.Usage.PromptTokens < 3 {
		t.Fatalf("embeddings: %+v", doc)
	}
	var v0, v1, v2 []float64
	for i, v := range []*[]float64{&v0, &v1, &v2} {
		if err := json.Unmarshal(doc.Data[i].Embedding, v); err != nil || len(*v) != 8 {
			t.Fatalf("vector %d: %s (%v)", i, doc.Data[i].Embedding, err)
		}
	}
	var norm float64
	for _, x := range v0 {
		norm += x * x
	}
	if norm < 0.99 || norm > 1.01 || v0[0] != v2[0] || v0[0] == v1[0] {
		t.Fatalf("vectors: |v0|^2=%v, equal inputs %v/%v, different %v", norm, v0[0], v2[0], v1[0])
	}
	b64 := decode[embDoc](t, post(t, base+"/v1/embeddings", `{"model":"m1","input":"alpha beta","encoding_format":"base64","dimensions":4}`).Body)
	var s string
	if err := json.Unmarshal(b64.Data[0].Embedding, &s); err != nil {
		t.Fatal(err)
	}
	if raw, err := base64.StdEncoding.DecodeString(s); err != nil || len(raw) != 16 {
		t.Fatalf("base64 embedding of 4 float32s: %d bytes (%v)", len(raw), err)
	}
	if resp := post(t, base+"/v1/embeddings", `{"model":"nope","input":"x"}`); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown model: status %d", resp.StatusCode)
	}
}

func TestResponsesAPI(t *testing.T) {
	base := startMock(t)
	type respDoc struct {
		Object string `json:"object"`
		Status string `json:"status"`
		Output []struct {
			Type    string `json:"type"`
			Role    string `json:"role"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	doc := decode[respDoc](t, post(t, base+"/v1/responses", `{"model":"m1","instructions":"terse","input":"hello","max_output_tokens":3}`).Body)
	if doc.Object != "response" || doc.Status != "incomplete" || len(doc.Output) != 1 || doc.Output[0].Role != "assistant" ||
		doc.Output[0].Content[0].Type != "output_text" || doc.Output[0].Content[0].Text != "tok tok tok " || doc.Usage.OutputTokens != 3 {
		t.Fatalf("response: %+v", doc)
	}
	data, events := sseData(t, post(t, base+"/v1/responses", `{"model":"m1","input":[{"role":"user","content":"hello"}],"stream":true}`).Body)
	if len(events) != len(data) || events[0] != "response.created" || events[len(events)-1] != "response.completed" {
		t.Fatalf("events %q", events)
	}
	deltas := 0
	for i, e := range events {
		var ev struct {
			Type string `json:"type"`
			Seq  int    `json:"sequence_number"`
		}
		if err := json.Unmarshal([]byte(data[i]), &ev); err != nil || ev.Type != e || ev.Seq != i {
			t.Fatalf("event %d %q: %s (%v)", i, e, data[i], err)
		}
		if e == "response.output_text.delta" {
			deltas++
		}
	}
	if deltas != 16 { // --default-max-tokens
		t.Fatalf("%d text deltas, want 16", deltas)
	}
}

func TestBodyOverTheLimitIs413(t *testing.T) {
	base := startMock(t, "--max-body-bytes", "2048")
	resp := post(t, base+"/v1/completions", promptBody("m1", strings.Repeat("x", 4096), 1, false))
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
}

func TestInjectedErrorStatus(t *testing.T) {
	base := startMock(t)
	if code := setFaults(t, base, `{"error_rate":1,"error_status":429,"latency_multiplier":1}`); code != 200 {
		t.Fatalf("set faults: %d", code)
	}
	if resp := post(t, base+"/v1/responses", `{"model":"m1","input":"x"}`); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want the injected 429", resp.StatusCode)
	}
	if code := setFaults(t, base, `{"error_rate":1,"error_status":200}`); code != 400 {
		t.Fatalf("error_status 200 accepted: %d", code)
	}
}
