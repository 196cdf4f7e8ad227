package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meridian-router/meridian/extproc/decide"
)

// Explained is one decision as /debug/decisions shows it: where the request went and why.
type Explained struct {
	At        time.Time `json:"at"`
	RequestID string    `json:"request_id,omitempty"` // Envoy's x-request-id
	Model     string    `json:"model"`
	// Result is the decision: steered, shed_quota, shed_limit, no_engine.
	Result string `json:"result"`
	// PrefixKey is the routing key (hex), as Envoy's x-meridian-prefix-hash carries it.
	PrefixKey string `json:"prefix_key"`
	key       uint64 // formatted into PrefixKey when read, off the request path
	Priority  int    `json:"priority"`
	// Engine is the primary; Destination the whole list Envoy tries, in order.
	Engine      string `json:"engine,omitempty"`
	Destination string `json:"destination,omitempty"`
	// PassedOver is set when the key's first engine was passed over because of load: over
	// its bounded-load share, holding more work than the next engine plus the prompt (the
	// least-work choice), or at its in-flight cap (outlier penalties act on the weights
	// themselves, so a penalized engine is ranked lower, not passed over).
	PassedOver bool `json:"passed_over_for_load"`
	// Overflowed is set when the engine is one the node has no share of: the engines with
	// a share would have queued the request (picker.overflow_at).
	Overflowed bool `json:"overflowed"`
	// Subset is set when a GIE gateway's subset hint restricted the pick.
	Subset []string `json:"subset,omitempty"`
	// Retries and RetryOn are the grant Envoy got; Budget what the retry budget allowed.
	Retries uint32 `json:"retries"`
	RetryOn string `json:"retry_on,omitempty"`
	Budget  uint32 `json:"retry_budget"`
	// Status is the sidecar's own answer for a shed or refused request.
	Status int `json:"status,omitempty"`
}

// decisionLog keeps the last decisions in a ring: a writer claims a slot with one atomic
// add and stores a pointer, so recording takes no lock shared by requests. Readers copy
// what the slots hold; a slot being rewritten shows its old or its new decision.
type decisionLog struct {
	next  atomic.Uint64
	slots []atomic.Pointer[Explained]
}

func newDecisionLog(n int) *decisionLog {
	if n <= 0 {
		return nil
	}
	return &decisionLog{slots: make([]atomic.Pointer[Explained], n)}
}

func (l *decisionLog) add(e *Explained) {
	if l == nil {
		return
	}
	i := l.next.Add(1) - 1
	l.slots[i%uint64(len(l.slots))].Store(e)
}

// recent returns up to limit decisions, newest first, that keep says to keep.
func (l *decisionLog) recent(limit int, keep func(*Explained) bool) []*Explained {
	if l == nil {
		return nil
	}
	n := l.next.Load()
	out := []*Explained{}
	for k := uint64(0); k < uint64(len(l.slots)) && k < n && len(out) < limit; k++ {
		e := l.slots[(n-1-k)%uint64(len(l.slots))].Load()
		if e != nil && keep(e) {
			c := *e
			c.PrefixKey = strconv.FormatUint(c.key, 16)
			out = append(out, &c)
		}
	}
	return out
}

// explain records d for st's request: in the decision log, and as a span when tracing is on.
func (s *Server) explain(ctx context.Context, st *streamState, d *decide.Decision, status int) {
	if s.cfg.Tracer != nil {
		s.span(ctx, st, d, status)
	}
	if s.decisions == nil {
		return
	}
	e := &Explained{At: s.clock.Now(), RequestID: st.requestID, Model: d.Model, Result: d.Verdict.String(),
		key: st.req.Key, Priority: d.Priority, Engine: d.Engine, Destination: st.dest,
		PassedOver: d.Spilled, Overflowed: d.Overflowed, Retries: d.Retries, RetryOn: d.RetryOn, Budget: d.Budget, Status: status}
	if st.hasSubset {
		e.Subset = st.subset
	}
	s.decisions.add(e)
}

// DecisionsHandler serves GET /debug/decisions: the last decisions, newest first, as JSON.
// Query parameters: engine (a name or ip:port; decisions that listed it), model, result,
// and limit (default 100).
func (s *Server) DecisionsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		limit := 100
		if v := q.Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				http.Error(w, "limit: want a positive integer", http.StatusBadRequest)
				return
			}
			limit = n
		}
		engine, model, result := q.Get("engine"), q.Get("model"), q.Get("result")
		keep := func(e *Explained) bool {
			if engine != "" && e.Engine != engine && !listed(e.Destination, engine) {
				return false
			}
			return (model == "" || e.Model == model) && (result == "" || e.Result == result)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"kept": s.cfg.Decisions, "decisions": s.decisions.recent(limit, keep)})
	})
}

func listed(dest, addr string) bool {
	for _, a := range strings.Split(dest, ",") {
		if a == addr {
			return true
		}
	}
	return false
}
