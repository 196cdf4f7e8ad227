package request

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func chatBody(t testing.TB, stream bool, msgs ...[2]string) []byte {
	t.Helper()
	type m struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []m
	for _, x := range msgs {
		ms = append(ms, m{x[0], x[1]})
	}
	// Field order matters for partial bodies: model first, as most clients send it.
	b, err := json.Marshal(struct {
		Model       string  `json:"model"`
		Stream      bool    `json:"stream"`
		Messages    []m     `json:"messages"`
		Temperature float64 `json:"temperature"`
	}{"llama", stream, ms, 0.5})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestChatTurnExtendsPrefixChain(t *testing.T) {
	opt := Options{BlockBytes: 16, MaxBlocks: 64, MaxDepth: 32}
	sys := [2]string{"system", strings.Repeat("You are a helpful assistant. ", 4)}
	turn1 := chatBody(t, true, sys, [2]string{"user", "What is the capital of France, please?"})
	turn2 := chatBody(t, false, sys, [2]string{"user", "What is the capital of France, please?"},
		[2]string{"assistant", "Paris."}, [2]string{"user", "And of Italy?"})
	other := chatBody(t, true, [2]string{"system", "Different system prompt entirely here."})

	var r1, r2, r3 Request
	for _, c := range []struct {
		b []byte
		r *Request
	}{{turn1, &r1}, {turn2, &r2}, {other, &r3}} {
		if err := Parse(ChatCompletions, c.b, true, opt, c.r); err != nil {
			t.Fatalf("Parse: %v", err)
		}
	}
	if r1.Model != "llama" || !r1.Stream || r2.Stream {
		t.Fatalf("model/stream: %+v %+v", r1, r2)
	}
	full1 := len(r1.Blocks) - 1 // the last block of turn 1 is partial
	if full1 < 3 {
		t.Fatalf("too few blocks: %d", len(r1.Blocks))
	}
	for i := 0; i < full1; i++ {
		if r1.Blocks[i] != r2.Blocks[i] {
			t.Fatalf("block %d differs between turn 1 and turn 2", i)
		}
	}
	if len(r2.Blocks) <= len(r1.Blocks) {
		t.Fatalf("turn 2 (%d blocks) does not extend turn 1 (%d)", len(r2.Blocks), len(r1.Blocks))
	}
	if r3.Blocks[0] == r1.Blocks[0] {
		t.Fatal("different prompts share their first block hash")
	}
}

func TestMaxBlocksCapsWork(t *testing.T) {
	opt := Options{BlockBytes: 32, MaxBlocks: 4, MaxDepth: 32}
	b := chatBody(t, false, [2]string{"user", strings.Repeat("x", 1<<20)})
	var r Request
	if err := Parse(ChatCompletions, b, true, opt, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Blocks) != 4 || r.PromptBytes != 128 {
		t.Fatalf("blocks=%d promptBytes=%d, want 4 and 128", len(r.Blocks), r.PromptBytes)
	}
}

func TestTruncatedBody(t *testing.T) {
	opt := Options{BlockBytes: 16, MaxBlocks: 64, MaxDepth: 32}
	full := chatBody(t, true, [2]string{"system", strings.Repeat("hello world ", 20)},
		[2]string{"user", strings.Repeat("more words ", 30)})
	var whole, part Request
	if err := Parse(ChatCompletions, full, true, opt, &whole); err != nil {
		t.Fatal(err)
	}
	cut := full[:len(full)/2]
	if err := Parse(ChatCompletions, cut, false, opt, &part); err != nil {
		t.Fatalf("partial body: %v", err)
	}
	if !part.Truncated || part.Model != "llama" || len(part.Blocks) < 2 {
		t.Fatalf("partial parse: %+v", part)
	}
	for i := 0; i < len(part.Blocks)-1; i++ {
		if part.Blocks[i] != whole.Blocks[i] {
			t.Fatalf("block %d of the partial body differs from the whole body's", i)
		}
	}
	// A body cut before "model" cannot be steered, and says so.
	late := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("a", 100) + `"}],"model":"llama"}`)
	err := Parse(ChatCompletions, late[:60], false, opt, &part)
	if !IsTruncatedBeforeModel(err) {
		t.Fatalf("err = %v, want truncated-before-model", err)
	}
}

