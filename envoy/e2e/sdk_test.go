package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
	"github.com/openai/openai-go/responses"
	"github.com/openai/openai-go/shared"

	"github.com/meridian-router/meridian/envoy/stack"
)

// The official OpenAI Go SDK (github.com/openai/openai-go, pinned in go.mod) is the client
// of these tests: what it sends is what users send, and it decodes what comes back with its
// own types, so a shape it cannot read fails here.

const smallModel = "meridian-small" // served by one engine with an in-flight cap of 1

func sdkClient(base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("sk-meridian-test"),
		option.WithMaxRetries(0), option.WithRequestTimeout(30*time.Second))
}

func sdkStack(t *testing.T) *stack.Stack {
	fixed := []string{"--ttft", "20ms", "--itl", "2ms", "--max-body-bytes", "65536"}
	return startStack(t, stack.Spec{
		Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}},
		Engines: []stack.EngineSpec{
			{Name: "e0", Region: "a", Models: []string{model}, Args: fixed},
			{Name: "e1", Region: "a", Models: []string{model}, Args: fixed},
			{Name: "e2", Region: "a", Models: []string{model}, Args: fixed},
			{Name: "h0", Region: "a", Models: []string{smallModel}, MaxInFlight: 1, Args: fixed},
		},
	})
}

// longSystem is longer than the sidecar's affinity key (16 blocks of 256 bytes), so requests
// that share it share their key whatever follows.
var longSystem = strings.Repeat("You are a meticulous assistant for the meridian test suite. ", 90)

