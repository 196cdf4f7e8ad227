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
// Each process keeps its own, and the sidecars of one node share what they place:
// Remember journals every key whose home changed, Drain hands the journal to the
// exchange (extproc/decide's AppendPlacements), and Adopt stores a peer's placement
// without journaling it again, so a conversation whose turns arrive at different
// sidecars finds the engine its previous turn went to. A key no sidecar has placed yet,
// or whose placement has not arrived, follows the key's order, which every sidecar
// shares (see Table.PickHome).
type Homes struct {
	slots []atomic.Uint64
	mask  uint64
	// journal is a ring of the words Remember changed; next counts every word ever
	// journaled (the ring holds the last len(journal)).
	journal []atomic.Uint64
	jmask   uint64
	next    atomic.Uint64
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
	return &Homes{slots: make([]atomic.Uint64, n), mask: uint64(n - 1),
		journal: make([]atomic.Uint64, journalSize), jmask: journalSize - 1}
}

const homeIDBits = 16

// KeyBits is the part of a key Homes keeps, and so the part a placement carries: its
// upper 48 bits (the lower 16 are zero).
func KeyBits(key uint64) uint64 { return key >> homeIDBits << homeIDBits }

func (h *Homes) slot(key uint64) *atomic.Uint64 { return &h.slots[mix(key>>homeIDBits)&h.mask] }

// Remember records that key was sent to endpoint i of t, and journals it when the key's
// home changed.
func (h *Homes) Remember(key uint64, t *Table, i int) {
	id := t.ctr[i].id
	if h == nil || id == 0 {
		return
	}
	w := KeyBits(key) | uint64(id)
	if h.slot(key).Swap(w) != w {
		h.journal[(h.next.Add(1)-1)&h.jmask].Store(w)
	}
}

// Adopt records that a peer sent key to the address that l numbers id (Loads.ID),
// without journaling it: a placement travels one hop.
func (h *Homes) Adopt(key uint64, id uint32) {
	if h == nil || id == 0 || id > maxID {
		return
	}
	h.slot(key).Store(KeyBits(key) | uint64(id))
}

// Drain calls fn with the key bits and endpoint number of every home journaled since
// cursor (0 at first), oldest first, and returns the cursor to pass next time. When more
// changed than the journal holds, the oldest are skipped. Call it from one goroutine.
func (h *Homes) Drain(cursor uint64, fn func(key uint64, id uint32)) uint64 {
	end := h.next.Load()
	if end-cursor > uint64(len(h.journal)) {
		cursor = end - uint64(len(h.journal))
	}
	for ; cursor < end; cursor++ {
		w := h.journal[cursor&h.jmask].Load()
		fn(KeyBits(w), uint32(w&(1<<homeIDBits-1)))
	}
	return end
}

// Lookup returns the index in t of the endpoint key was last sent to, or -1.
func (h *Homes) Lookup(key uint64, t *Table) int {
	if h == nil {
		return -1
	}
	v := h.slot(key).Load()
	if v == 0 || v>>homeIDBits != key>>homeIDBits {
		return -1
	}
	if id := v & (1<<homeIDBits - 1); id < uint64(len(t.byID)) {
		return int(t.byID[id]) - 1 // -1 when the endpoint is not in t
	}
	return -1
}