func TestCompletionsPromptForms(t *testing.T) {
	opt := DefaultOptions()
	var a, b, c Request
	if err := Parse(Completions, []byte(`{"model":"m","prompt":"Once upon a time"}`), true, opt, &a); err != nil {
		t.Fatal(err)
	}
	if err := Parse(Completions, []byte(`{"model":"m","prompt":["Once upon a time","other"]}`), true, opt, &b); err != nil {
		t.Fatal(err)
	}
	if err := Parse(Completions, []byte(`{"model":"m","prompt":[1,2,3]}`), true, opt, &c); err != nil {
		t.Fatal(err)
	}
	if a.Blocks[0] != b.Blocks[0] {
		t.Fatal("a string prompt and a batch starting with it hash differently")
	}
	if c.PromptBytes != 24 {
		t.Fatalf("token prompt bytes = %d, want 24", c.PromptBytes)
	}
}

func TestClientErrors(t *testing.T) {
	opt := DefaultOptions()
	deep := `{"model":"m","messages":[{"role":"user","content":"x"}],"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`
	cases := []struct {
		kind Kind
		body string
		want string
	}{
		{ChatCompletions, `not json`, "invalid JSON"},
		{ChatCompletions, `[1,2]`, "must be a JSON object"},
		{ChatCompletions, `{"messages":[{"role":"user","content":"x"}]}`, "'model' field is required"},
		{ChatCompletions, `{"model":7,"messages":[]}`, "'model' must be a string"},
		{ChatCompletions, `{"model":"m","messages":[]}`, "must not be empty"},
		{ChatCompletions, `{"model":"m"}`, "'messages' field is required"},
		{ChatCompletions, `{"model":"m","messages":"hi"}`, "'messages' must be an array"},
		{ChatCompletions, `{"model":"m","messages":[{"role":1,"content":"x"}]}`, "role must be a string"},
		{ChatCompletions, `{"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]}`, "'stream' must be a boolean"},
		{ChatCompletions, deep, "nested deeper"},
		{ChatCompletions, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", "UTF-8"},
		{Completions, `{"model":"m"}`, "'prompt' field is required"},
		{Completions, `{"model":"m","prompt":{"a":1}}`, "'prompt' must be"},
		{ChatCompletions, `{"model":"m","messages":[{"role":"user","content":"x"}]`, "invalid JSON"},
	}
	for _, tc := range cases {
		var r Request
		err := Parse(tc.kind, []byte(tc.body), true, opt, &r)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tc.body, err, tc.want)
		}
	}
}

func TestKindOf(t *testing.T) {
	for path, want := range map[string]Kind{"/v1/completions": Completions, "/v1/chat/completions?x=1": ChatCompletions, "/v1/models": 0,
		"/v1/responses": Responses, "/v1/embeddings?a=b": Embeddings, "/tokenize": ModelOnly, "/v1/rerank": ModelOnly,
		"/v1/audio/transcriptions": 0, "/health": 0} {
		if got := KindOf(path); got != want {
			t.Errorf("KindOf(%q) = %v, want %v", path, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), true)
	f.Add([]byte(`{"model":"m","prompt":[1,2,3]}`), false)
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`), true)
	f.Add([]byte(`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]}],"model":"m","instructions":"be"}`), true)
	f.Add([]byte(`{"model":"m","input":[[1,2],[3]]}`), false)
	opt := Options{BlockBytes: 16, MaxBlocks: 8, MaxDepth: 8}
	f.Fuzz(func(t *testing.T, body []byte, complete bool) {
		var r Request
		for _, k := range []Kind{Completions, ChatCompletions, Responses, Embeddings, ModelOnly} {
			err := Parse(k, body, complete, opt, &r)
			if err == nil && r.Model == "" {
				t.Fatal("accepted a request without a model")
			}
			if len(r.Blocks) > opt.MaxBlocks {
				t.Fatalf("%d blocks, cap %d", len(r.Blocks), opt.MaxBlocks)
			}
		}
	})
}

// FuzzParseMatchesEncodingJSON checks the hand-written scanner against encoding/json on
// complete chat bodies: the same verdict on validity, the same model and stream flag, and
// the chain of hashes of the same canonical prompt.
func FuzzParseMatchesEncodingJSON(f *testing.F) {
	f.Add([]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"h\u00e9llo \ud83d\ude00 \"q\""}]}`))
	f.Add([]byte(`{"messages":[{"content":"x","role":"system"},{"role":"user","content":"y"}],"model":"m","n":[1,2.5e3,-0,{"a":null}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"t":01}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"text":"x","text":"a"}]}]}`)) // CI's find: a part's key twice
	opt := Options{BlockBytes: 16, MaxBlocks: 64, MaxDepth: 64}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !utf8.Valid(body) || bytes.Count(body, []byte(`"messages"`)) > 1 || bytes.Count(body, []byte(`"model"`)) > 1 {
			return // encoding/json replaces bad UTF-8 and lets the last duplicate key win
		}
		lower := bytes.ToLower(body)
		for _, k := range []string{`"model"`, `"stream"`, `"messages"`, `"role"`, `"content"`, `"text"`} {
			if bytes.Count(lower, []byte(k)) != bytes.Count(body, []byte(k)) {
				return // encoding/json matches keys case-insensitively ("streAm"); vLLM's pydantic models do not
			}
		}
		var r Request
		err := Parse(ChatCompletions, body, true, opt, &r)
		var doc struct {
			Model    json.RawMessage   `json:"model"`
			Stream   json.RawMessage   `json:"stream"`
			Messages []json.RawMessage `json:"messages"`
		}
		// Validity is JSON's syntax: a number too large for a float64 (2.5e322222) is valid
		// JSON, which encoding/json only refuses to decode into one, and which vLLM's
		// Python parser reads as inf. Parse does not read such fields, and must not refuse them.
		if !json.Valid(body) {
			if err == nil {
				t.Fatalf("encoding/json finds %q invalid but Parse accepted it", body)
			}
			return
		}
		if err != nil {
			return // valid JSON that is not a routable request: checked by TestClientErrors
		}
		if json.Unmarshal(body, &doc) != nil {
			t.Fatalf("Parse accepted %q whose fields do not have the request's types", body)
		}
		var model string
		if json.Unmarshal(doc.Model, &model) != nil || model != r.Model {
			t.Fatalf("model %q, encoding/json says %s", r.Model, doc.Model)
		}
		if want := string(doc.Stream) == "true"; r.Stream != want {
			t.Fatalf("stream %v, encoding/json says %s", r.Stream, doc.Stream)
		}
		var canon []byte
		for _, raw := range doc.Messages {
			var ok bool
			if canon, ok = appendCanonical(t, canon, raw); !ok {
				return
			}
		}
		var want Request
		h := hasher{opt: opt, r: &want}
		h.write(canon)
		h.flush()
		if !slices.Equal(want.Blocks, r.Blocks) {
			t.Fatalf("blocks differ from the canonical prompt %q's", canon)
		}
	})
}

