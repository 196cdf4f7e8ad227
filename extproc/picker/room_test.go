package picker

import (
	"testing"
	"time"
)

// observeKV records a scrape of endpoint i: a cache of capacity tokens whose running
// requests hold held of them, and no work of other routers.
func observeKV(loads *Loads, tb *Table, i int, held, capacity int64) {
	observeKVFreed(loads, tb, i, held, capacity, 0)
}

// observeKVFreed is observeKV with the tokens per second the running requests free.
func observeKVFreed(loads *Loads, tb *Table, i int, held, capacity, freed int64) {
	loads.Observe(tb.Endpoint(i).Address, Observation{KVCapacity: capacity, KVHeld: held, KVFreed: freed},
		func(int64, int64, int64) int64 { return 0 })
}

// Room is what the running requests leave of the cache, as last scraped; an engine whose
// cache's size is unknown (never scraped, or forgotten) has room.
func TestRoomIsWhatTheRunningRequestsLeave(t *testing.T) {
	loads := NewLoads()
	tb := mustTable(t, testConfig(), fleet(2, equal), loads)
	if !tb.Room(0, 1<<40) {
		t.Errorf("an engine never scraped has no room")
	}
	observeKV(loads, tb, 0, 60_000, 100_000)
	if !tb.Room(0, 40_000) || tb.Room(0, 40_001) {
		t.Errorf("60k held of 100k: room for 40k %v (want true), for 40,001 %v (want false)",
			tb.Room(0, 40_000), tb.Room(0, 40_001))
	}
	observeKV(loads, tb, 0, 250_000, 100_000)
	if !tb.Room(0, 0) || tb.Room(0, 1) {
		t.Errorf("a scrape holding more than the cache counts as full: room for 0 %v, for 1 %v", tb.Room(0, 0), tb.Room(0, 1))
	}
	addr := tb.Endpoint(0).Address
	loads.SetKVWritten(addr, 0, 0) // the failed scrape's forget
	if !tb.Room(0, 1<<40) {
		t.Errorf("a forgotten cache still bounds the room")
	}
	loads.SetKVWritten(addr, 0, 100_000) // the size known again, nothing held observed since
	if !tb.Room(0, 100_000) {
		t.Errorf("the held tokens outlived the forget: no room for a cache's worth")
	}
}

// The requests waiting at an engine take their blocks before a new one (vLLM admits in
// order): the room is what the running requests and the waiting ones leave, and the
// waiting ones count for at most what the running ones leave.
func TestRoomIsWhatTheWaitingRequestsLeaveToo(t *testing.T) {
	loads := NewLoads()
	tb := mustTable(t, testConfig(), fleet(2, equal), loads)
	observe := func(held, waiting int64) {
		loads.Observe(tb.Endpoint(0).Address, Observation{KVCapacity: 100_000, KVHeld: held, KVWaiting: waiting, Waiting: 1},
			func(int64, int64, int64) int64 { return 0 })
	}
	observe(40_000, 20_000)
	if !tb.Room(0, 40_000) || tb.Room(0, 40_001) {
		t.Errorf("40k held and 20k waiting of 100k: room for 40k %v (want true), for 40,001 %v (want false)",
			tb.Room(0, 40_000), tb.Room(0, 40_001))
	}
	observe(40_000, 0)
	if !tb.Room(0, 60_000) {
		t.Errorf("the waiting requests outlived a scrape that found none: no room for the 60k left")
	}
	observe(90_000, 50_000)
	if !tb.Room(0, 0) || tb.Room(0, 1) {
		t.Errorf("held and waiting past the cache count as full: room for 0 %v, for 1 %v", tb.Room(0, 0), tb.Room(0, 1))
	}
	loads.Observe(tb.Endpoint(0).Address, Observation{KVHeld: 10_000, KVWaiting: 10_000, Waiting: 1},
		func(int64, int64, int64) int64 { return 0 })
	if !tb.Room(0, 1<<40) {
		t.Errorf("with the cache's size unknown, the waiting requests bound the room")
	}
}

// roomFleet is two endpoints of equal weight with bounded loads out of the way and a
// 100,000-token cache each, and a key: the key's first endpoint a and second b.
func roomFleet(t *testing.T) (*Table, *Loads, int, int, uint64) {
	t.Helper()
	cfg := testConfig()
	cfg.Epsilon = 10
	cfg.SpillFloor = 1_000
	loads := NewLoads()
	tb := mustTable(t, cfg, fleet(2, equal), loads)
	const key = 0xabcdef
	order := tb.Pick(key, 1_000, 0, nil).Order
	a, b := order[0], order[1]
	observeKV(loads, tb, a, 0, 100_000)
	observeKV(loads, tb, b, 0, 100_000)
	return tb, loads, a, b, key
}

// A new key goes where the least work is, unless that engine's cache has no room for its
// prompt: it would wait there until running requests finish, and is charged a cache of
// work for it.
func TestACandidateWithoutRoomIsChargedACache(t *testing.T) {
	tb, loads, a, b, key := roomFleet(t)
	ta, tb2 := tb.Start(a, 10_000), tb.Start(b, 30_000)
	defer ta.Done()
	defer tb2.Done()
	observeKV(loads, tb, a, 80_000, 100_000)
	if got := tb.PickFor(&Ask{Key: key, Work: 1_000, Home: -1}, nil).Order[0]; got != a {
		t.Fatalf("without a prompt to place: primary %d, want %d, which holds less work", got, a)
	}
	if got := tb.PickFor(&Ask{Key: key, Work: 1_000, Home: -1, Prompt: 30_000}, nil).Order[0]; got != b {
		t.Errorf("a 30k prompt: primary %d, want %d (%d holds 80k of its 100k cache)", got, b, a)
	}
	if got := tb.PickFor(&Ask{Key: key, Work: 1_000, Home: -1, Prompt: 20_000}, nil).Order[0]; got != a {
		t.Errorf("a 20k prompt, which fits: primary %d, want %d", got, a)
	}
}

