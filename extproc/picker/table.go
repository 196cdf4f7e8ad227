package picker

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Table is an immutable ranking of endpoints for every key, plus pointers into the
// shared in-flight counters. Build a new one whenever the endpoints, weights or
// penalties change and publish it with an atomic.Pointer; readers never lock.
type Table struct {
	cfg   Config
	eps   []Endpoint // ranked (weight > 0) sorted by address, then overflow in the order given; indices are positions here
	n     int        // ranked endpoints: eps[:n]
	bound []float64  // (1+ε) × weight share
	limit []int64    // hard cap; math.MaxInt64 when none
	ctr   []*counter
	total *counter // requests on ranked endpoints (bounded loads' denominator)
	over  *counter // requests on overflow endpoints
	index map[string]int
	byID  []int32 // counter id -> index + 1 (0: not in the table), for Homes; 4 bytes per id the Loads has given out

	slots     []uint16 // Buckets × k candidates, best first, emptySlot-padded
	k         int
	mask      uint32
	shift     uint
	want      int // candidates Pick gathers for the least-work choice: min(Choices, n)
	list      int // entries Pick returns at most: min(Fallbacks+1, n)
	maxExam   int // distinct endpoints Pick may examine: min(MaxExamined, n)
	maxProbe  int // buckets Pick may visit
	capTotal  int64
	allCapped bool
}

// Result is the outcome of one Pick.
type Result struct {
	// Order lists endpoint indices, primary first, all distinct and none at its hard
	// cap. Endpoints within their bounded-load share come first, in the key's order,
	// then endpoints over it (still under the cap), in the key's order. It is empty
	// when the table is empty or AtLimit is set: the caller should shed.
	Order []int
	// Spilled is set when the key's first-ranked endpoint (or its home, with PickHome)
	// is not the primary because of load (bounded-load spill, hard cap or the least-work
	// choice).
	Spilled bool
	// AtLimit is set when every endpoint Pick examined is at its hard cap.
	AtLimit bool
	// Overflowed is set when the primary is an overflow endpoint (Endpoint.Overflow); the
	// ranked endpoints follow it.
	Overflowed bool
}

// NewTable ranks the endpoints with positive weight and links them to their in-flight
// counters in loads (creating the counters that are missing), with the overflow
// endpoints (Endpoint.Overflow) after them, unranked. The input order of the ranked
// endpoints does not matter; overflow endpoints keep theirs, which breaks ties between
// them (the caller's preference: the decision core lists the nearest first). It returns
// an error naming the first bad field; an empty table (no positive weight) is valid and
// picks nothing.
//
// Building costs about Buckets × Candidates random draws (tens of milliseconds at the
// default size): build off the hot path and swap.
func NewTable(cfg Config, endpoints []Endpoint, loads *Loads) (*Table, error) {
	return newTable(cfg, endpoints, loads, nil)
}

