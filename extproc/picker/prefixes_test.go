package picker

import "testing"

// Held counts the leading marks an endpoint was sent, by bisection; a mark expires with its
// engine's cache (as a home does), and an endpoint that was never sent a mark holds none.
func TestPrefixesHoldWhatWasSentUntilTheCacheTurnsOver(t *testing.T) {
	loads := NewLoads()
	tb := mustTable(t, testConfig(), fleet(4, equal), loads)
	p := NewPrefixes(1 << 12)
	shared := []uint64{0x1111 << 32, 0x2222 << 32, 0x3333 << 32}
	prompt := append(append([]uint64{}, shared...), 0x4444<<32, 0x5555<<32) // the shared part, then its own
	other := append(append([]uint64{}, shared...), 0x6666<<32)
	addr := tb.Endpoint(1).Address
	const capacity = 100_000
	loads.SetKVWritten(addr, 1_000_000, capacity)
	p.Place(tb, 1, other) // another conversation with the same opening went to engine 1
	p.Place(tb, 2, prompt)
	if got := p.Held(tb, 2, prompt); got != 5 {
		t.Errorf("engine 2 was sent the whole prompt: holds %d of 5 marks", got)
	}
	if got := p.Held(tb, 1, prompt); got != 3 {
		t.Errorf("engine 1 was sent the shared opening: holds %d of 5 marks, want 3", got)
	}
	if got := p.Held(tb, 0, prompt); got != 0 {
		t.Errorf("engine 0 was sent nothing: holds %d", got)
	}
	if got := (*Prefixes)(nil).Held(tb, 2, prompt); got != 0 {
		t.Errorf("no memory: holds %d", got)
	}
	loads.SetKVWritten(addr, 1_000_000+capacity+1, capacity)
	if got := p.Held(tb, 1, prompt); got != 0 {
		t.Errorf("engine 1's cache turned over since: holds %d, want 0", got)
	}
}

// PickFor charges a candidate the move cost for the share of the prompt it lacks: a key
// whose busy home holds the whole prompt leaves it for an engine that holds most of it at
// a cost PickHome (all of the move for every other engine) would not pay.
func TestPickForChargesWhatTheCandidateLacks(t *testing.T) {
	cfg := testConfig()
	cfg.Epsilon = 10 // bounded loads out of the way
	cfg.SpillFloor = 1_000
	const key = 0xabcdef
	loads := NewLoads()
	tb := mustTable(t, cfg, fleet(4, equal), loads)
	order := tb.Pick(key, 1_000, 0, nil).Order
	home, next := order[0], order[1]
	p := NewPrefixes(1 << 12)
	marks := []uint64{1 << 40, 2 << 40, 3 << 40, 4 << 40}
	p.Place(tb, home, marks)
	p.Place(tb, next, marks[:3]) // the opening three quarters, through another key
	tk := tb.Start(home, 20_000)
	defer tk.Done()
	const move = 40_000 // more than the home's 20k of work: PickHome keeps the key home
	if r := tb.PickHome(key, 1_000, move, home, nil); r.Order[0] != home {
		t.Fatalf("PickHome: primary %d, want the home %d (a move costs %d, the home holds 20k)", r.Order[0], home, move)
	}
	if r := tb.PickFor(&Ask{Key: key, Work: 1_000, Move: move, Home: home, Prefixes: p, Marks: marks}, nil); r.Order[0] != next || !r.Spilled {
		t.Errorf("PickFor: primary %d (spilled %v), want %d, which lacks a quarter of the prompt (a 10k move)", r.Order[0], r.Spilled, next)
	}
	if r := tb.PickFor(&Ask{Key: key, Work: 1_000, Move: move, Home: home, Prefixes: p, Marks: marks[3:]}, nil); r.Order[0] != home {
		t.Errorf("a prompt of the last mark only, which %d lacks: primary %d, want the home %d", next, r.Order[0], home)
	}
}
