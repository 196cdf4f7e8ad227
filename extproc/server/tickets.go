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
}

func newTickets() *tickets {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &tickets{prefix: hex.EncodeToString(b[:]) + "-", m: map[string]inflight{}}
}

// next returns a fresh id, unique across sidecar restarts with high probability.
func (t *tickets) next() string {
	return t.prefix + strconv.FormatUint(t.seq.Add(1), 36)
}

func (t *tickets) put(id string, in inflight) {
	t.mu.Lock()
	t.m[id] = in
	t.mu.Unlock()
}

// take removes and returns the request with id, releasing its in-flight count unless its
// stream end already did.
func (t *tickets) take(id string) (inflight, bool) {
	t.mu.Lock()
	in, ok := t.m[id]
	if ok {
		delete(t.m, id)
	}
	t.mu.Unlock()
	if ok && !in.ended {
		in.ticket.Done()
	}
	return in, ok
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
			delete(t.m, id)
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