// appendCanonical appends one message's canonical form: role NUL content RS. It reports
// false for a message or a content part with a duplicate key, whose meaning encoding/json
// (and vLLM's Python parser: the last wins) and Parse (which hashes every copy) differ on.
func appendCanonical(t *testing.T, canon []byte, raw json.RawMessage) ([]byte, bool) {
	fields, ok := objectFields(t, raw)
	if !ok {
		return nil, false
	}
	if v, ok := fields["role"]; ok {
		var role string
		if json.Unmarshal(v, &role) != nil {
			t.Fatalf("accepted a non-string role %s", v)
		}
		canon = append(append(canon, role...), 0)
	}
	if v, ok := fields["content"]; ok {
		var s string
		var parts []json.RawMessage
		if json.Unmarshal(v, &s) == nil {
			canon = append(canon, s...)
		} else if json.Unmarshal(v, &parts) == nil {
			for _, raw := range parts {
				p, ok := objectFields(t, raw) // exact keys: struct tags match any case
				if !ok {
					return nil, false
				}
				var text string
				if json.Unmarshal(p["text"], &text) == nil {
					canon = append(canon, text...)
				}
			}
		}
	}
	return append(canon, 0x1e), true
}

// objectFields reads a JSON object's fields by their exact keys; false if a key repeats.
func objectFields(t *testing.T, raw json.RawMessage) (map[string]json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		k, _ := dec.Token()
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		if _, dup := fields[k.(string)]; dup {
			return nil, false
		}
		fields[k.(string)] = v
	}
	return fields, true
}

func TestKeyDepth(t *testing.T) {
	cases := []struct{ n, first, last, depth, parent int }{
		{0, 16, 4096, 0, 0},
		{15, 16, 4096, 0, 0},
		{16, 16, 4096, 16, 0},
		{31, 16, 4096, 16, 0},
		{32, 16, 4096, 32, 16},
		{1000, 16, 4096, 512, 256},
		{1 << 20, 16, 4096, 4096, 2048},
		{100, 16, 50, 32, 16}, // the last rung at or below last
		{100, 16, 16, 16, 0},  // one rung: a fixed key
		{5, 0, 16, 0, 0},
	}
	for _, c := range cases {
		if d, p := KeyDepth(c.n, c.first, c.last); d != c.depth || p != c.parent {
			t.Errorf("KeyDepth(%d, %d, %d) = %d, %d; want %d, %d", c.n, c.first, c.last, d, p, c.depth, c.parent)
		}
	}
}

