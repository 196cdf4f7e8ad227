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

// take removes and returns the request with id, if it is still in flight.
func (t *tickets) take(id string) (inflight, bool) {
	t.mu.Lock()
	in, ok := t.m[id]
	if ok {
		delete(t.m, id)
	}
	t.mu.Unlock()
	return in, ok
}

// expire ends every ticket started before cutoff and returns how many it ended: their
// outcomes were lost, and an in-flight count that never falls would starve the engine.
func (t *tickets) expire(cutoff time.Time) int {
	var old []inflight
	t.mu.Lock()
	for id, in := range t.m {
		if in.start.Before(cutoff) {
			old = append(old, in)
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
