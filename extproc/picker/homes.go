package picker

import "sync/atomic"

// maxID is the most addresses one Loads numbers for Homes (16 bits of an entry).
const maxID = 1<<16 - 1

// Homes remembers, per key, the endpoint a key was last sent to: the engine that holds
// the key's newest context in its prefix cache. Pick with a home charges the least-work
// choice's move cost against the home instead of the key's first endpoint, so a
// conversation the choice moved stays where its context went, instead of coming back to
// an engine whose cache holds only its older turns.
//
// It is a direct-mapped table of one 64-bit word per slot: the key's upper 48 bits (which
// also pick the slot) and the endpoint's number in its Loads. A key that collides with
// another, or whose endpoint left the table, has no home and ranks as without one. Lookup
// and Remember take no locks and allocate nothing.
//
// A home expires when its engine's cache has turned over since the placement: each slot
// also keeps a stamp, the tokens the engine had written into its KV cache (Loads.
// SetKVWritten, from its vLLM counters) when the key was placed there, and Lookup reports
// no home once the engine has written more than its cache holds since. A cache
// evicts the least recently used prefix first, so by then the key's context is gone, and
// holding the key to that engine would cost its move price for nothing: the key is placed
// as a new one, by load. An engine whose writes or capacity are unknown keeps its
// placements. A Lookup that races a Remember of the same slot may pair the new home with
// the old stamp; it errs for that one request.
//
// Each process keeps its own, and the sidecars of one node share what they place:
// Remember journals every key whose home changed, Drain hands the journal to the
// exchange (extproc/decide's AppendPlacements), and Adopt stores a peer's placement
// without journaling it again, so a conversation whose turns arrive at different
// sidecars finds the engine its previous turn went to. A key no sidecar has placed yet,
// or whose placement has not arrived, follows the key's order, which every sidecar
// shares (see Table.PickHome).
type Homes struct {
	slots  []atomic.Uint64
	stamps []atomic.Int64 // per slot: the cache stamp of its placement (counter.stamp)
	mask   uint64
	// journal is a ring of the words Remember changed; next counts every word ever
	// journaled (the ring holds the last len(journal)).
	journal []atomic.Uint64
	jmask   uint64
	next    atomic.Uint64
	// expired counts Lookups that found a home whose cache had turned over.
	expired atomic.Int64
}

// journalSize is how many changed homes Homes keeps for Drain: at 8 bytes a word, 64 KiB;
// a drain that falls further behind than this skips the oldest.
const journalSize = 1 << 13

// NewHomes returns a memory of size slots (rounded up to a power of two, at least 1).
func NewHomes(size int) *Homes {
	n := 1
	for n < size {
		n <<= 1
	}
	return &Homes{slots: make([]atomic.Uint64, n), stamps: make([]atomic.Int64, n), mask: uint64(n - 1),
		journal: make([]atomic.Uint64, journalSize), jmask: journalSize - 1}
}

const homeIDBits = 16

// KeyBits is the part of a key Homes keeps, and so the part a placement carries: its
// upper 48 bits (the lower 16 are zero).
func KeyBits(key uint64) uint64 { return key >> homeIDBits << homeIDBits }

func (h *Homes) slot(key uint64) uint64 { return mix(key>>homeIDBits) & h.mask }

// restampShare: a home that did not change is journaled again once its stamp has moved
// by more than 1/restampShare of its engine's cache since the stamp this process last
// had for it, so that the node's other sidecars, which hear only the journal, do not
// expire a conversation whose cache this sidecar's newer requests kept warm; their view
// of a key's age lags by at most that share.
const restampShare = 8

// Remember records that key was sent to endpoint i of t, and journals it when the key's
// home changed or its stamp moved on (restampShare).
func (h *Homes) Remember(key uint64, t *Table, i int) {
	if h == nil {
		return
	}
	c := t.ctr[i]
	if c.id == 0 {
		return
	}
	s, w, stamp := h.slot(key), KeyBits(key)|uint64(c.id), c.stamp()
	was := h.stamps[s].Swap(stamp)
	if h.slots[s].Swap(w) != w || stamp > 0 && (was == 0 || stamp-was > c.cache()/restampShare) {
		h.journal[(h.next.Add(1)-1)&h.jmask].Store(w)
	}
}

// Adopt records that a peer sent key to the address that its Loads numbers id, with the
// placement's cache stamp (the peer's, from Drain: the sidecars of a node read the same
// engine counters; or, when the peer had none, Loads.Stamp's), without journaling it: a
// placement travels one hop.
func (h *Homes) Adopt(key uint64, id uint32, stamp int64) {
	if h == nil || id == 0 || id > maxID {
		return
	}
	s := h.slot(key)
	h.stamps[s].Store(stamp)
	h.slots[s].Store(KeyBits(key) | uint64(id))
}

// Drain calls fn with the key bits, endpoint number and cache stamp of every home
// journaled since cursor (0 at first), oldest first, and returns the cursor to pass next
// time. The stamp is the slot's while it still holds the journaled home, else 0 (the key
// moved again, journaled later, or another key took the slot). When more changed than
// the journal holds, the oldest are skipped. Call it from one goroutine.
func (h *Homes) Drain(cursor uint64, fn func(key uint64, id uint32, stamp int64)) uint64 {
	end := h.next.Load()
	if end-cursor > uint64(len(h.journal)) {
		cursor = end - uint64(len(h.journal))
	}
	for ; cursor < end; cursor++ {
		w := h.journal[cursor&h.jmask].Load()
		s, stamp := h.slot(w), int64(0)
		if h.slots[s].Load() == w {
			stamp = h.stamps[s].Load()
		}
		fn(KeyBits(w), uint32(w&(1<<homeIDBits-1)), stamp)
	}
	return end
}

// Lookup returns the index in t of the endpoint key was last sent to, or -1 when it has
// none, or when that endpoint's cache has turned over since.
func (h *Homes) Lookup(key uint64, t *Table) int {
	if h == nil {
		return -1
	}
	s := h.slot(key)
	v := h.slots[s].Load()
	if v == 0 || v>>homeIDBits != key>>homeIDBits {
		return -1
	}
	id := v & (1<<homeIDBits - 1)
	if id >= uint64(len(t.byID)) {
		return -1
	}
	i := int(t.byID[id]) - 1 // -1 when the endpoint is not in t
	if i >= 0 && t.ctr[i].turnedOver(h.stamps[s].Load()) {
		h.expired.Add(1)
		return -1
	}
	return i
}

// Expired is how many Lookups found a home whose engine's cache had turned over since
// the placement, and so reported none.
func (h *Homes) Expired() int64 {
	if h == nil {
		return 0
	}
	return h.expired.Load()
}
