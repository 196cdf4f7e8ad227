package picker

import (
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// counter is one endpoint's in-flight count and outstanding work, padded to its own
// cache line so that picks on different endpoints do not contend.
type counter struct {
	n atomic.Int64 // requests
	w atomic.Int64 // work units (see Table.Pick)
	x atomic.Int64 // work others hold on the endpoint, as last observed (SetObserved); unused in Loads.total
	// kw is the tokens the engine has written into its KV cache, as last observed
	// (SetKVWritten), for Homes' expiry.
	kw atomic.Int64
	// q is the requests the engine was last observed to hold waiting, not yet scheduled
	// (SetWaiting).
	q atomic.Int64
	// p is the work the node's other sidecars hold in flight on the endpoint, as they
	// last sent it (SetPeers); bounded loads and the least-work choice count it with w.
	p  atomic.Int64
	id uint32 // the address's number in its Loads, from 1 (0: past maxID), for Homes
	// h is the KV tokens the engine's running requests hold and its waiting requests will
	// take before a new one, as last observed (Observation.KVHeld + KVWaiting, at most the
	// cache's capacity), for Table.Room; kept 0 while kc is 0.
	// h, kc and f take 32 bits each to keep the counter in one 64-byte line.
	h atomic.Int32
	// kc is the cache's capacity in tokens, as last observed (SetKVWritten; 0: unknown, at
	// most math.MaxInt32), for Homes' expiry and Table.Room; read it with cache.
	kc atomic.Int32
	// f is the tokens per second the engine's running requests free as they finish, as
	// last observed (Observation.KVFreed; -1: not stated), for Table.Freed.
	f atomic.Int32
}

// cache is the engine's KV cache capacity in tokens as last observed; 0 when unknown.
func (c *counter) cache() int64 { return int64(c.kc.Load()) }

// clamp32 is n within [0, math.MaxInt32], for the counter's 32-bit fields.
func clamp32(n int64) int32 { return int32(min(max(n, 0), math.MaxInt32)) }

// stamp is what Homes stores with a placement on this endpoint: the cache's writes when
// the key is placed, plus 1 so that a stamp is never 0; 0 when the cache's capacity is
// unknown (such a placement never expires). The placed prompt's own writes are not added:
// a returning conversation's prompt is mostly in the cache already, and counting all of it
// as written would keep its home for up to a prompt's worth of writes after the cache has
// turned over (on an A100 holding two 75,000-token agentic sessions, most of the cache).
func (c *counter) stamp() int64 {
	if c.cache() <= 0 {
		return 0
	}
	return c.kw.Load() + 1
}

// turnedOver reports whether the engine's cache has written more than its capacity since
// stamp (a placement's), so that LRU eviction has taken what the placement cached; or
// fewer than nothing by more than its capacity: the engine restarted, with an empty cache.
func (c *counter) turnedOver(stamp int64) bool {
	capacity := c.cache()
	if stamp == 0 || capacity <= 0 {
		return false
	}
	d := c.kw.Load() + 1 - stamp
	return d > capacity || d < -capacity
}

// load is the work the endpoint holds as far as this process knows: its own in flight,
// its peers' in flight as they last sent it, and what others were last observed to hold.
func (c *counter) load() int64 { return c.w.Load() + c.p.Load() + c.x.Load() }

// inFlight is the work in flight on the endpoint from this process and its peers: what
// bounded loads weigh.
func (c *counter) inFlight() int64 { return c.w.Load() + c.p.Load() }

// Loads tracks in-flight requests per endpoint address. It outlives the tables that
// point into it, so a request started under one table is finished correctly under the
// next. Use one Loads per pool of engines whose tables replace each other (for
// example one per EDS cluster): its total is the denominator of every fair share.
//
// Loads is safe for concurrent use. Only table builds, Prune and InFlight take its
// mutex; Start, Done and Pick use atomics.
type Loads struct {
	total counter
	// over counts the requests started on overflow endpoints (Endpoint.Overflow), apart
	// from total: they hold none of the shares bounded loads divide, nor the caps
	// Table.Utilization sums.
	over counter

	mu     sync.Mutex
	byAddr map[string]*counter
	sorted []addrCounter // byAddr's entries sorted by address, for Each and SetPeers
	// peers is the work SetPeers was last given per address, for counters made after it
	// (an endpoint that joins a table between two peer snapshots starts with its share).
	peers  map[string]int64
	addrs  map[uint32]string // id -> address, for the counters in byAddr
	lastID uint32
}

// addrCounter is one entry of Loads.sorted.
type addrCounter struct {
	addr string
	c    *counter
}

// NewLoads returns an empty tracker.
func NewLoads() *Loads {
	return &Loads{byAddr: make(map[string]*counter), addrs: make(map[uint32]string)}
}

// Total is the number of requests in flight across every address, including
// addresses that have left the current table but still have requests running, and
// those sent to overflow endpoints.
func (l *Loads) Total() int64 { return l.total.n.Load() + l.over.n.Load() }

// TotalWork is the work in flight across every address, in the units given to Start,
// overflow endpoints' included.
func (l *Loads) TotalWork() int64 { return l.total.w.Load() + l.over.w.Load() }

// SetObserved records work that other routers hold on addr, as an outside view (the
// engine's own queue, scraped) last saw it; it replaces the previous value, and 0 forgets
// it. The least-work choice counts it with this process's own work, so sidecars that each
// see a fraction of an engine's traffic judge its load as a whole; bounded loads keep to
// the work in flight, this process's and its peers' (see Table.Pick). It takes the Loads'
// mutex: call it from an observer, not per request.
func (l *Loads) SetObserved(addr string, work int64) {
	work = max(work, 0)
	if c := l.observer(addr, work != 0); c != nil {
		c.x.Store(work)
	}
}

// observer returns addr's counter for an observation, creating it when create is set
// (else nil when addr has none). The caller stores into its atomics after the mutex is
// released; one that races Prune of addr is lost with the counter, which Prune drops only
// for addresses out of the table with nothing in flight.
func (l *Loads) observer(addr string, create bool) *counter {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.byAddr[addr]
	if c == nil && create {
		c = l.newCounter(addr)
	}
	return c
}

// SetKVWritten records the tokens the engine at addr has written into its KV cache since
// it started and the cache's capacity in tokens (enginemetrics.Load.KVWritten and
// KVTokens), as a scrape last read them; a capacity of 0 forgets both and the tokens held
// (Observation.KVHeld), Homes then keeps the engine's placements until they are replaced,
// and Table.Room finds room there. It takes the Loads' mutex: call
// it from an observer, not per request.
func (l *Loads) SetKVWritten(addr string, written, capacity int64) {
	if capacity <= 0 || written < 0 {
		written, capacity = 0, 0
	}
	if c := l.observer(addr, capacity != 0); c != nil {
		c.kw.Store(written)
		c.kc.Store(clamp32(capacity))
		if capacity == 0 {
			c.h.Store(0)
			c.f.Store(-1)
		}
	}
}

// Observation is what one scrape of an engine tells Loads: what SetKVWritten and
// SetWaiting take.
type Observation struct {
	KVWritten, KVCapacity int64
	Waiting               int64
	// KVHeld is the tokens the engine's KV cache holds for its running requests
	// (enginemetrics.Load.KVHeld), 0 when unknown; it counts only with KVCapacity.
	KVHeld int64
	// KVWaiting is the tokens the engine's waiting requests will take when it admits
	// them (decide.Core: the requests waiting times the mean prompt of the requests it
	// routed), 0 when none or unknown; it counts only with KVCapacity. vLLM admits its
	// queue in order, so a new request's blocks must fit beside the running requests'
	// and the waiting ones' (Table.Room).
	KVWaiting int64
	// KVFreed is the tokens per second the engine's running requests free as they
	// finish (decide.Core: the rate the engine finishes requests at, times the tokens a
	// running request holds on average); 0 when they finished none lately, negative when
	// the engine states no finishes. It counts only with KVCapacity.
	KVFreed int64
}

// Observe records o for addr, as SetKVWritten and SetWaiting do, and then the work
// others hold on addr, as SetObserved does, computed by others from this process's
// requests and work in flight on addr and its peers' work there (SetPeers): one
// observation under one lookup of addr, for the scraper's calls at every scrape. others
// runs with the Loads' mutex held and must not call Loads.
func (l *Loads) Observe(addr string, o Observation, others func(requests, work, peerWork int64) int64) {
	if o.KVCapacity <= 0 || o.KVWritten < 0 {
		o.KVWritten, o.KVCapacity = 0, 0
	}
	o.Waiting = max(o.Waiting, 0)
	o.KVHeld = min(max(o.KVHeld, 0), o.KVCapacity)
	o.KVWaiting = min(max(o.KVWaiting, 0), o.KVCapacity-o.KVHeld)
	if o.KVCapacity == 0 || o.KVFreed < 0 {
		o.KVFreed = -1
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.byAddr[addr]
	var x int64
	if c == nil {
		x = max(others(0, 0, max(l.peers[addr], 0)), 0)
		if o.KVCapacity == 0 && o.Waiting == 0 && x == 0 {
			return // what a counter made now would hold
		}
		c = l.newCounter(addr)
	} else {
		x = max(others(c.n.Load(), c.w.Load(), c.p.Load()), 0)
	}
	c.kw.Store(o.KVWritten)
	c.kc.Store(clamp32(o.KVCapacity))
	c.q.Store(o.Waiting)
	c.h.Store(clamp32(o.KVHeld + o.KVWaiting))
	c.f.Store(int32(min(o.KVFreed, math.MaxInt32)))
	c.x.Store(x)
}

// SetWaiting records the requests the engine at addr was last observed to hold waiting
// (vllm:num_requests_waiting): requests it has not scheduled into its running batch.
func (l *Loads) SetWaiting(addr string, n int64) {
	n = max(n, 0)
	if c := l.observer(addr, n != 0); c != nil {
		c.q.Store(n)
	}
}

// SetPeers records the work the node's other sidecars hold in flight, as they last sent
// it: on each address in work (addresses not in it hold none), and on ranked endpoints in
// all (their Loads' TotalWork less the overflow endpoints', the denominator of bounded
// loads). Only addresses that have a counter (every endpoint of a table built on this
// Loads, now or later) take it: a peer cannot grow the map. The caller must not change
// work afterwards. Bounded loads and the least-work choice
// count it as this process's own, so
// sidecars that each see a fraction of a node's traffic judge shares and loads over the
// whole of it; SetObserved's scrape, which counts these requests too, is the caller's to
// net out. It takes the Loads' mutex: call it from the peer exchange, not per request.
func (l *Loads) SetPeers(work map[string]int64, ranked int64) {
	l.mu.Lock()
	l.peers = work
	for _, e := range l.sorted {
		e.c.p.Store(max(work[e.addr], 0))
	}
	l.mu.Unlock()
	l.total.p.Store(max(ranked, 0))
}

// Peers is the work the node's other sidecars were last told to hold on addr (SetPeers).
func (l *Loads) Peers(addr string) int64 { return l.lookup(addr).p.Load() }

// RankedWork is this process's own work in flight on ranked endpoints (TotalWork less the
// overflow endpoints'): what a peer's SetPeers takes as ranked.
func (l *Loads) RankedWork() int64 { return l.total.w.Load() }

// Each calls fn with every address that has this process's own work in flight, its
// requests and their work, in address order. It takes the Loads' mutex: call it from the
// peer exchange.
func (l *Loads) Each(fn func(addr string, requests, work int64)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.sorted {
		if n, w := e.c.n.Load(), e.c.w.Load(); n > 0 || w > 0 {
			fn(e.addr, n, w)
		}
	}
}

// Observed is the work others were last observed to hold on addr (SetObserved).
func (l *Loads) Observed(addr string) int64 { return l.lookup(addr).x.Load() }

// Work is the work in flight to addr, in the units given to Start.
func (l *Loads) Work(addr string) int64 { return l.lookup(addr).w.Load() }

// InFlight is the number of requests in flight to addr.
func (l *Loads) InFlight(addr string) int64 { return l.lookup(addr).n.Load() }

// lookup returns addr's counter, or a zero one when addr has none.
func (l *Loads) lookup(addr string) *counter {
	l.mu.Lock()
	c := l.byAddr[addr]
	l.mu.Unlock()
	if c == nil {
		return new(counter)
	}
	return c
}

// Prune forgets the counters of addresses that are not in keep and have nothing in
// flight, so a churning fleet does not grow the map forever. Call it after swapping
// in keep. It returns how many counters it forgot. A request that an older table
// starts on a forgotten address afterwards still finishes correctly (its Ticket holds
// the counter); the address merely starts from zero if it comes back. A nil keep
// keeps no address.
func (l *Loads) Prune(keep *Table) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for addr, c := range l.byAddr {
		if keep != nil {
			if _, live := keep.index[addr]; live {
				continue
			}
		}
		if c.n.Load() != 0 {
			continue
		}
		delete(l.byAddr, addr)
		delete(l.addrs, c.id)
		n++
	}
	if n > 0 {
		l.sorted = slices.DeleteFunc(l.sorted, func(e addrCounter) bool { return l.byAddr[e.addr] != e.c })
	}
	return n
}

// newCounter adds addr's counter, with the next id (0 once maxID are taken). l.mu is held.
func (l *Loads) newCounter(addr string) *counter {
	c := new(counter)
	c.f.Store(-1)
	c.p.Store(max(l.peers[addr], 0))
	if l.lastID < maxID {
		l.lastID++
		c.id = l.lastID
		l.addrs[c.id] = addr
	}
	l.byAddr[addr] = c
	i, _ := slices.BinarySearchFunc(l.sorted, addr, func(e addrCounter, a string) int { return strings.Compare(e.addr, a) })
	l.sorted = slices.Insert(l.sorted, i, addrCounter{addr, c})
	return c
}

// ID is the number Homes stores for addr, 0 when addr has no counter (or no number).
func (l *Loads) ID(addr string) uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.byAddr[addr]; c != nil {
		return c.id
	}
	return 0
}

