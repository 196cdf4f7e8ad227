package picker

import (
	"slices"
	"testing"
)

func TestHomesRememberTheLastEndpoint(t *testing.T) {
	loads := NewLoads()
	tb := mustTable(t, testConfig(), fleet(4, equal), loads)
	h := NewHomes(1 << 10)
	const key = 0xfeedface12345678
	if got := h.Lookup(key, tb); got != -1 {
		t.Fatalf("an unseen key has home %d, want -1", got)
	}
	h.Remember(key, tb, 2)
	if got := h.Lookup(key, tb); got != 2 {
		t.Fatalf("home %d, want 2", got)
	}
	// A key in the same slot with other upper bits evicts it and is not mistaken for it.
	var other uint64
	for k := uint64(1); ; k++ {
		if cand := k << 48; mix(cand>>homeIDBits)&h.mask == mix(key>>homeIDBits)&h.mask && cand>>homeIDBits != key>>homeIDBits {
			other = cand
			break
		}
	}
	if got := h.Lookup(other, tb); got != -1 {
		t.Errorf("a key sharing the slot reads home %d, want -1", got)
	}
	h.Remember(other, tb, 1)
	if got := h.Lookup(key, tb); got != -1 {
		t.Errorf("after a collision the evicted key reads home %d, want -1", got)
	}
	// An endpoint that left the table is no home, even with the same Loads.
	h.Remember(key, tb, 3)
	gone := tb.Endpoint(3).Address
	var rest []Endpoint
	for _, ep := range fleet(4, equal) {
		if ep.Address != gone {
			rest = append(rest, ep)
		}
	}
	if got := h.Lookup(key, mustTable(t, testConfig(), rest, loads)); got != -1 {
		t.Errorf("the home left the table; Lookup = %d, want -1", got)
	}
	// A table rebuilt over the same endpoints finds the home again (ids live in the Loads).
	again := mustTable(t, testConfig(), fleet(4, equal), loads)
	if got := h.Lookup(key, again); got != 3 {
		t.Errorf("in a rebuilt table the home is %d, want 3", got)
	}
	var nilHomes *Homes
	if got := nilHomes.Lookup(key, tb); got != -1 {
		t.Errorf("a nil Homes has home %d", got)
	}
	nilHomes.Remember(key, tb, 0) // must not panic
	if n := testing.AllocsPerRun(100, func() { h.Remember(key, tb, 1); _ = h.Lookup(key, tb) }); n != 0 {
		t.Errorf("Remember and Lookup allocate %v times", n)
	}
}

// Remember journals only changed homes, Drain hands each over once, oldest first, and
// Adopt (a peer's placement) sets a home without journaling it.
func TestHomesJournalWhatChangedForPeers(t *testing.T) {
	loads := NewLoads()
	tb := mustTable(t, testConfig(), fleet(4, equal), loads)
	h := NewHomes(1 << 10)
	type placed struct {
		key uint64
		id  uint32
	}
	drain := func(cursor uint64) ([]placed, uint64) {
		var out []placed
		next := h.Drain(cursor, func(key uint64, id uint32, _ int64) { out = append(out, placed{key, id}) })
		return out, next
	}
	const a, b = 0x1111_2222_3333_4444, 0x5555_6666_7777_8888
	h.Remember(a, tb, 1)
	h.Remember(a, tb, 1) // unchanged: not journaled again
	h.Remember(b, tb, 2)
	h.Remember(a, tb, 3) // moved: journaled
	got, cursor := drain(0)
	want := []placed{{KeyBits(a), tb.ctr[1].id}, {KeyBits(b), tb.ctr[2].id}, {KeyBits(a), tb.ctr[3].id}}
	if !slices.Equal(got, want) {
		t.Fatalf("drained %v, want %v", got, want)
	}
	if got, _ := drain(cursor); len(got) != 0 {
		t.Errorf("a second drain gave %v, want nothing", got)
	}
	// A peer's placement: the key's home, ready for Lookup, and not sent back.
	const c = 0x9999_aaaa_bbbb_cccc
	h.Adopt(c, loads.ID(tb.Endpoint(2).Address), 0)
	if got := h.Lookup(c, tb); got != 2 {
		t.Errorf("adopted home %d, want 2", got)
	}
	if got, _ := drain(cursor); len(got) != 0 {
		t.Errorf("an adopted placement was journaled: %v", got)
	}
	if addr := loads.Address(tb.ctr[2].id); addr != tb.Endpoint(2).Address {
		t.Errorf("Address(id) = %q, want %q", addr, tb.Endpoint(2).Address)
	}
	// A drain that fell behind by more than the journal holds gets the newest only.
	for i := range uint64(journalSize + 10) {
		h.Remember(i<<20, tb, int(i%2))
	}
	got, _ = drain(cursor)
	if len(got) != journalSize || got[len(got)-1].key != KeyBits(uint64(journalSize+9)<<20) {
		t.Errorf("after an overflow: %d drained, last %x; want the newest %d", len(got), got[len(got)-1].key, journalSize)
	}
	if n := testing.AllocsPerRun(100, func() { h.Remember(a, tb, 1); h.Remember(a, tb, 2) }); n != 0 {
		t.Errorf("Remember with journaling allocates %v times", n)
	}
}

