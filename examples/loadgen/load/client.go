package load

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Endpoint selects the OpenAI API a run calls.
type Endpoint int

const (
	// Chat is POST /v1/chat/completions with one user message.
	Chat Endpoint = iota
	// Completions is POST /v1/completions with a prompt.
	Completions
)

// ParseEndpoint accepts "chat" and "completions".
func ParseEndpoint(s string) (Endpoint, error) {
	switch s {
	case "chat":
		return Chat, nil
	case "completions":
		return Completions, nil
	}
	return Chat, fmt.Errorf("endpoint %q: want chat or completions", s)
}

func (e Endpoint) path() string {
	if e == Completions {
		return "/v1/completions"
	}
	return "/v1/chat/completions"
}

// ServedByHeader is the response header naming the engine that answered.
const ServedByHeader = "x-served-by"

// Result classes other than HTTP status codes.
const (
	ClassOK          = "ok"
	ClassShed        = "shed"         // HTTP 503
	ClassTimeout     = "timeout"      // Config.Timeout elapsed
	ClassCanceled    = "canceled"     // the run's context ended
	ClassTransport   = "transport"    // connection refused, reset, ...
	ClassIncomplete  = "incomplete"   // a stream ended without [DONE]
	ClassStreamError = "stream_error" // an SSE chunk carried an error object
	ClassBadBody     = "bad_body"     // a 200 body that is not the expected JSON
)

// Result is the outcome of one request.
type Result struct {
	Index int
	// Start is when the request was sent, from the start of the run; Queued
	// is how late against its schedule it got a concurrency slot.
	Start, Queued time.Duration
	// Sent is the instant of Start on the process clock, for correlating
	// with server-side timestamps.
	Sent time.Time
	// Status is the HTTP status, zero when no response arrived.
	Status int
	// Engine is the x-served-by response header.
	Engine string
	// Class is ClassOK, ClassShed, a status code such as "500", or another
	// Class constant.
	Class string
	// TTFT is zero when not measured (not streamed, or no text arrived).
	TTFT time.Duration
	// ITLs are the gaps between successive chunks that carried text.
	ITLs []time.Duration
	E2E  time.Duration
	// Tokens is usage.completion_tokens when reported, else the number of
	// chunks that carried text.
	Tokens      int
	PromptBytes int
	// Detail is the start of an error body, or the transport error.
	Detail string
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type requestBody struct {
	Model         string         `json:"model"`
	Messages      []chatMessage  `json:"messages,omitempty"`
	Prompt        string         `json:"prompt,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
}

// chunk is the part of an SSE chunk or a whole response that we read.
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
		} `json:"delta"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

func (c *chunk) hasText() bool {
	for _, ch := range c.Choices {
		if ch.Text != "" || ch.Delta.Content != "" || ch.Delta.ReasoningContent != "" || ch.Message.Content != "" {
			return true
		}
	}
	return false
}

// maxSSELine bounds one SSE line; chunks are small, but a final chunk may
// carry a whole message.
const maxSSELine = 4 << 20

func (r *Runner) body(prompt string, maxTokens int) ([]byte, error) {
	b := requestBody{Model: r.cfg.Model, MaxTokens: maxTokens, Stream: r.cfg.Stream, IgnoreEOS: r.cfg.IgnoreEOS}
	if r.cfg.Endpoint == Completions {
		b.Prompt = prompt
	} else {
		b.Messages = []chatMessage{{Role: "user", Content: prompt}}
	}
	if r.cfg.Stream && r.cfg.IncludeUsage {
		b.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	return json.Marshal(b)
}

// send posts body, with prefix in Config.PrefixHeader when set, and fills res.
func (r *Runner) send(ctx context.Context, body []byte, prefix string, res *Result) {
	reqCtx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	t0 := time.Now()
	res.Sent, res.Start = t0, t0.Sub(r.start)
	defer func() { res.E2E = time.Since(t0) }()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		res.Class, res.Detail = ClassTransport, err.Error()
		return
	}
	req.Header = r.cfg.Header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("Content-Type", "application/json")
	if r.cfg.PrefixHeader != "" {
		req.Header.Set(r.cfg.PrefixHeader, prefix)
	}
	if r.cfg.Stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	resp, err := r.client.Do(req)
	if err != nil {
		res.Class, res.Detail = failureClass(ctx, reqCtx, ClassTransport), err.Error()
		return
	}
	defer resp.Body.Close()
	res.Status, res.Engine = resp.StatusCode, resp.Header.Get(ServedByHeader)
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable:
		res.Class, res.Detail = ClassShed, errorBody(resp.Body)
	case resp.StatusCode != http.StatusOK:
		res.Class, res.Detail = strconv.Itoa(resp.StatusCode), errorBody(resp.Body)
	case r.cfg.Stream:
		readStream(ctx, reqCtx, resp.Body, t0, res)
	default:
		readWhole(ctx, reqCtx, resp.Body, res)
	}
}

// failureClass tells a per-request timeout from the end of the whole run.
func failureClass(runCtx, reqCtx context.Context, otherwise string) string {
	switch {
	case runCtx.Err() != nil:
		return ClassCanceled
	case errors.Is(reqCtx.Err(), context.DeadlineExceeded):
		return ClassTimeout
	}
	return otherwise
}

func errorBody(body io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10)) // lets the connection be reused
	return strings.TrimSpace(string(b))
}

// readStream consumes SSE events until "data: [DONE]" and records TTFT and
// the gaps between chunks that carry text.
func readStream(runCtx, reqCtx context.Context, body io.Reader, t0 time.Time, res *Result) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 16<<10), maxSSELine)
	var last time.Duration
	chunks, usageTokens := 0, 0
	for sc.Scan() {
		payload, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue // comments, event names, blank separators
		}
		payload = bytes.TrimSpace(payload)
		if string(payload) == "[DONE]" {
			res.Class = ClassOK
			break
		}
		now := time.Since(t0)
		var c chunk
		if err := json.Unmarshal(payload, &c); err != nil {
			res.Class, res.Detail = ClassBadBody, fmt.Sprintf("SSE data is not JSON: %v", err)
			return
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			res.Class, res.Detail = ClassStreamError, string(c.Error)
			return
		}
		if c.Usage != nil && c.Usage.CompletionTokens > 0 {
			usageTokens = c.Usage.CompletionTokens
		}
		if !c.hasText() {
			continue
		}
		if chunks == 0 {
			res.TTFT = now
		} else {
			res.ITLs = append(res.ITLs, now-last)
		}
		last = now
		chunks++
	}
	res.Tokens = chunks
	if usageTokens > 0 {
		res.Tokens = usageTokens
	}
	if res.Class == ClassOK {
		return
	}
	res.Class = failureClass(runCtx, reqCtx, ClassIncomplete)
	if err := sc.Err(); err != nil {
		res.Detail = err.Error()
	}
}

// readWhole reads a non-streamed JSON response.
func readWhole(runCtx, reqCtx context.Context, body io.Reader, res *Result) {
	b, err := io.ReadAll(io.LimitReader(body, 64<<20))
	if err != nil {
		res.Class, res.Detail = failureClass(runCtx, reqCtx, ClassTransport), err.Error()
		return
	}
	var c chunk
	if err := json.Unmarshal(b, &c); err != nil {
		res.Class, res.Detail = ClassBadBody, fmt.Sprintf("response is not JSON: %v", err)
		return
	}
	if c.Usage != nil {
		res.Tokens = c.Usage.CompletionTokens
	}
	res.Class = ClassOK
}