// A home that would have to free a quarter or more of what its running requests hold
// before the prompt fits keeps its key for a move cost of at most the prompt; one a
// little short of room keeps the whole move cost (and is charged its cache).
func TestAHomeFarFromRoomKeepsItsKeyForThePrompt(t *testing.T) {
	tb, loads, a, b, key := roomFleet(t)
	ta, tb2 := tb.Start(a, 50_000), tb.Start(b, 100_000)
	defer ta.Done()
	defer tb2.Done()
	const prompt = 40_000
	ask := Ask{Key: key, Work: 1_000, Move: 16 * prompt, Home: a, Prompt: prompt}
	observeKV(loads, tb, a, 70_000, 100_000) // 10k short of room, under a quarter of 70k
	if got := tb.PickFor(&ask, nil).Order[0]; got != a {
		t.Errorf("a home 10k short of room: primary %d, want the home %d (a move costs 640k)", got, a)
	}
	observeKV(loads, tb, a, 90_000, 100_000) // 30k short: a third of what it holds
	if got := tb.PickFor(&ask, nil).Order[0]; got != b {
		t.Errorf("a home 30k short of room: primary %d, want %d (a move costs the 40k prompt, the home 100k more)", got, b)
	}
	ask.Prompt = 0
	if got := tb.PickFor(&ask, nil).Order[0]; got != a {
		t.Errorf("with no prompt stated: primary %d, want the home %d", got, a)
	}
}

// A home a little short of room keeps its key's move cost while its running requests, at
// the rate they free tokens, would leave room within Config.RoomWait; past it, or when it
// has finished nothing lately, leaving costs at most a cache's worth of work, and the
// least-work choice weighs the two as loads.
func TestAHomeThatWouldWaitPastRoomWaitKeepsItsKeyForACache(t *testing.T) {
	tb, loads, a, b, key := roomFleet(t)
	if tb.cfg.RoomWait != 10*time.Second {
		t.Fatalf("the test config's RoomWait is %s, want the shipped 10s", tb.cfg.RoomWait)
	}
	ta, tb2 := tb.Start(a, 50_000), tb.Start(b, 10_000)
	defer ta.Done()
	defer tb2.Done()
	const prompt = 20_000
	ask := Ask{Key: key, Work: 1_000, Move: 16 * prompt, Home: a, Prompt: prompt}
	// 85k held of 100k: 5k short of room, under a quarter of what it holds. The home
	// costs 50k + 100k (no room); b 10k + the move.
	for _, c := range []struct {
		freed int64
		want  int
		why   string
	}{
		{10_000, a, "frees the 5k in half a second: a move costs 320k"},
		{1_000, a, "frees the 5k in 5 s, within room_wait"},
		{400, b, "frees the 5k in 12.5 s: a move costs at most the 100k cache"},
		{0, b, "has finished nothing lately"},
		{-1, a, "does not state its finishes, so is not judged,"},
	} {
		observeKVFreed(loads, tb, a, 85_000, 100_000, c.freed)
		if got := tb.PickFor(&ask, nil).Order[0]; got != c.want {
			t.Errorf("a home that %s: primary %d, want %d", c.why, got, c.want)
		}
	}
	cfg := tb.cfg
	cfg.RoomWait = 0
	off := mustTable(t, cfg, fleet(2, equal), loads)
	if got := off.PickFor(&ask, nil).Order[0]; got != a {
		t.Errorf("with room_wait 0 a home that has finished nothing keeps its move cost: primary %d, want %d", got, a)
	}
}

// When the key's home is not among the candidates (here at its hard cap), the key's first
// keeps the key without a move charge, as it does for a key without a home, only while it
// has room for the prompt: without room it is charged the move like the others, and the
// prompt goes to the engine with room.
func TestAFirstStandingInForAnAbsentHomeKeepsTheKeyOnlyWithRoom(t *testing.T) {
	cfg := testConfig()
	cfg.Epsilon = 10
	cfg.SpillFloor = 1_000
	const key = 0xfeed
	eps := fleet(3, equal)
	order := mustTable(t, cfg, eps, NewLoads()).Pick(key, 1_000, 0, nil).Order
	a, b, home := order[0], order[1], order[2]
	eps[home].MaxInFlight = 1 // fleet's addresses are in the table's order
	loads := NewLoads()
	tb := mustTable(t, cfg, eps, loads)
	for _, i := range []int{a, b, home} {
		observeKV(loads, tb, i, 0, 100_000)
	}
	th, ta, tbb := tb.Start(home, 1_000), tb.Start(a, 20_000), tb.Start(b, 10_000)
	defer th.Done()
	defer ta.Done()
	defer tbb.Done()
	const prompt = 30_000
	ask := Ask{Key: key, Work: 1_000, Move: 16 * prompt, Home: home, Prompt: prompt}

	observeKV(loads, tb, a, 50_000, 100_000) // room for the prompt
	if got := tb.PickFor(&ask, nil).Order[0]; got != a {
		t.Errorf("the key's first with room, its home at its cap: primary %d, want the first %d (a move costs 480k)", got, a)
	}
	observeKV(loads, tb, a, 80_000, 100_000) // 10k short of room
	if got := tb.PickFor(&ask, nil).Order[0]; got != b {
		t.Errorf("the key's first without room, its home at its cap: primary %d, want %d, which has room", got, b)
	}
	ask.Home = -1
	if got := tb.PickFor(&ask, nil).Order[0]; got != a {
		t.Errorf("without room but with no home known: primary %d, want the key's first %d", got, a)
	}
}