// newTable is NewTable, with the ranking from memo (nil: computed here).
func newTable(cfg Config, endpoints []Endpoint, loads *Loads, memo *Rankings) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if loads == nil {
		return nil, fmt.Errorf("picker: NewTable needs a Loads (use one per engine pool, shared by its tables)")
	}
	if err := validateEndpoints(endpoints); err != nil {
		return nil, err
	}
	eps := make([]Endpoint, 0, len(endpoints))
	for _, ep := range endpoints {
		if ep.Weight > 0 && !ep.Overflow {
			eps = append(eps, ep)
		}
	}
	slices.SortFunc(eps, func(a, b Endpoint) int { return strings.Compare(a.Address, b.Address) })
	n := len(eps)
	for _, ep := range endpoints {
		if ep.Overflow && n > 0 && cfg.OverflowAt > 0 {
			eps = append(eps, ep)
		}
	}

	t := &Table{
		cfg:      cfg,
		eps:      eps,
		n:        n,
		bound:    make([]float64, len(eps)),
		limit:    make([]int64, len(eps)),
		ctr:      loads.counters(eps),
		total:    &loads.total,
		over:     &loads.over,
		index:    make(map[string]int, len(eps)),
		k:        min(cfg.Candidates, max(n, 1)),
		mask:     uint32(cfg.Buckets - 1),
		shift:    uint(64 - log2(cfg.Buckets)),
		want:     min(cfg.Choices, n),
		list:     min(cfg.Fallbacks+1, n),
		maxExam:  min(cfg.MaxExamined, n),
		maxProbe: 4 * cfg.MaxExamined,
	}
	sum := 0.0
	for _, ep := range eps[:n] {
		sum += ep.Weight
	}
	t.allCapped = n > 0
	var maxID uint32
	for _, c := range t.ctr {
		maxID = max(maxID, c.id)
	}
	t.byID = make([]int32, maxID+1)
	for i, ep := range eps {
		t.index[ep.Address] = i
		if id := t.ctr[i].id; id != 0 {
			t.byID[id] = int32(i + 1)
		}
		t.limit[i] = cmp.Or(ep.MaxInFlight, cfg.MaxInFlight, math.MaxInt64)
		if i >= n {
			continue // overflow: no share, and not in the table's capacity
		}
		t.bound[i] = (1 + cfg.Epsilon) * ep.Weight / sum
		if t.limit[i] == math.MaxInt64 {
			t.allCapped = false
		} else {
			t.capTotal += t.limit[i]
		}
	}
	if n > 0 {
		t.slots = memo.slots(eps[:n], cfg.Buckets, t.k)
	}
	return t, nil
}

// Pick returns the key's preference list for a request of the given work, honouring
// bounded loads and hard caps, and choosing its primary by the least relative work among
// the endpoints within their bound. It returns at most Fallbacks+1 endpoints, appended to
// dst[:0], and allocates nothing when cap(dst) ≥ Choices. It only reads the in-flight
// counters: call Start, with the same work, on the endpoint the request is sent to.
//
// Bounded loads compare outstanding work, not request counts: an endpoint is within its
// bound while the work it has in flight is below (1+ε) × its share of all work in flight
// counting the new request's, or below Config.SpillFloor. Work is in whatever unit the
// caller chooses (the decision core uses estimated engine tokens); work 1 for every
// request counts requests, as Mirrokni et al. do. Work below 1 counts as 1. The hard cap
// counts requests.
//
// The least-work choice: once the key's first endpoint within its bound holds at least
// Config.SpillFloor, the primary is whichever returned endpoint within its bound would
// hold the least work relative to its size after taking the request (its KV cache in
// tokens when every candidate's is known, else its share; the key's first
// Config.Choices endpoints within their bound are weighed), where every
// endpoint but that first one is charged move on top of work (the work it must redo
// because it lacks the key's cached prefix: the decision core passes the prompt's
// tokens). Ties keep the first. Here an endpoint's work is its work in flight (this
// process's and its peers', Loads.SetPeers) plus the work others were last observed to
// hold on it (Loads.SetObserved): the choice compares engines as a whole. Bounded loads
// keep to the work in flight, as the paper's rule does for one balancer: the peers'
// snapshots are milliseconds old, the observed view tens of milliseconds, and measured
// on the simulator, judging bounds on it spilled keys that the choice keeps
// (docs/results/README.md). The others keep the key's order behind it. The
// alternatives are the key's next endpoints, the same for every sidecar, so a hot key
// spills to the same few engines everywhere.
//
// Concurrent picks read counters without coordination, so simultaneous requests may
// overshoot a bound or cap by at most the number of concurrent pickers.
func (t *Table) Pick(key uint64, work, move int64, dst []int) Result {
	return t.PickHome(key, work, move, -1, dst)
}