// The parser's keys are the chain at KeyDepth's rungs, with or without the blocks kept,
// and a conversation's next turn, whose prompt opens with the previous one, keeps the
// previous turn's key or names it as its parent.
func TestKeyLadder(t *testing.T) {
	opt := Options{BlockBytes: 16, MaxBlocks: 64, KeyBlocks: 4, MaxDepth: 32}
	keyOnly := opt
	keyOnly.KeyOnly = true
	body := func(prompt string) []byte { return []byte(`{"model":"m","prompt":"` + prompt + `"}`) }
	var prevKey uint64
	prompt := ""
	for turn := range 40 {
		prompt += fmt.Sprintf("turn %d says %s. ", turn, strings.Repeat("x", turn))
		var all, only Request
		if err := Parse(Completions, body(prompt), true, opt, &all); err != nil {
			t.Fatal(err)
		}
		if err := Parse(Completions, body(prompt), true, keyOnly, &only); err != nil {
			t.Fatal(err)
		}
		if len(only.Blocks) != 0 || only.Key != all.Key || only.ParentKey != all.ParentKey || only.PromptBytes != all.PromptBytes {
			t.Fatalf("turn %d: KeyOnly kept %d blocks, keys %x/%x vs %x/%x", turn, len(only.Blocks), only.Key, only.ParentKey, all.Key, all.ParentKey)
		}
		full := all.PromptBytes / opt.BlockBytes
		depth, parent := KeyDepth(full, opt.KeyBlocks, opt.MaxBlocks)
		want, wantParent := all.Blocks[len(all.Blocks)-1], uint64(0)
		if depth > 0 {
			want = all.Blocks[depth-1]
		}
		if parent > 0 {
			wantParent = all.Blocks[parent-1]
		}
		if all.Key != want || all.ParentKey != wantParent {
			t.Fatalf("turn %d (%d whole blocks): key %x parent %x, want the chain at %d (%x) and %d (%x)",
				turn, full, all.Key, all.ParentKey, depth, want, parent, wantParent)
		}
		if depth > 0 && prevKey != 0 && all.Key != prevKey && all.ParentKey != prevKey {
			// A turn that grew by less than a doubling crosses at most one rung.
			t.Errorf("turn %d: key %x and parent %x, neither the previous turn's %x", turn, all.Key, all.ParentKey, prevKey)
		}
		if depth > 0 {
			prevKey = all.Key
		}
	}
	var empty Request
	if err := Parse(Completions, body(""), true, opt, &empty); err != nil || empty.Key != 0 || empty.ParentKey != 0 {
		t.Errorf("an empty prompt: key %x parent %x, err %v; want 0, 0", empty.Key, empty.ParentKey, err)
	}
}

// With Marks, a key-only parse keeps the chain after every KeyBlocks blocks, and only
// those: the same hashes a full parse has at those depths, up to MaxBlocks.
func TestMarksAreTheChainAtEveryFirstRung(t *testing.T) {
	opt := Options{BlockBytes: 16, MaxBlocks: 64, KeyBlocks: 4, MaxDepth: 32}
	marked := opt
	marked.KeyOnly, marked.Marks = true, true
	body := func(prompt string) []byte { return []byte(`{"model":"m","prompt":"` + prompt + `"}`) }
	for _, n := range []int{10, 63, 64, 200, 5000} {
		prompt := strings.Repeat("abcdefg ", n)
		var all, only Request
		if err := Parse(Completions, body(prompt), true, opt, &all); err != nil {
			t.Fatal(err)
		}
		if err := Parse(Completions, body(prompt), true, marked, &only); err != nil {
			t.Fatal(err)
		}
		full := min(all.PromptBytes/opt.BlockBytes, opt.MaxBlocks)
		if len(only.Marks) != full/opt.KeyBlocks || len(only.Blocks) != 0 || len(all.Marks) != 0 {
			t.Fatalf("%d bytes (%d whole blocks): %d marks, want %d; %d blocks kept; %d marks without the option",
				len(prompt), full, len(only.Marks), full/opt.KeyBlocks, len(only.Blocks), len(all.Marks))
		}
		for i, m := range only.Marks {
			if want := all.Blocks[(i+1)*opt.KeyBlocks-1]; m != want {
				t.Errorf("%d bytes: mark %d is %x, want the chain after %d blocks, %x", len(prompt), i, m, (i+1)*opt.KeyBlocks, want)
			}
		}
	}
}
