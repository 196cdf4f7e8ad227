package load

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEngine is an OpenAI-compatible server with known latencies: after a
// role-only chunk it waits ttft, sends the first text chunk, then one chunk
// every itl, a usage chunk and [DONE].
type fakeEngine struct {
	name   string
	ttft   time.Duration
	itl    time.Duration
	tokens int
	// status, when set, picks the status of the n-th request (from 0);
	// anything but 200 is answered at once with a JSON error.
	status func(n int) int
	// hang blocks until the client goes away; noDone omits [DONE];
	// streamError sends an error chunk after the first token; noUsage
	// omits the usage chunk.
	hang, noDone, streamError, noUsage bool

	count, inFlight, maxInFlight atomic.Int64

	mu sync.Mutex
	// served records, by prompt, when the handler flushed the first and the
	// last text chunk of a streamed request: the client must see each at
	// that instant or a little later, never earlier.
	served  map[string]servedTimes
	bodies  []requestBody
	paths   []string
	headers []http.Header
}

type servedTimes struct{ first, last time.Time }

func (f *fakeEngine) start(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	return srv.URL
}

func (f *fakeEngine) servedAt(prompt string) (servedTimes, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.served[prompt]
	return st, ok
}

func (f *fakeEngine) seen() ([]requestBody, []string, []http.Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies, f.paths, f.headers
}

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	n := int(f.count.Add(1) - 1)
	cur := f.inFlight.Add(1)
	// Leaves the in-flight count before the last write, so that a client
	// seeing the end of its response can never find it still counted.
	release := sync.OnceFunc(func() { f.inFlight.Add(-1) })
	defer release()
	for {
		prev := f.maxInFlight.Load()
		if cur <= prev || f.maxInFlight.CompareAndSwap(prev, cur) {
			break
		}
	}
	var body requestBody
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.paths = append(f.paths, r.URL.Path)
	f.headers = append(f.headers, r.Header.Clone())
	f.mu.Unlock()
	w.Header().Set(ServedByHeader, f.name)
	if f.status != nil {
		if code := f.status(n); code != http.StatusOK {
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"error":{"message":"status %d"}}`, code)
			return
		}
	}
	if f.hang {
		<-r.Context().Done()
		return
	}
	if !body.Stream {
		time.Sleep(f.ttft + time.Duration(f.tokens-1)*f.itl)
		release()
		fmt.Fprintf(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":%d}}`, f.tokens)
		return
	}
	prompt := body.Prompt
	if len(body.Messages) > 0 {
		prompt = body.Messages[0].Content
	}
	f.stream(w, r.URL.Path == Chat.path(), release, prompt)
}

func (f *fakeEngine) stream(w http.ResponseWriter, chat bool, release func(), prompt string) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(s string) {
		fmt.Fprintf(w, "data: %s\n\n", s)
		fl.Flush()
	}
	token := `{"choices":[{"text":"tok"}]}`
	if chat {
		token = `{"choices":[{"delta":{"content":"tok"}}]}`
	}
	send(`{"choices":[{"delta":{"role":"assistant"}}]}`)
	fmt.Fprint(w, ": keep-alive comment\n\n")
	time.Sleep(f.ttft)
	var times servedTimes
	for i := range f.tokens {
		if i > 0 {
			time.Sleep(f.itl)
		}
		times.last = time.Now() // before the flush, which the client may see at once
		if i == 0 {
			times.first = times.last
		}
		send(token)
		if f.streamError {
			send(`{"error":{"message":"engine died"}}`)
			return
		}
	}
	f.mu.Lock()
	if f.served == nil {
		f.served = map[string]servedTimes{}
	}
	f.served[prompt] = times
	f.mu.Unlock()
	if !f.noUsage {
		send(fmt.Sprintf(`{"choices":[],"usage":{"completion_tokens":%d}}`, 1000+f.tokens))
	}
	release()
	if !f.noDone {
		send("[DONE]")
	}
}