// Stamp is the number Homes stores for addr (0 when addr has no counter) and the stamp a
// peer's placement on addr takes now (Homes.Adopt): the placement's prompt is taken to be
// in the cache already.
func (l *Loads) Stamp(addr string) (id uint32, stamp int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.byAddr[addr]; c != nil {
		return c.id, c.stamp()
	}
	return 0, 0
}

// Address is the address numbered id, "" when none is.
func (l *Loads) Address(id uint32) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addrs[id]
}

// counters returns the counter for each address, creating missing ones.
func (l *Loads) counters(eps []Endpoint) []*counter {
	out := make([]*counter, len(eps))
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, ep := range eps {
		c := l.byAddr[ep.Address]
		if c == nil {
			c = l.newCounter(ep.Address)
		}
		out[i] = c
	}
	return out
}

// Ticket is one started request. Call Done exactly once when the request ends
// (response complete, reset or timeout). The zero Ticket's Done does nothing.
type Ticket struct {
	c     *counter
	total *counter
	work  int64
	// pins, pinID and pinned are the prompt prefix marks Pins.Pin counted for the request
	// (nil when none), released with it.
	pins   *Pins
	pinID  uint32
	pinned []uint64
}

// Done records that the request has ended.
func (t Ticket) Done() {
	if t.c == nil {
		return
	}
	t.c.n.Add(-1)
	t.c.w.Add(-t.work)
	t.total.n.Add(-1)
	t.total.w.Add(-t.work)
	if t.pins != nil {
		t.pins.release(t.pinID, t.pinned)
	}
}
