package decide

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
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

// ticketShards is how many independently locked parts the ticket maps are split into, so
// that concurrent requests rarely meet on one lock.
const ticketShards = 16

// tickets maps ticket ids to in-flight requests. Envoy's access log entry for the request
// carries the id back (outcome.HeaderTicket), which ends the ticket. Ids are
// prefix + base-36 sequence number; the sequence picks the shard, so no id is hashed.
// Request ids (for outcomes that come back without the ticket) are indexed in shards of
// their own, by an FNV-1a hash of the id.
type tickets struct {
	prefix string
	seq    atomic.Uint64
	byID   [ticketShards]idShard
	byReq  [ticketShards]reqShard
}

type idShard struct {
	mu sync.Mutex
	m  map[string]inflight
	_  [40]byte // keep neighbouring shards' locks off one cache line
}

type reqShard struct {
	mu sync.Mutex
	// ids maps x-request-id to ticket id.
	ids map[string]string
	// finished holds the request ids of recent outcomes that matched no ticket: a sidecar
	// that stalled may route a request Envoy already gave up on and served, whose outcome
	// came first. A ring bounds it.
	finished map[string]struct{}
	ring     [finishedKept / ticketShards]string
	next     int
}

// finishedKept is how many unmatched outcomes are remembered in all: more than a stalled
// sidecar's backlog of streams Envoy gave up on.
const finishedKept = 4096

func newTickets() *tickets {
	var b [4]byte
	_, _ = rand.Read(b[:])
	t := &tickets{prefix: hex.EncodeToString(b[:]) + "-"}
	for i := range t.byID {
		t.byID[i].m = map[string]inflight{}
		t.byReq[i].ids = map[string]string{}
		t.byReq[i].finished = map[string]struct{}{}
	}
	return t
}

// next returns a fresh id, unique across sidecar restarts with high probability.
func (t *tickets) next() string {
	return t.prefix + strconv.FormatUint(t.seq.Add(1), 36)
}

// idShard returns the shard of a ticket id, or nil for an id this sidecar did not issue.
func (t *tickets) idShard(id string) *idShard {
	rest, ok := strings.CutPrefix(id, t.prefix)
	if !ok {
		return nil
	}
	n, err := strconv.ParseUint(rest, 36, 64)
	if err != nil {
		return nil
	}
	return &t.byID[n%ticketShards]
}

func (t *tickets) reqShard(requestID string) *reqShard {
	h := uint32(2166136261)
	for i := 0; i < len(requestID); i++ {
		h = (h ^ uint32(requestID[i])) * 16777619
	}
	return &t.byReq[h%ticketShards]
}

// put tracks a steered request under id (from next). A request whose outcome already came
// (see finish) is released at once instead, and put reports false.
func (t *tickets) put(id string, in inflight) bool {
	if in.requestID != "" {
		rs := t.reqShard(in.requestID)
		rs.mu.Lock()
		if _, done := rs.finished[in.requestID]; done {
			delete(rs.finished, in.requestID)
			rs.mu.Unlock()
			in.ticket.Done()
			return false
		}
		rs.ids[in.requestID] = id
		rs.mu.Unlock()
	}
	s := t.idShard(id)
	s.mu.Lock()
	s.m[id] = in
	s.mu.Unlock()
	return true
}

// finish remembers the request id of an outcome that matched no ticket.
func (t *tickets) finish(requestID string) {
	rs := t.reqShard(requestID)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, ok := rs.finished[requestID]; ok {
		return
	}
	if old := rs.ring[rs.next]; old != "" {
		delete(rs.finished, old)
	}
	rs.ring[rs.next] = requestID
	rs.next = (rs.next + 1) % len(rs.ring)
	rs.finished[requestID] = struct{}{}
}

// take removes and returns the request with id, releasing its in-flight count unless its
// stream end already did.
func (t *tickets) take(id string) (inflight, bool) {
	s := t.idShard(id)
	if s == nil {
		return inflight{}, false
	}
	s.mu.Lock()
	in, ok := s.m[id]
	if ok {
		delete(s.m, id)
	}
	s.mu.Unlock()
	if !ok {
		return in, false
	}
	t.unindex(in.requestID, id)
	if !in.ended {
		in.ticket.Done()
	}
	return in, true
}

// unindex forgets requestID's entry if it still points at id.
func (t *tickets) unindex(requestID, id string) {
	if requestID == "" {
		return
	}
	rs := t.reqShard(requestID)
	rs.mu.Lock()
	if rs.ids[requestID] == id {
		delete(rs.ids, requestID)
	}
	rs.mu.Unlock()
}

// takeRequest is take for the ticket of Envoy's request id.
func (t *tickets) takeRequest(requestID string) (inflight, bool) {
	rs := t.reqShard(requestID)
	rs.mu.Lock()
	id, ok := rs.ids[requestID]
	rs.mu.Unlock()
	if !ok {
		return inflight{}, false
	}
	return t.take(id)
}

// end releases the in-flight count of id's request when its stream closes, keeping the
// entry for the outcome. It is a no-op for unknown or already ended ids.
func (t *tickets) end(id string) {
	s := t.idShard(id)
	if s == nil {
		return
	}
	s.mu.Lock()
	in, ok := s.m[id]
	release := ok && !in.ended
	if release {
		in.ended = true
		s.m[id] = in
	}
	s.mu.Unlock()
	if release {
		in.ticket.Done()
	}
}

// expire drops every ticket started before cutoff, releasing those still counted, and
// returns how many it released: their ends and outcomes were lost, and an in-flight count
// that never falls would starve the engine.
func (t *tickets) expire(cutoff time.Time) int {
	type dropped struct {
		id string
		in inflight
	}
	var old []dropped
	for i := range t.byID {
		s := &t.byID[i]
		s.mu.Lock()
		for id, in := range s.m {
			if in.start.Before(cutoff) {
				old = append(old, dropped{id, in})
				delete(s.m, id)
			}
		}
		s.mu.Unlock()
	}
	released := 0
	for _, d := range old {
		t.unindex(d.in.requestID, d.id)
		if !d.in.ended {
			d.in.ticket.Done()
			released++
		}
	}
	return released
}

func (t *tickets) len() int {
	n := 0
	for i := range t.byID {
		s := &t.byID[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

func (t *tickets) finishedLen() int {
	n := 0
	for i := range t.byReq {
		rs := &t.byReq[i]
		rs.mu.Lock()
		n += len(rs.finished)
		rs.mu.Unlock()
	}
	return n
}
