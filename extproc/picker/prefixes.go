package picker

import (
	"sort"
	"sync/atomic"
)

// Prefixes remembers which prompt prefixes this process sent to which endpoint: per
// (prefix mark, endpoint), the endpoint's cache stamp when a request whose prompt holds that
// mark was last sent there. A mark is the chained hash of a prompt's bytes up to a fixed
// depth (extproc/request's Marks), so a mark stands for the whole prefix before it. It is
// what Table.PickFor charges a candidate for taking a key from its home: the move cost
// scaled by the share of the prompt's marks the candidate is not known to hold. Without it
// every engine but the home is charged as if it held none of the prompt, which on a
// workload whose prompts open with one long shared system prompt (every engine holds it)
// overstates a move several times over.
//
// The memory is the approximate prefix index llm-d's router keeps from its own routing
// decisions (docs/results/README.md cites it), with the homes' expiry: a mark counts as
// held until its engine has written more than its KV cache since the stamp (Loads.
// Observe), when LRU eviction has taken it. An engine whose writes or capacity are unknown
// keeps its marks. Each process keeps its own; the marks are not exchanged among a node's
// sidecars.
//
// It is a direct-mapped table of one 64-bit word per slot (the mark's upper 48 bits and the
// endpoint's number in its Loads, as Homes stores keys) and one stamp: a mark that collides
// with another is forgotten, and reads as not held. Place and Held take no locks and
// allocate nothing; a Held racing a Place of the same slot may pair the new mark with the
// old stamp, which errs for that one request.
type Prefixes struct {
	slots  []atomic.Uint64
	stamps []atomic.Int64
	mask   uint64
}

// NewPrefixes returns a memory of size slots (rounded up to a power of two, at least 1).
func NewPrefixes(size int) *Prefixes {
	n := 1
	for n < size {
		n <<= 1
	}
	return &Prefixes{slots: make([]atomic.Uint64, n), stamps: make([]atomic.Int64, n), mask: uint64(n - 1)}
}

// prefixSalt spreads one mark's slots over endpoints.
const prefixSalt = 0x9e3779b97f4a7c15

func (p *Prefixes) slot(mark uint64, id uint32) uint64 {
	return mix(mark>>homeIDBits^uint64(id)*prefixSalt) & p.mask
}

// Place records that a request whose prompt holds marks was sent to endpoint i of t.
func (p *Prefixes) Place(t *Table, i int, marks []uint64) {
	if p == nil || len(marks) == 0 {
		return
	}
	c := t.ctr[i]
	if c.id == 0 {
		return
	}
	stamp := c.stamp()
	for _, m := range marks {
		s := p.slot(m, c.id)
		p.stamps[s].Store(stamp)
		p.slots[s].Store(KeyBits(m) | uint64(c.id))
	}
}

// Held is how many of marks, from the first, endpoint i of t is known to hold: placed there
// and not turned over since. A prefix cache holds a prompt's blocks from the first on, so
// the count is found by bisection, as if a held mark's predecessors were held: about
// log2(len(marks)) lookups.
func (p *Prefixes) Held(t *Table, i int, marks []uint64) int {
	if p == nil || len(marks) == 0 {
		return 0
	}
	c := t.ctr[i]
	if c.id == 0 {
		return 0
	}
	return sort.Search(len(marks), func(j int) bool { return !p.holds(c, marks[j]) })
}

func (p *Prefixes) holds(c *counter, mark uint64) bool {
	s := p.slot(mark, c.id)
	if p.slots[s].Load() != KeyBits(mark)|uint64(c.id) {
		return false
	}
	return !c.turnedOver(p.stamps[s].Load())
}
