package picker

import (
	"sort"
	"sync/atomic"
)

// Pins counts, per (prefix mark, endpoint), the requests in flight from this process whose
// prompts hold the mark (at sampled depths: pinDepth): the prompt prefixes its requests
// keep pinned in each engine's KV cache while they run. A request that shares a prefix
// with one running on an engine needs KV blocks there only for the rest of its prompt
// (vLLM's prefix cache references a block already held instead of allocating it again:
// vllm/v1/core/kv_cache_manager.py, get_computed_blocks and allocate_slots), so the room a
// candidate has for a prompt (Ask.Pins; charge.roomFor) is judged on the part of the prompt
// that is not pinned there. Agentic sessions that open with one long system prompt hold it
// once per engine however many of them run there; judged whole, each looked to need a
// fifth of an A100's cache more than it does, and engines that could start it at once were
// passed over for engines that made it wait (docs/results/README.md).
//
// What it counts per endpoint is a lower bound: only this process's requests (the
// engine's other requests may pin more), and a mark it could not count (its slot taken by
// another mark) ends the run of marks a request pins. A request's pins are released with
// its Ticket. It also counts every mark over all endpoints, so that a prefix most of its
// requests share (Common: a system prompt) is taken as pinned on every engine that holds
// running requests, from whichever router.
//
// It is a table of one 64-bit word per slot, a 48-bit tag of the mark and the endpoint's
// number in its Loads, and a 16-bit count; each (mark, endpoint) has two slots, and its
// count is the sum of the two words that carry its tag (two choices make a slot taken by
// another mark rare). Pin, Pinned and Ticket.Done take no locks; Pin allocates the copy
// of the marks its ticket keeps.
type Pins struct {
	words []atomic.Uint64
	mask  uint64
	// active is the requests in flight that pin a mark.
	active atomic.Int64
}

// anyEndpoint is the number Pins counts every endpoint's pins under too, apart from the
// endpoints' own numbers (at most maxID).
const anyEndpoint = maxID + 1

// NewPins returns a table of size slots (rounded up to a power of two, at least 1).
func NewPins(size int) *Pins {
	n := 1
	for n < size {
		n <<= 1
	}
	return &Pins{words: make([]atomic.Uint64, n), mask: uint64(n - 1)}
}

// pinSalt spreads one mark's slots over endpoints (as prefixSalt does for Prefixes).
const pinSalt = 0xc2b2ae3d27d4eb4f

const (
	pinCountBits = 16
	pinCountMax  = 1<<pinCountBits - 1
)

// at is the two slots and the tag of mark on the endpoint numbered id; a tag is never 0,
// so an empty word (count 0) matches no mark.
func (p *Pins) at(mark uint64, id uint32) (slots [2]uint64, tag uint64) {
	h := mix(mark ^ uint64(id)*pinSalt)
	return [2]uint64{h & p.mask, mix(h) & p.mask}, h>>pinCountBits | 1
}

// Pins counts a prompt's marks at sampled depths, not every one: each of the first 8, then
// every 2nd up to 16, every 4th up to 32, and so on (pinDepth), so a prompt of n marks
// costs about 8 + 4 log2(n/8) counts and the pinned prefix is known to within a quarter
// of its length (a 1 MiB prompt, 256 marks: 28 counts). Every request samples the same
// depths, so what a prompt finds pinned is still a prefix of its samples.

// pinDepth is the depth, in marks, of sample e (from 0): 1 to 8, then 10, 12, 14, 16, 20,
// 24, 28, 32, 40, ...: four samples per doubling past 8.
func pinDepth(e int) int {
	if e < 8 {
		return e + 1
	}
	k, j := (e-8)/4, (e-8)%4
	return 8<<k + (j+1)<<(k+1)
}

// pinSamples is how many samples a prompt of n marks has: those no deeper than n.
func pinSamples(n int) int {
	e := 0
	for pinDepth(e) <= n {
		e++
	}
	return e
}