func TestE2EOpenAISDK(t *testing.T) {
	s := sdkStack(t)
	node := s.Nodes["region-a"]
	c := sdkClient(node.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t.Run("streamed chat reports usage", func(t *testing.T) {
		var resp *http.Response
		st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:         model,
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are terse."), openai.UserMessage("Say hi.")},
			MaxTokens:     openai.Int(5),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		}, option.WithResponseInto(&resp))
		acc := openai.ChatCompletionAccumulator{}
		chunks := 0
		for st.Next() {
			acc.AddChunk(st.Current())
			chunks++
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != strings.Repeat("tok ", 5) || acc.Usage.CompletionTokens != 5 || acc.Usage.PromptTokens == 0 {
			t.Fatalf("after %d chunks: choices %+v usage %+v", chunks, acc.Choices, acc.Usage)
		}
		if resp.Header.Get("x-served-by") == "" {
			t.Fatal("no x-served-by: the answer did not come from an engine")
		}
	})

	t.Run("n=2 returns two choices, streamed and not", func(t *testing.T) {
		params := openai.ChatCompletionNewParams{Model: model, N: openai.Int(2), MaxTokens: openai.Int(3),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Two answers, please.")}}
		full, err := c.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if len(full.Choices) != 2 || full.Choices[1].Index != 1 || full.Usage.CompletionTokens != 6 {
			t.Fatalf("n=2: %d choices, usage %+v", len(full.Choices), full.Usage)
		}
		st := c.Chat.Completions.NewStreaming(ctx, params)
		acc := openai.ChatCompletionAccumulator{}
		for st.Next() {
			acc.AddChunk(st.Current())
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 2 || acc.Choices[0].Message.Content != "tok tok tok " || acc.Choices[1].Message.Content != "tok tok tok " {
			t.Fatalf("streamed n=2: %+v", acc.Choices)
		}
	})

	t.Run("streamed tool calls and the tool loop", func(t *testing.T) {
		params := openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(6),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")},
			Tools: []openai.ChatCompletionToolParam{{Function: shared.FunctionDefinitionParam{
				Name: "get_weather", Description: openai.String("Weather for a city"),
				Parameters: openai.FunctionParameters{"type": "object",
					"properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}},
			}}},
		}
		st := c.Chat.Completions.NewStreaming(ctx, params)
		acc := openai.ChatCompletionAccumulator{}
		var finished []openai.FinishedChatCompletionToolCall
		for st.Next() {
			acc.AddChunk(st.Current())
			if tc, ok := acc.JustFinishedToolCall(); ok {
				finished = append(finished, tc)
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "tool_calls" || len(acc.Choices[0].Message.ToolCalls) != 1 {
			t.Fatalf("streamed answer: %+v", acc.Choices)
		}
		call := acc.Choices[0].Message.ToolCalls[0]
		var args struct{ City string }
		if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil || call.Function.Name != "get_weather" || args.City == "" || call.ID == "" {
			t.Fatalf("tool call %+v: %v", call, err)
		}
		if len(finished) != 1 || finished[0].Name != "get_weather" || finished[0].Arguments != call.Function.Arguments {
			t.Fatalf("JustFinishedToolCall saw %+v", finished)
		}
		params.Messages = append(params.Messages, acc.Choices[0].Message.ToParam(), openai.ToolMessage(`{"sky":"clear"}`, call.ID))
		final, err := c.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if final.Choices[0].FinishReason == "tool_calls" || final.Choices[0].Message.Content == "" {
			t.Fatalf("after the tool's result: %+v", final.Choices[0])
		}
	})

	t.Run("completions, streamed and not", func(t *testing.T) {
		p := openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(model), MaxTokens: openai.Int(4),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")}}
		full, err := c.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if full.Object != "text_completion" || full.Choices[0].Text != "tok tok tok tok " {
			t.Fatalf("completion %+v", full)
		}
		st := c.Completions.NewStreaming(ctx, p)
		var text strings.Builder
		for st.Next() {
			for _, ch := range st.Current().Choices {
				text.WriteString(ch.Text)
			}
		}
		if err := st.Err(); err != nil || text.String() != "tok tok tok tok " {
			t.Fatalf("streamed completion %q: %v", text.String(), err)
		}
	})

	t.Run("models.list", func(t *testing.T) {
		page, err := c.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(page.Data, func(m openai.Model) bool { return m.ID == model }) {
			t.Fatalf("models %+v do not include %s", page.Data, model)
		}
	})

	t.Run("the Responses API, steered by its prefix", func(t *testing.T) {
		var r1, r2, r3 *http.Response
		first, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: model, Instructions: openai.String(longSystem),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Capital of France?")}}, option.WithResponseInto(&r1))
		if err != nil {
			t.Fatal(err)
		}
		if first.Status != "completed" || first.OutputText() == "" || first.Usage.InputTokens == 0 {
			t.Fatalf("response %+v", first)
		}
		// The follow-up turn resends the conversation, the first answer included, streamed.
		input := responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage("Capital of France?", responses.EasyInputMessageRoleUser),
			responses.ResponseInputItemParamOfMessage(first.OutputText(), responses.EasyInputMessageRoleAssistant),
			responses.ResponseInputItemParamOfMessage("And of Italy?", responses.EasyInputMessageRoleUser),
		}
		st := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: model, Instructions: openai.String(longSystem),
			MaxOutputTokens: openai.Int(4), Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}}, option.WithResponseInto(&r2))
		var deltas strings.Builder
		var last string
		for st.Next() {
			ev := st.Current()
			if ev.Type == "response.output_text.delta" {
				deltas.WriteString(ev.AsResponseOutputTextDelta().Delta)
			}
			last = ev.Type
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if deltas.String() != "tok tok tok tok " || last != "response.incomplete" {
			t.Fatalf("streamed response: text %q, last event %q", deltas.String(), last)
		}
		// The equivalent chat request shares the key too.
		if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(1),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(longSystem), openai.UserMessage("Something else")}},
			option.WithResponseInto(&r3)); err != nil {
			t.Fatal(err)
		}
		served := []string{r1.Header.Get("x-served-by"), r2.Header.Get("x-served-by"), r3.Header.Get("x-served-by")}
		if served[0] == "" || served[1] != served[0] || served[2] != served[0] {
			t.Fatalf("a conversation and its chat twin were served by %v: not one engine", served)
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		res, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: model,
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"first text", "second text"}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Data) != 2 || len(res.Data[0].Embedding) != 32 || res.Data[1].Index != 1 || res.Usage.PromptTokens == 0 {
			t.Fatalf("embeddings: %d vectors, usage %+v", len(res.Data), res.Usage)
		}
	})

	t.Run("every OpenAI path the sidecar routes was steered", func(t *testing.T) {
		paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"}
		var steered map[string]int
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			steered = map[string]int{}
			for _, e := range readAccessLog(t, node.AccessLog) {
				if e.Status == 200 && e.Destination != "" && e.Destination != "-" {
					if first, _, _ := strings.Cut(e.Destination, ","); first != e.UpstreamHost {
						t.Fatalf("%s served by %s, the sidecar chose %s", e.Path, e.UpstreamHost, first)
					}
					steered[e.Path]++
				}
			}
			if !slices.ContainsFunc(paths, func(p string) bool { return steered[p] == 0 }) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("steered requests by path %v: want every one of %v (Envoy flushes its log every 50 ms)", steered, paths)
			}
		}
	})

	t.Run("errors arrive as the SDK's error type", func(t *testing.T) {
		chat := func(m string, msgs ...openai.ChatCompletionMessageParamUnion) error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: m, Messages: msgs, MaxTokens: openai.Int(1)})
			return err
		}
		wantStatus := func(what string, err error, status int, msg string) *openai.Error {
			t.Helper()
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("%s: %v is not an *openai.Error", what, err)
			}
			if apiErr.StatusCode != status || !strings.Contains(apiErr.Message, msg) {
				t.Fatalf("%s: status %d message %q, want %d and %q", what, apiErr.StatusCode, apiErr.Message, status, msg)
			}
			return apiErr
		}
		wantStatus("no messages", chat(model), 400, "'messages'")
		wantStatus("unknown model", chat("no-such-model", openai.UserMessage("hi")), 404, "does not exist")
		wantStatus("body over the engine's limit", chat(model, openai.UserMessage(strings.Repeat("x", 100_000))), 413, "larger than")

		if err := s.SetFaults(ctx, "h0", stack.EngineFaults{ErrorRate: 1, ErrorStatus: 429, LatencyMultiplier: 1}); err != nil {
			t.Fatal(err)
		}
		wantStatus("an engine's 429", chat(smallModel, openai.UserMessage("hi")), 429, "injected")

		// h0 holds one request (cap 1): the next is shed at once, with Retry-After.
		defer holdEngine(ctx, t, s, "h0", c, smallModel)()
		shed := probeUntilShed(ctx, t, c, smallModel, 503)
		wantStatus("shed", shed, 503, "overloaded")
		if shed.Response.Header.Get("Retry-After") == "" {
			t.Fatal("a shed answer without Retry-After")
		}
	})
}