// Ask is one request as PickFor weighs it: Pick's and PickHome's arguments, and what
// prices a move by the candidate and the room its cache has for the prompt.
type Ask struct {
	Key uint64
	// Work is the request's work and Move the cost of leaving the key's cache (Pick).
	Work, Move int64
	// Home is the endpoint the key's last request went to, -1 when none is known
	// (PickHome).
	Home int
	// Prefixes and Marks charge each candidate but the home the share of Move that stands
	// for the prompt's marks Prefixes does not record it as holding (Prefixes.Held), where
	// without them every candidate but the home is charged all of Move.
	Prefixes *Prefixes
	Marks    []uint64
	// Prompt is the prompt's tokens, for the room its KV blocks need (Room); 0 asks for
	// none. A candidate without room is charged a cache's worth of work, and a home
	// far from room keeps the key for a move cost of at most the prompt (the package
	// doc's Room).
	Prompt int64
	// Pins and MarkTokens (the prompt tokens each of Marks stands for) take from the room
	// a candidate's cache must have the part of the prompt this process's requests in
	// flight there already pin (Pins.Pinned): those blocks are shared, not allocated
	// again. Without them the whole prompt needs room.
	Pins       *Pins
	MarkTokens int64
}

// PickHome is Pick for a key whose last request went to endpoint home (Homes.Lookup; -1:
// none known). The home takes the place of the key's first endpoint in the least-work
// choice: it keeps the key while it holds less than Config.SpillFloor, and past the floor
// every other endpoint is charged move. A home outside the endpoints Pick returns within
// their bound leaves the choice to the key's first, as without a home, except that with
// PickFor's Ask.Prompt a first without room for it is charged move too (leastWork).
// Result.Spilled then says the home (when Pick examined it) is not the primary.
func (t *Table) PickHome(key uint64, work, move int64, home int, dst []int) Result {
	return t.PickFor(&Ask{Key: key, Work: work, Move: move, Home: home}, dst)
}

// PickFor is PickHome with what Ask adds: each candidate charged by what it lacks of the
// prompt (Ask.Marks) and by the room its cache has for it (Ask.Prompt). With none of
// them it is PickHome.
func (t *Table) PickFor(a *Ask, dst []int) Result {
	dst = dst[:0]
	if t.n == 0 {
		return Result{Order: dst}
	}
	key, home := a.Key, a.Home
	// Mirrokni et al. count the arriving request in the total it must fit under.
	work := max(a.Work, 1)
	mv := charge{move: max(a.Move, 0), prompt: max(a.Prompt, 0), marks: a.Marks}
	if a.Pins != nil && len(a.Marks) > 0 && a.MarkTokens > 0 {
		mv.pins, mv.markTokens, mv.common = a.Pins, a.MarkTokens, -1
	}
	if mv.prompt > 0 && home >= 0 && home < len(t.eps) {
		mv.move = t.homeMove(home, mv.move, mv.prompt)
	}
	if a.Prefixes != nil && len(a.Marks) > 0 && mv.move > 0 {
		mv.prefixes = a.Prefixes
	}
	w := walk{b: uint32(mix(key) >> t.shift), total: float64(t.total.inFlight() + work)}
	dst = t.gather(&w, dst, t.list)
	// The walk goes on to Choices endpoints only when the least-work choice is in play:
	// the key's home lies beyond the list, or the endpoint that would keep the key holds
	// SpillFloor or more. Otherwise the choice keeps that endpoint, as it would among
	// Choices, and the list is the same.
	if t.want > len(dst) && len(dst) == t.list {
		if _, inPlay := t.keeper(dst, home); inPlay || (home >= 0 && home < t.n && !w.saw(uint16(home))) {
			dst = t.gather(&w, dst, t.want)
		}
	}
	within := len(dst)
	if len(dst) == 0 && w.nover == 0 {
		// Every ranked endpoint examined is at its hard cap: an overflow endpoint with room
		// takes the request rather than the caller shedding it.
		if o := t.overflow(-1, -1, work, &mv, home); o >= 0 {
			return Result{Order: append(dst, o), Spilled: true, Overflowed: true}
		}
		return Result{Order: dst, Spilled: true, AtLimit: true}
	}
	if within > 1 {
		t.leastWork(dst, work, &mv, home)
	}
	if len(dst) > t.list { // the choice weighed more endpoints than the list carries
		dst = dst[:t.list]
	}
	for _, c := range w.over[:w.nover] {
		if len(dst) == t.list {
			break
		}
		dst = append(dst, int(c))
	}
	seen := w.seen[:w.nseen]
	// The key's usual engine is its home when Pick examined it, else its first.
	usual := int(seen[0])
	if home >= 0 && home < t.n && slices.Contains(seen, uint16(home)) {
		usual = home
	}
	if len(t.eps) > t.n {
		if o := t.overflow(dst[0], usual, work, &mv, home); o >= 0 {
			if len(dst) > t.cfg.Fallbacks { // the list holds at most Fallbacks+1
				dst = dst[:t.cfg.Fallbacks]
			}
			dst = slices.Insert(dst, 0, o)
			return Result{Order: dst, Spilled: true, Overflowed: true}
		}
	}
	return Result{Order: dst, Spilled: dst[0] != usual}
}