// The home takes the key's first endpoint's place in the least-work choice: below the
// floor it keeps the key, past it the others are charged the move against it.
func TestPickHomeKeepsAConversationWhereItWent(t *testing.T) {
	cfg := testConfig()
	cfg.Epsilon = 10 // bounded loads out of the way
	cfg.SpillFloor = 4_000
	const key = 0xc0ffee
	loads := NewLoads()
	tb := mustTable(t, cfg, fleet(4, equal), loads)
	order := tb.Pick(key, 1_000, 1_000, nil).Order
	home := order[1]

	if r := tb.PickHome(key, 1_000, 5_000, home, nil); r.Order[0] != home || r.Spilled {
		t.Errorf("an idle home: primary %d (spilled %v), want the home %d, not spilled (order %v)", r.Order[0], r.Spilled, home, r.Order)
	}
	if r := tb.PickHome(key, 1_000, 5_000, -1, nil); r.Order[0] != order[0] {
		t.Errorf("no home: primary %d, want the key's first %d", r.Order[0], order[0])
	}
	// The home busy by less than a move's worth more than the key's first: it stays.
	tk := tb.Start(home, 8_000)
	if r := tb.PickHome(key, 1_000, 10_000, home, nil); r.Order[0] != home {
		t.Errorf("home holds 8k, a move costs 10k: primary %d, want the home %d", r.Order[0], home)
	}
	// By more than a move's worth: the request leaves it.
	if r := tb.PickHome(key, 1_000, 2_000, home, nil); r.Order[0] == home || !r.Spilled {
		t.Errorf("home holds 8k, a move costs 2k: primary %d (spilled %v), want another engine, spilled", r.Order[0], r.Spilled)
	}
	tk.Done()
	// A home that is not among the key's candidates is ignored.
	if r := tb.PickHome(key, 1_000, 1_000, order[len(order)-1]+100, nil); r.Order[0] != order[0] {
		t.Errorf("a home outside the table: primary %d, want the key's first %d", r.Order[0], order[0])
	}
}

// A home expires once its engine has written more into its KV cache than the cache holds
// since the placement (LRU has evicted the key's context), or when the engine's writes go
// back by more than that (it restarted, empty); an engine that states no capacity keeps
// its placements. Peers' placements (Adopt) expire the same way.
func TestHomesExpireWhenTheCacheTurnsOver(t *testing.T) {
	loads := NewLoads()
	tb := mustTable(t, testConfig(), fleet(4, equal), loads)
	h := NewHomes(1 << 10)
	addr := tb.Endpoint(1).Address
	const key, peerKey, capacity = 0x1234567800000000, 0x8765432100000000, 100_000
	loads.SetKVWritten(addr, 5_000_000, capacity)
	h.Remember(key, tb, 1)
	loads.SetKVWritten(addr, 5_000_000+capacity/2, capacity)
	id, stamp := loads.Stamp(addr) // a peer placed its key half a cache later
	h.Adopt(peerKey, id, stamp)
	// A cache's worth of writes since the placement, the placed prompt's own among them
	// (the stamp does not add them: most of a returning prompt is a cache hit): it holds.
	loads.SetKVWritten(addr, 5_000_000+capacity, capacity)
	if got := h.Lookup(key, tb); got != 1 {
		t.Errorf("after exactly a cache's worth of writes: home %d, want 1", got)
	}
	loads.SetKVWritten(addr, 5_000_000+capacity+1, capacity)
	if got := h.Lookup(key, tb); got != -1 {
		t.Errorf("the cache turned over: home %d, want -1 (no home)", got)
	}
	if got := h.Lookup(peerKey, tb); got != 1 {
		t.Errorf("a peer's placement stamped half a cache later: home %d, want 1", got)
	}
	loads.SetKVWritten(addr, 5_000_000+capacity/2+capacity+1, capacity)
	if got := h.Lookup(peerKey, tb); got != -1 {
		t.Errorf("the peer's placement after its cache turned over: home %d, want -1", got)
	}
	if n := h.Expired(); n != 2 {
		t.Errorf("Expired = %d, want 2 (this placement, then the peer's)", n)
	}
	// A restart: the counters start again from 0.
	h.Remember(key, tb, 1)
	loads.SetKVWritten(addr, 7, capacity)
	if got := h.Lookup(key, tb); got != -1 {
		t.Errorf("the engine restarted: home %d, want -1", got)
	}
	// Unknown capacity: stamps are not taken, and a placement keeps its home.
	loads.SetKVWritten(addr, 0, 0)
	h.Remember(key, tb, 1)
	loads.SetKVWritten(addr, 1e12, capacity)
	if got := h.Lookup(key, tb); got != 1 {
		t.Errorf("placed while the capacity was unknown: home %d, want 1", got)
	}
	if n := testing.AllocsPerRun(100, func() { h.Remember(key, tb, 1); _ = h.Lookup(key, tb) }); n != 0 {
		t.Errorf("Remember and Lookup with stamps allocate %v times", n)
	}
}
