package server

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-router/meridian/extproc/picker"
)

// inflight is one steered request whose outcome has not arrived yet.
type inflight struct {
	ticket  picker.Ticket
	engine  string
	address string // the primary the sidecar chose
	model   string
	start   time.Time
	// requestID is Envoy's x-request-id for the request, the key of last resort.
	requestID string
	// ended is set when the request's ext_proc stream closed, which Envoy does when the
	// request ends (or when it gave up on the sidecar): the in-flight count is released
	// then, and the entry waits only for the outcome from the access log.
	ended bool
}

// tickets maps ticket ids to in-flight requests. Envoy's access log entry for the request
// carries the id back (outcome.HeaderTicket), which ends the ticket.
type tickets struct {
	prefix string
	seq    atomic.Uint64

	mu sync.Mutex
	m  map[string]inflight
	// byRequest maps x-request-id to ticket id, for an outcome that came back without the
	// ticket header: Envoy stopped waiting for the sidecar just as it answered.
	byRequest map[string]string
	// finished holds the request ids of recent outcomes that matched no ticket: a sidecar
	// that stalled may route a request Envoy already gave up on and served, whose outcome
	// came first. A ring bounds it.
	finished     map[string]struct{}
	finishedRing [finishedKept]string
	finishedNext int
}

// finishedKept is how many unmatched outcomes are remembered: more than a stalled
// sidecar's backlog of streams Envoy gave up on.
const finishedKept = 4096

func newTickets() *tickets {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &tickets{prefix: hex.EncodeToString(b[:]) + "-", m: map[string]inflight{}, byRequest: map[string]string{}, finished: map[string]struct{}{}}
}

// next returns a fresh id, unique across sidecar restarts with high probability.
func (t *tickets) next() string {
	return t.prefix + strconv.FormatUint(t.seq.Add(1), 36)
}

// put tracks a steered request. A request whose outcome already came (see finished) is
// released at once instead, and put reports false.
func (t *tickets) put(id string, in inflight) bool {
	t.mu.Lock()
	if _, done := t.finished[in.requestID]; done && in.requestID != "" {
		delete(t.finished, in.requestID)
		t.mu.Unlock()
		in.ticket.Done()
		return false
	}
	t.m[id] = in
	if in.requestID != "" {
		t.byRequest[in.requestID] = id
	}
	t.mu.Unlock()
	return true
}

// finish remembers the request id of an outcome that matched no ticket.
func (t *tickets) finish(requestID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.finished[requestID]; ok {
		return
	}
	if old := t.finishedRing[t.finishedNext]; old != "" {
		delete(t.finished, old)
	}
	t.finishedRing[t.finishedNext] = requestID
	t.finishedNext = (t.finishedNext + 1) % finishedKept
	t.finished[requestID] = struct{}{}
}

// take removes and returns the request with id, releasing its in-flight count unless its
// stream end already did.
func (t *tickets) take(id string) (inflight, bool) {
	t.mu.Lock()
	in, ok := t.m[id]
	if ok {
		t.remove(id, in)
	}
	t.mu.Unlock()
	if ok && !in.ended {
		in.ticket.Done()
	}
	return in, ok
}

// takeRequest is take for the ticket of Envoy's request id.
func (t *tickets) takeRequest(requestID string) (inflight, bool) {
	t.mu.Lock()
	id, ok := t.byRequest[requestID]
	t.mu.Unlock()
	if !ok {
		return inflight{}, false
	}
	return t.take(id)
}

// remove forgets id; t.mu must be held.
func (t *tickets) remove(id string, in inflight) {
	delete(t.m, id)
	if in.requestID != "" && t.byRequest[in.requestID] == id {
		delete(t.byRequest, in.requestID)
	}
}

// end releases the in-flight count of id's request when its stream closes, keeping the
// entry for the outcome. It is a no-op for unknown or already ended ids.
func (t *tickets) end(id string) {
	t.mu.Lock()
	in, ok := t.m[id]
	release := ok && !in.ended
	if release {
		in.ended = true
		t.m[id] = in
	}
	t.mu.Unlock()
	if release {
		in.ticket.Done()
	}
}

// expire drops every ticket started before cutoff, releasing those still counted, and
// returns how many it released: their ends and outcomes were lost, and an in-flight count
// that never falls would starve the engine.
func (t *tickets) expire(cutoff time.Time) int {
	var old []inflight
	t.mu.Lock()
	for id, in := range t.m {
		if in.start.Before(cutoff) {
			if !in.ended {
				old = append(old, in)
			}
			t.remove(id, in)
		}
	}
	t.mu.Unlock()
	for _, in := range old {
		in.ticket.Done()
	}
	return len(old)
}

func (t *tickets) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
