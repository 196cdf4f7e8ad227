package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
)

// result is what the test learns from one request.
type result struct {
	status   int
	servedBy string
	body     []byte
}

var client = &http.Client{Timeout: 30 * time.Second}

func chat(ctx context.Context, baseURL, model, prompt string, stream bool, hdr map[string]string) (result, error) {
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": stream, "max_tokens": 4,
		"messages": []map[string]string{{"role": "system", "content": "You are terse."}, {"role": "user", "content": prompt}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, servedBy: resp.Header.Get("x-served-by"), body: b}, err
}

// checkCompletion asserts a well-formed non-streamed chat completion.
func checkCompletion(t *testing.T, r result) {
	t.Helper()
	var doc struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(r.body, &doc); err != nil {
		t.Fatalf("body is not JSON: %v: %s", err, r.body)
	}
	if doc.Object != "chat.completion" || len(doc.Choices) != 1 || doc.Choices[0].Message.Content == "" {
		t.Fatalf("malformed completion: %s", r.body)
	}
}

// checkStream asserts a well-formed SSE stream of chat chunks ending in [DONE].
func checkStream(t *testing.T, r result) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	chunks, done := 0, false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line without data: %q", line)
		}
		if done {
			t.Fatalf("data after [DONE]: %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var chunk struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil || chunk.Object != "chat.completion.chunk" || len(chunk.Choices) != 1 {
			t.Fatalf("malformed chunk %q: %v", data, err)
		}
		chunks++
	}
	if !done || chunks == 0 {
		t.Fatalf("stream had %d chunks, done=%v: %s", chunks, done, r.body)
	}
}

// waitAccessLog reads the access log until it holds at least n entries (Envoy flushes it
// every 50 ms in the test stack).
func waitAccessLog(t *testing.T, path string, n int) []stack.AccessEntry {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		entries := readAccessLog(t, path)
		if len(entries) >= n || time.Now().After(deadline) {
			return entries
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readAccessLog(t *testing.T, path string) []stack.AccessEntry {
	t.Helper()
	entries, err := stack.ReadAccessLog(path)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

func prompt(i int) string { return fmt.Sprintf("Question number %d: what is %d times %d?", i, i, i+7) }
