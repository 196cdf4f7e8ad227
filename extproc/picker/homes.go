package picker

import "sync/atomic"

// maxID is the most addresses one Loads numbers for Homes (16 bits of an entry).
const maxID = 1<<16 - 1

// Homes remembers, per key, the endpoint this process last sent the key to: the engine
// that holds the key's newest context in its prefix cache. Pick with a home charges the
// least-work choice's move cost against the home instead of the key's first endpoint, so
// a conversation the choice moved stays where its context went, instead of coming back to
// an engine whose cache holds only its older turns.
//
// It is a direct-mapped table of one 64-bit word per slot: the key's upper 48 bits and the
// endpoint's number in its Loads. A key that collides with another, or whose endpoint left
// the table, has no home and ranks as without one. Lookup and Remember take no locks and
// allocate nothing. Each process keeps its own, so two sidecars may remember different
// homes for one key; a key a process has not sent yet follows the key's order, which
// every sidecar shares (see Table.PickHome).
type Homes struct {
	slots []atomic.Uint64
	mask  uint64
}

// NewHomes returns a memory of size slots (rounded up to a power of two, at least 1).
func NewHomes(size int) *Homes {
	n := 1
	for n < size {
		n <<= 1
	}
	return &Homes{slots: make([]atomic.Uint64, n), mask: uint64(n - 1)}
}

const homeIDBits = 16

func (h *Homes) slot(key uint64) *atomic.Uint64 { return &h.slots[mix(key)&h.mask] }

// Remember records that key was sent to endpoint i of t.
func (h *Homes) Remember(key uint64, t *Table, i int) {
	id := t.ctr[i].id
	if h == nil || id == 0 {
		return
	}
	h.slot(key).Store(key>>homeIDBits<<homeIDBits | uint64(id))
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