// walk is one Pick's way through the key's buckets: where it stands, the endpoints it has
// examined, and those it found over their bound. gather resumes it.
type walk struct {
	b            uint32  // the key's first bucket
	total        float64 // work in flight on the ranked endpoints, with the request's
	probe, slot  int     // the next candidate to examine: bucket b+probe, its slot-th
	seen, over   [MaxExamined]uint16
	nseen, nover int
}

func (w *walk) saw(c uint16) bool { return slices.Contains(w.seen[:w.nseen], c) }

// gather walks on through the key's buckets, appending to dst the endpoints within their
// bound (bounded loads and the hard cap, Pick) until dst holds want or the walk has
// examined MaxExamined endpoints or probed its buckets.
func (t *Table) gather(w *walk, dst []int, want int) []int {
	for ; w.probe < t.maxProbe && w.nseen < t.maxExam && len(dst) < want; w.probe, w.slot = w.probe+1, 0 {
		base := int((w.b+uint32(w.probe))&t.mask) * t.k
		for ; w.slot < t.k; w.slot++ {
			c := t.slots[base+w.slot]
			if c == emptySlot {
				break
			}
			if w.saw(c) {
				continue
			}
			w.seen[w.nseen] = c
			w.nseen++
			in := t.ctr[c].inFlight()
			switch {
			case t.ctr[c].n.Load() >= t.limit[c]:
				// At the hard cap: never returned.
			case in < t.cfg.SpillFloor || float64(in) < t.bound[c]*w.total:
				// With work 1 per request: in < ⌈(1+ε)·share·total⌉ ⇔ in < (1+ε)·share·total.
				dst = append(dst, int(c))
			default:
				w.over[w.nover] = c
				w.nover++
			}
			if w.nseen == t.maxExam || len(dst) == want {
				w.slot++
				return dst
			}
		}
	}
	return dst
}