// holdEngine makes engine hang and sends it one request for model, which it holds until
// the returned function cancels it; that function also clears the engine's faults.
func holdEngine(ctx context.Context, t *testing.T, s *stack.Stack, engine string, c openai.Client, model string) func() {
	t.Helper()
	if err := s.SetFaults(ctx, engine, stack.EngineFaults{Hang: true, LatencyMultiplier: 1}); err != nil {
		t.Fatal(err)
	}
	held, release := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = chat2(held, c, model)
	}()
	return func() {
		release()
		<-done
		_ = s.SetFaults(context.Background(), engine, stack.NoFaults())
	}
}

// probeUntilShed sends one-token probes (at most 50, each bounded to 300 ms) until one is
// shed, and fails unless it is shed with status want.
func probeUntilShed(ctx context.Context, t *testing.T, c openai.Client, m string, want int) *openai.Error {
	t.Helper()
	var shed *openai.Error
	for i := 0; i < 50 && shed == nil; i++ {
		probe, stop := context.WithTimeout(ctx, 300*time.Millisecond)
		err := chat2(probe, c, m)
		stop()
		if errors.As(err, &shed) && shed.StatusCode != want {
			t.Fatalf("probe %d: %v, want %d", i, err, want)
		}
	}
	if shed == nil {
		t.Fatalf("no %d while the only engine was at its cap", want)
	}
	return shed
}

func chat2(ctx context.Context, c openai.Client, m string) error {
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: m, MaxTokens: openai.Int(1),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("probe")}})
	return err
}
