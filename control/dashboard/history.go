package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// History keeps the control server's recent state documents so that a page opened now
// can draw the last minutes at once, instead of starting its charts empty.
//
// It samples a state function every Every and keeps Keep worth of samples (a ring: memory
// is bounded by Keep/Every documents). It is safe for concurrent use.
type History struct {
	state func() any
	every time.Duration
	max   int

	mu      sync.Mutex
	samples []json.RawMessage // oldest first
}

// NewHistory records state() every every, keeping keep of history. state must return a
// value that encodes to the /debug/state JSON document.
func NewHistory(state func() any, every, keep time.Duration) (*History, error) {
	if state == nil || every <= 0 || keep < every {
		return nil, fmt.Errorf("dashboard history: want a state function and 0 < every (%v) <= keep (%v)", every, keep)
	}
	return &History{state: state, every: every, max: int(keep / every)}, nil
}

// Run samples until ctx ends. It blocks.
func (h *History) Run(ctx context.Context) {
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		h.Sample()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sample records the current state now; Run calls it every period.
func (h *History) Sample() {
	doc, err := json.Marshal(h.state())
	if err != nil {
		return // a state that does not encode is not drawable either
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.samples) == h.max {
		copy(h.samples, h.samples[1:])
		h.samples = h.samples[:h.max-1]
	}
	h.samples = append(h.samples, doc)
}

// ServeHTTP answers with the recorded documents as one JSON array, oldest first.
func (h *History) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.mu.Lock()
	docs := append([]json.RawMessage(nil), h.samples...)
	h.mu.Unlock()
	if docs == nil {
		docs = []json.RawMessage{}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(docs)
}

// HandlerWithHistory serves the dashboard like Handler, plus h at history.json, which the
// page loads once when it opens. Mount it like Handler.
func HandlerWithHistory(h *History) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /history.json", h)
	mux.Handle("/", Handler())
	return mux
}