// overflow returns the overflow endpoint that should take the request instead of p, or -1:
// see Config.OverflowAt. usual is the endpoint that holds the key's context among the
// ranked ones; p is charged move unless it is usual, and always when the key's home is
// an overflow endpoint. An overflow endpoint other than the key's home is charged move, or
// the request's own work if that is more: it is outside the node's share, so it holds
// none of the prompt, where p may hold some of it through other keys that share its
// first blocks. An overflow endpoint past its own threshold still takes the request if
// it would hold less than p (the gate is p's: whether p would queue the request). When
// the key's home is an overflow endpoint with room for the prompt (backHome), the home
// alone is weighed against p whatever p's fill. One whose cache size is unknown takes
// none (a failed scrape would make it look empty). p is
// -1 when every ranked endpoint is at its hard cap: then any overflow endpoint below its
// own cap will do.
func (t *Table) overflow(p, usual int, work int64, move *charge, home int) int {
	cost := int64(math.MaxInt64)
	from, to := t.n, len(t.eps) // the overflow endpoints weighed
	if p >= 0 {
		if fill, ok := t.CacheFill(p, work); !ok || fill <= t.cfg.OverflowAt {
			if !move.backHome(t, home) {
				return -1 // the primary holds the request without queueing it (or its cache is unknown)
			}
			from, to = home, home+1 // the primary would not queue it: only the key's context may draw it away
		}
		cost = t.ctr[p].load() + work + move.full(t, p)
		if p != usual || home >= t.n {
			cost += move.at(t, p)
		}
	}
	best := -1
	for o := from; o < to; o++ {
		c := t.ctr[o]
		if c.n.Load() >= t.limit[o] || c.cache() <= 0 {
			continue
		}
		w := c.load() + work + move.full(t, o)
		if o != home {
			w += max(move.at(t, o), work)
		}
		if w < cost {
			best, cost = o, w
		}
	}
	return best
}

// backHome reports whether the key's home is an overflow endpoint whose KV cache, of a
// stated size, has room for the prompt (Ask.Prompt): the key's previous request
// overflowed there, so its context is cached there and on none of the ranked endpoints.
// overflow then weighs the home whatever the primary's fill, the primary charged the
// move: the key goes back to its context unless leaving it would still cost less.
func (c *charge) backHome(t *Table, home int) bool {
	return home >= t.n && home < len(t.eps) && c.prompt > 0 && t.ctr[home].cache() > 0 && c.roomFor(t, home)
}

// leastWork moves to the front of order (endpoints within their bound, in the key's
// order) the one that would hold the least work relative to its size after taking the
// request, charging move to all but the home (the key's first unless home is in order);
// see Pick and PickHome. A key's first that stands in for a home outside order (over its
// bound, at its cap, past the walk, or an overflow endpoint) and has no room for the
// prompt (Room) is charged move too: it holds the key's context only as every router's
// first choice for the key, and the request would wait there for room. An endpoint's
// size is its KV cache in tokens when every candidate states one (a cache's size tracks
// its engine's speed: Config.OverflowAt), else its share of the table.
func (t *Table) leastWork(order []int, work int64, move *charge, home int) {
	h, inPlay := t.keeper(order, home)
	best := h
	if inPlay {
		full := move.full(t, order[h])
		w0 := t.ctr[order[h]].load() + full
		if full > 0 && home >= 0 && order[h] != home {
			// The key's first stands in for a home the choice cannot send to, and has no
			// room for the prompt: it is charged the move like the others.
			w0 += move.at(t, order[h])
		}
		byCache := !slices.ContainsFunc(order, func(c int) bool { return t.ctr[c].cache() <= 0 })
		cost := float64(w0+work) / t.size(order[h], byCache)
		for j, c := range order {
			if j == h {
				continue
			}
			if v := float64(t.ctr[c].load()+work+move.at(t, c)+move.full(t, c)) / t.size(c, byCache); v < cost {
				best, cost = j, v
			}
		}
	}
	if best > 0 {
		c := order[best]
		copy(order[1:best+1], order[:best])
		order[0] = c
	}
}

// keeper is the index in order of the endpoint the least-work choice lets keep the key
// (the home when order holds it, else the key's first), and whether the choice is in
// play: that endpoint holds Config.SpillFloor or more.
func (t *Table) keeper(order []int, home int) (h int, inPlay bool) {
	h = max(slices.Index(order, home), 0)
	return h, t.ctr[order[h]].load() >= t.cfg.SpillFloor
}

// size is what the least-work choice divides endpoint c's work by: its KV cache in tokens
// (byCache), else its share of the table.
func (t *Table) size(c int, byCache bool) float64 {
	if byCache {
		return float64(t.ctr[c].cache())
	}
	return t.bound[c]
}