// Pin counts marks at the sampled depths (pinDepth), from the first, as pinned on
// endpoint i of t by the request whose ticket tk is (from t.Start(i, ...)), and hands them
// to the ticket, whose Done releases them. It stops at the first mark it cannot count
// (both its slots taken by other marks, or a count at its cap): the samples it counted are
// a prefix of the prompt's. A nil Pins, or an endpoint without a number, pins nothing.
func (p *Pins) Pin(t *Table, i int, marks []uint64, tk *Ticket) {
	if p == nil || len(marks) == 0 || tk.c == nil {
		return
	}
	id := t.ctr[i].id
	if id == 0 {
		return
	}
	samples := pinSamples(len(marks))
	var counted []uint64
	for e := range samples {
		m := marks[pinDepth(e)-1]
		if !p.inc(m, id) {
			break
		}
		if !p.inc(m, anyEndpoint) {
			p.dec(m, id)
			break
		}
		if counted == nil {
			counted = make([]uint64, 0, samples)
		}
		counted = append(counted, m)
	}
	if len(counted) > 0 {
		p.active.Add(1)
		tk.pins, tk.pinID, tk.pinned = p, id, counted
	}
}

// inc counts mark on the endpoint numbered id in the first of its slots that is empty or
// carries its tag (below the cap), and reports whether one was.
func (p *Pins) inc(mark uint64, id uint32) bool {
	slots, tag := p.at(mark, id)
	for _, s := range slots {
		for {
			w := p.words[s].Load()
			var next uint64
			switch {
			case w == 0:
				next = tag<<pinCountBits | 1
			case w>>pinCountBits == tag && w&pinCountMax < pinCountMax:
				next = w + 1
			}
			if next == 0 {
				break // taken by another mark, or at the cap: the other slot
			}
			if p.words[s].CompareAndSwap(w, next) {
				return true
			}
		}
	}
	return false
}

// release uncounts marks (a prefix Pin counted) on the endpoint numbered id.
func (p *Pins) release(id uint32, marks []uint64) {
	for _, m := range marks {
		p.dec(m, id)
		p.dec(m, anyEndpoint)
	}
	p.active.Add(-1)
}

// dec uncounts mark on the endpoint numbered id from one of its slots that carries its tag
// (the sum of the two is what inc counted).
func (p *Pins) dec(mark uint64, id uint32) {
	slots, tag := p.at(mark, id)
	for _, s := range slots {
		for {
			w := p.words[s].Load()
			if w>>pinCountBits != tag {
				break // not here: the other slot
			}
			next := w - 1
			if next&pinCountMax == 0 {
				next = 0
			}
			if p.words[s].CompareAndSwap(w, next) {
				return
			}
		}
	}
}

// count is how many requests in flight pin mark on the endpoint numbered id.
func (p *Pins) count(mark uint64, id uint32) int64 {
	slots, tag := p.at(mark, id)
	var n int64
	for _, s := range slots {
		if w := p.words[s].Load(); w>>pinCountBits == tag {
			n += int64(w & pinCountMax)
		}
	}
	return n
}

// Common is how many of marks, from the first, at least half of this process's requests
// in flight that pin a mark hold, and at least two of them, on whatever engine (to the
// depth of the deepest such sample): a prefix most prompts open with (a system prompt),
// which an engine running requests of the same clients pins too, whichever router sent
// them. Two, so that one conversation's own context never counts as common.
func (p *Pins) Common(marks []uint64) int {
	if p == nil || len(marks) == 0 {
		return 0
	}
	active := p.active.Load()
	if active <= 0 {
		return 0
	}
	return p.deepest(marks, func(m uint64) bool {
		n := p.count(m, anyEndpoint)
		return n >= 2 && 2*n >= active
	})
}

// Pinned is how many of marks, from the first, requests of this process in flight on
// endpoint i of t are known to hold: the depth of the deepest sample they pin. The samples
// a request pins are a prefix of its prompt's, and a mark stands for the prompt up to it,
// so the pinned samples of a prompt are a prefix of its samples too: the count is found
// by bisection, about log2 of the samples' number in lookups.
func (p *Pins) Pinned(t *Table, i int, marks []uint64) int {
	if p == nil || len(marks) == 0 {
		return 0
	}
	id := t.ctr[i].id
	if id == 0 {
		return 0
	}
	return p.deepest(marks, func(m uint64) bool { return p.count(m, id) > 0 })
}

// deepest is the depth, in marks, of the last of marks' samples (pinDepth) for which held
// holds, the first for which it does not found by bisection (the samples held are a
// prefix of them); 0 when the first does not.
func (p *Pins) deepest(marks []uint64, held func(uint64) bool) int {
	n := sort.Search(pinSamples(len(marks)), func(e int) bool { return !held(marks[pinDepth(e)-1]) })
	if n == 0 {
		return 0
	}
	return pinDepth(n - 1)
}
