package request

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

var testOpt = Options{BlockBytes: 16, MaxBlocks: 64, MaxDepth: 32}

func mustParse(t *testing.T, k Kind, body string) Request {
	t.Helper()
	var r Request
	if err := Parse(k, []byte(body), true, testOpt, &r); err != nil {
		t.Fatalf("Parse(%v, %s): %v", k, body, err)
	}
	return r
}

func jsonBody(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const sysPrompt = "You are a helpful assistant who answers in one word."

func TestResponsesRequestSharesTheChatRequestsPrefix(t *testing.T) {
	chat := mustParse(t, ChatCompletions, string(chatBody(t, false, [2]string{"system", sysPrompt}, [2]string{"user", "Capital of France?"})))
	resp := mustParse(t, Responses, jsonBody(t, map[string]any{"model": "llama", "instructions": sysPrompt, "input": "Capital of France?"}))
	if !slices.Equal(chat.Blocks, resp.Blocks) || len(resp.Blocks) < 3 {
		t.Fatalf("responses blocks %x, chat blocks %x: the same conversation must hash the same", resp.Blocks, chat.Blocks)
	}
	if resp.Model != "llama" || resp.PromptBytes != chat.PromptBytes {
		t.Fatalf("model %q prompt bytes %d, want m and %d", resp.Model, resp.PromptBytes, chat.PromptBytes)
	}
}

func TestResponsesFollowUpTurnExtendsTheEarlierPrefix(t *testing.T) {
	user1 := map[string]any{"role": "user", "content": []map[string]string{{"type": "input_text", "text": "Capital of France?"}}}
	turn1 := mustParse(t, Responses, jsonBody(t, map[string]any{"model": "m", "instructions": sysPrompt, "input": []any{user1}, "stream": true}))
	// The client echoes the output item it got back (with its id, type and status), then asks again.
	echoed := map[string]any{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
		"content": []map[string]any{{"type": "output_text", "text": "Paris.", "annotations": []any{}}}}
	user2 := map[string]any{"type": "message", "role": "user", "content": "And of Italy?"}
	turn2 := mustParse(t, Responses, jsonBody(t, map[string]any{"model": "m", "input": []any{user1, echoed, user2}, "instructions": sysPrompt}))
	if !turn1.Stream || turn2.Stream {
		t.Fatalf("stream flags %v %v", turn1.Stream, turn2.Stream)
	}
	full := len(turn1.Blocks) - 1 // the last block of turn 1 may be partial
	if full < 3 || len(turn2.Blocks) <= len(turn1.Blocks) || !slices.Equal(turn1.Blocks[:full], turn2.Blocks[:full]) {
		t.Fatalf("turn 2 %x does not extend turn 1 %x", turn2.Blocks, turn1.Blocks)
	}
	// The instructions come first wherever they are in the body: turn 2 put them last.
	other := mustParse(t, Responses, jsonBody(t, map[string]any{"model": "m", "instructions": "Something else entirely, friend.", "input": []any{user1}}))
	if other.Blocks[0] == turn1.Blocks[0] {
		t.Fatal("different instructions share the first block")
	}
}

func TestResponsesFunctionCallItemsAreHashed(t *testing.T) {
	base := []any{map[string]any{"role": "user", "content": "Weather in Paris?"}}
	call := map[string]any{"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": `{"city":"Paris"}`}
	out := map[string]any{"type": "function_call_output", "call_id": "c1", "output": "sunny"}
	a := mustParse(t, Responses, jsonBody(t, map[string]any{"model": "m", "input": append(base, call, out)}))
	b := mustParse(t, Responses, jsonBody(t, map[string]any{"model": "m", "input": append(base, call,
		map[string]any{"type": "function_call_output", "call_id": "c1", "output": "raining"})}))
	if slices.Equal(a.Blocks, b.Blocks) {
		t.Fatal("different function outputs hash the same")
	}
}

func TestResponsesAndEmbeddingsClientErrors(t *testing.T) {
	for _, c := range []struct {
		kind       Kind
		body, want string
	}{
		{Responses, `{"model":"m"}`, "the 'input' field is required"},
		{Responses, `{"model":"m","input":3}`, "'input' must be a string or an array of input items"},
		{Responses, `{"model":"m","input":["x"]}`, "input[0] must be an object"},
		{Responses, `{"model":"m","input":"x","instructions":7}`, "'instructions' must be a string"},
		{Responses, `{"model":"m","input":[{"role":"user","content":5}]}`, "input[0].content must be a string or an array of parts"},
		{Responses, `{"input":"x"}`, "the 'model' field is required"},
		{Embeddings, `{"model":"m"}`, "the 'input' field is required"},
		{Embeddings, `{"model":"m","input":{"a":1}}`, "'input' must be a string, an array of strings"},
		{Embeddings, `{"model":"m","input":[1.5]}`, "token ids must be integers"},
		{ModelOnly, `{"prompt":"x"}`, "the 'model' field is required"},
		{ModelOnly, `[1]`, "it must be a JSON object"},
	} {
		var r Request
		err := Parse(c.kind, []byte(c.body), true, testOpt, &r)
		var ce *Error
		if err == nil || !errors.As(err, &ce) || !strings.Contains(ce.Reason, c.want) {
			t.Errorf("Parse(%v, %s) = %v, want a client error containing %q", c.kind, c.body, err, c.want)
		}
	}
}

func TestEmbeddingsInputForms(t *testing.T) {
	one := mustParse(t, Embeddings, `{"model":"m","input":"The quick brown fox jumps over the lazy dog"}`)
	batch := mustParse(t, Embeddings, `{"model":"m","input":["The quick brown fox jumps over the lazy dog","other text"]}`)
	if !slices.Equal(one.Blocks, batch.Blocks) {
		t.Fatal("a batch is not keyed by its first input")
	}
	ids := mustParse(t, Embeddings, `{"model":"m","input":[1,2,3,4]}`)
	nested := mustParse(t, Embeddings, `{"model":"m","input":[[1,2,3,4],[9,9]]}`)
	if !slices.Equal(ids.Blocks, nested.Blocks) || len(ids.Blocks) != 2 {
		t.Fatalf("token ids %x, first of nested %x: want the same two blocks", ids.Blocks, nested.Blocks)
	}
}

func TestModelOnlyRequestsAreKeyedByTheirBody(t *testing.T) {
	a := mustParse(t, ModelOnly, `{"model":"m","prompt":"count my tokens please"}`)
	a2 := mustParse(t, ModelOnly, `{"model":"m","prompt":"count my tokens please"}`)
	b := mustParse(t, ModelOnly, `{"model":"m","prompt":"count these other tokens"}`)
	if a.Model != "m" || len(a.Blocks) == 0 || !slices.Equal(a.Blocks, a2.Blocks) || slices.Equal(a.Blocks, b.Blocks) {
		t.Fatalf("blocks %x %x %x: the same body must key alike and different ones apart", a.Blocks, a2.Blocks, b.Blocks)
	}
}

func TestResponsesCutBodyHashesWhatArrived(t *testing.T) {
	body := jsonBody(t, struct {
		Model        string `json:"model"`
		Instructions string `json:"instructions"`
		Input        string `json:"input"`
	}{"m", sysPrompt, strings.Repeat("long question ", 50)})
	full := mustParse(t, Responses, body)
	var cut Request
	if err := Parse(Responses, []byte(body[:len(body)/2]), false, testOpt, &cut); err != nil {
		t.Fatal(err)
	}
	n := len(cut.Blocks) - 1
	if !cut.Truncated || n < 3 || !slices.Equal(cut.Blocks[:n], full.Blocks[:n]) {
		t.Fatalf("cut body: truncated=%v blocks %x, full %x", cut.Truncated, cut.Blocks, full.Blocks)
	}
}

func TestChatMessageHashesAlikeWhateverItsKeyOrder(t *testing.T) {
	roleFirst := mustParse(t, ChatCompletions, `{"model":"m","messages":[{"role":"system","content":"`+sysPrompt+`"},{"role":"user","content":"hi"}]}`)
	contentFirst := mustParse(t, ChatCompletions, `{"messages":[{"content":"`+sysPrompt+`","role":"system"},{"content":[{"type":"text","text":"hi"}],"role":"user"}],"model":"m"}`)
	if !slices.Equal(roleFirst.Blocks, contentFirst.Blocks) {
		t.Fatalf("content before role hashes %x, role first %x", contentFirst.Blocks, roleFirst.Blocks)
	}
}