// Start records a request of the given work (as given to Pick) sent to endpoint i and
// returns the ticket that ends it.
func (t *Table) Start(i int, work int64) Ticket {
	work = max(work, 1)
	c, total := t.ctr[i], t.total
	if i >= t.n {
		total = t.over
	}
	c.n.Add(1)
	c.w.Add(work)
	total.n.Add(1)
	total.w.Add(work)
	return Ticket{c: c, total: total, work: work}
}

// Work is the work in flight on endpoint i, across all tables that share this table's
// Loads.
func (t *Table) Work(i int) int64 { return t.ctr[i].w.Load() }

// Limit is endpoint i's hard cap on requests in flight, and false when it has none.
func (t *Table) Limit(i int) (int64, bool) {
	return t.limit[i], t.limit[i] != math.MaxInt64
}

// Len is the number of ranked endpoints in the table (those with positive weight); the
// overflow endpoints follow them, at indices Len() to Len()+Overflows()-1.
func (t *Table) Len() int { return t.n }

// Overflows is the number of overflow endpoints in the table (none when the table has no
// ranked endpoint or Config.OverflowAt is 0).
func (t *Table) Overflows() int { return len(t.eps) - t.n }

// Endpoint returns endpoint i as given to NewTable.
func (t *Table) Endpoint(i int) Endpoint { return t.eps[i] }

// Lookup returns the index of the endpoint at addr, for mapping an observed upstream
// host back to the table.
func (t *Table) Lookup(addr string) (int, bool) {
	i, ok := t.index[addr]
	return i, ok
}

// InFlight is the number of requests in flight to endpoint i, across all tables that
// share this table's Loads.
func (t *Table) InFlight(i int) int64 { return t.ctr[i].n.Load() }

// Utilization is total in-flight over the sum of the endpoints' hard caps. ok is false
// when some endpoint has no cap (or the table is empty): then no capacity is known.
func (t *Table) Utilization() (u float64, ok bool) {
	if !t.allCapped {
		return 0, false
	}
	return float64(t.total.n.Load()) / float64(t.capTotal), true
}

// Config returns the configuration the table was built with.
func (t *Table) Config() Config { return t.cfg }

// AppendAddrs appends the addresses of order, comma-separated ("ip:port,ip:port"), to
// dst: the value of x-gateway-destination-endpoint and of the envoy.lb metadata. It
// allocates nothing when dst has room.
func (t *Table) AppendAddrs(dst []byte, order []int) []byte {
	for j, i := range order {
		if j > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, t.eps[i].Address...)
	}
	return dst
}

// CacheFill is the work endpoint i would hold with a request of the given work (its own
// in flight plus what others were last observed to hold; see Pick), as a fraction of its
// KV cache in tokens (Loads.SetKVWritten), and false when the cache's size is unknown.
// Config.OverflowAt compares the same fraction.
func (t *Table) CacheFill(i int, work int64) (float64, bool) {
	c := t.ctr[i]
	kc := c.cache()
	if kc <= 0 {
		return 0, false
	}
	return float64(c.load()+max(work, 1)) / float64(kc), true
}

// Waiting is the requests endpoint i was last observed to hold waiting (Loads.SetWaiting).
func (t *Table) Waiting(i int) int64 { return t.ctr[i].q.Load() }

// charge is the move cost Pick charges a candidate that is not the key's home: all of move,
// or, with prefixes and marks, the share of the prompt's marks the candidate lacks; and
// what it charges a candidate without room for the prompt (full).
type charge struct {
	move   int64
	prompt int64    // Ask.Prompt: 0 checks no room
	marks  []uint64 // Ask.Marks, which pins and prefixes weigh
	// pins and markTokens are Ask.Pins and Ask.MarkTokens (pins nil: the whole prompt needs
	// room).
	pins       *Pins
	markTokens int64
	common     int // Pins.Common: the marks pinned on every engine that holds running requests; -1 until asked
	// prefixes is Ask.Prefixes when a move is charged by the marks the candidate lacks
	// (nil: every candidate but the home is charged all of move).
	prefixes *Prefixes
}

// full is what the least-work choice and overflow charge endpoint i when its cache has no
// room for the prompt (roomFor): its cache's size in tokens, as work; 0 when it has room.
func (c *charge) full(t *Table, i int) int64 {
	if c.prompt == 0 || c.roomFor(t, i) {
		return 0
	}
	return t.ctr[i].cache()
}

// roomFor reports whether endpoint i's cache has room (Room) for the part of the prompt it
// does not already hold pinned: the prompt less the prefix this process's requests in
// flight there pin (Ask.Pins), or, on an engine whose running requests hold any of its
// cache, the prefix most of this process's requests in flight share (Pins.Common),
// whichever is longer; at least one token (vLLM computes a fully cached prompt's last
// token again). It looks up the pins only when the cheaper answers do not settle it.
func (c *charge) roomFor(t *Table, i int) bool {
	if whole := t.Room(i, c.prompt); whole || c.pins == nil {
		return whole
	}
	left := func(marks int) int64 { return max(c.prompt-int64(marks)*c.markTokens, min(c.prompt, 1)) }
	if t.ctr[i].h.Load() > 0 {
		if c.common < 0 {
			c.common = c.pins.Common(c.marks)
		}
		if t.Room(i, left(c.common)) {
			return true
		}
	}
	return t.Room(i, left(c.pins.Pinned(t, i, c.marks)))
}

// Room reports whether endpoint i's KV cache, as last observed (Observation), has room for
// tokens more beside what its running requests hold; true when its size is unknown.
func (t *Table) Room(i int, tokens int64) bool {
	c := t.ctr[i]
	kc := c.cache()
	return kc <= 0 || int64(c.h.Load())+tokens <= kc
}

// Freed is the tokens per second endpoint i's running requests free as they finish, as
// last observed (Observation.KVFreed): 0 when they finished none lately, -1 when the
// engine does not state its finishes.
func (t *Table) Freed(i int) int64 { return int64(t.ctr[i].f.Load()) }

// homeMove is the move cost that leaving home is worth for a prompt of the given tokens
// when the home has no room for it: the home would hold the request until its running
// requests free what the prompt lacks. It judges the home's room for the whole prompt,
// what its running requests pin of it included (charge.roomFor leaves that out), so a
// home keeps its key at the whole move cost only with room to spare: the answer needs
// blocks too, and the scrape is tens of milliseconds old. Judged on the unpinned part
// alone, homes a few blocks short kept their keys and queued requests other engines would
// have started (docs/results/README.md). What they hold counts what the requests waiting
// there will take first (Observation.KVWaiting). Past room by a quarter or more of it
// (waiting on most of them), staying saves at most the prompt's prefill elsewhere: at most
// the prompt. A little short of room, the home keeps move while its running requests, at
// the rate they free tokens as they finish (Freed), would free it within
// Config.RoomWait; past it, or when the home finished nothing lately, staying is worth no
// more than what the home is charged for having no room: at most a cache. A home that
// does not state its finishes keeps move; one with room, or whose cache's size is
// unknown, keeps it too.
func (t *Table) homeMove(home int, move, prompt int64) int64 {
	c := t.ctr[home]
	kc := c.cache()
	if kc <= 0 {
		return move
	}
	h := int64(c.h.Load())
	over := h + prompt - kc
	switch {
	case over <= 0:
		return move
	case 4*over >= h:
		return min(move, prompt)
	}
	freed := t.Freed(home)
	if t.cfg.RoomWait > 0 && freed >= 0 && float64(over) > float64(freed)*t.cfg.RoomWait.Seconds() {
		return min(move, kc)
	}
	return move
}

func (c *charge) at(t *Table, i int) int64 {
	if c.prefixes == nil {
		return c.move
	}
	held := c.prefixes.Held(t, i, c.marks)
	return c.move * int64(len(c.marks)-held) / int64(len(c.marks))
}
