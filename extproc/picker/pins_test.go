package picker

import "testing"

// chain returns n marks of a prompt: the first shared of them equal to every other
// prompt's with the same shared, the rest the prompt's own (by seed).
func chain(n, shared int, seed uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		if i < shared {
			out[i] = mix(uint64(i) + 1)
		} else {
			out[i] = mix(seed<<32 | uint64(i))
		}
	}
	return out
}

// A request's marks count as pinned on its engine while it is in flight, and only there;
// a prompt that opens with the same marks finds them pinned up to where the two differ.
func TestPinsHoldARequestsMarksOnItsEngineUntilDone(t *testing.T) {
	loads := NewLoads()
	tb := mustTable(t, testConfig(), fleet(2, equal), loads)
	pins := NewPins(1 << 12)
	running := chain(20, 8, 1)
	tk := tb.Start(0, 1_000)
	pins.Pin(tb, 0, running, &tk)
	if got := pins.Pinned(tb, 0, running); got != 20 {
		t.Errorf("the request's own marks on its engine: %d pinned, want 20", got)
	}
	if got := pins.Pinned(tb, 0, chain(30, 8, 2)); got != 8 {
		t.Errorf("a prompt sharing the first 8 marks: %d pinned, want 8", got)
	}
	if got := pins.Pinned(tb, 1, running); got != 0 {
		t.Errorf("another engine: %d pinned, want 0", got)
	}
	tk.Done()
	if got := pins.Pinned(tb, 0, running); got != 0 {
		t.Errorf("after the request ended: %d pinned, want 0", got)
	}
	var none Ticket // a ticket Pin never saw
	none.Done()
	var nilPins *Pins
	nilPins.Pin(tb, 0, running, &tk)
	if nilPins.Pinned(tb, 0, running) != 0 || nilPins.Common(running) != 0 {
		t.Errorf("a nil Pins pins something")
	}
}

// A mark whose slot another mark holds is not counted, and ends the marks the request
// pins: what is counted stays a prefix of its marks, another request's release leaves it,
// and its own leaves the table empty.
func TestPinsStopAtASlotTakenByAnotherMark(t *testing.T) {
	loads := NewLoads()
	tb := mustTable(t, testConfig(), fleet(1, equal), loads)
	pins := NewPins(4) // ten words wanted for five marks (each counted for its engine and for any)
	marksA, marksB := chain(5, 0, 1), chain(5, 0, 2)
	a, b := tb.Start(0, 1), tb.Start(0, 1)
	pins.Pin(tb, 0, marksA, &a)
	n := len(a.pinned)
	if n == 0 || n >= 5 {
		t.Fatalf("five marks in four slots: %d counted, want some and not all", n)
	}
	if got := pins.Pinned(tb, 0, marksA); got != n {
		t.Fatalf("pinned %d, want the %d Pin counted", got, n)
	}
	pins.Pin(tb, 0, marksB, &b)
	b.Done()
	if got := pins.Pinned(tb, 0, marksA); got != n {
		t.Errorf("another request's release changed the first's pins: %d, want %d", got, n)
	}
	a.Done()
	for i := range pins.words {
		if w := pins.words[i].Load(); w != 0 {
			t.Errorf("after both ended, slot %d holds %#x", i, w)
		}
	}
	if pins.active.Load() != 0 {
		t.Errorf("after both ended, %d requests counted active", pins.active.Load())
	}
}

// Common is the prefix at least half of the requests in flight, and two or more of them,
// share on whatever engine: a system prompt, not one conversation's context.
func TestPinsCommonIsWhatMostRequestsInFlightShare(t *testing.T) {
	loads := NewLoads()
	tb := mustTable(t, testConfig(), fleet(4, equal), loads)
	pins := NewPins(1 << 12)
	var tks []Ticket
	start := func(i int, marks []uint64) {
		tk := tb.Start(i, 1)
		pins.Pin(tb, i, marks, &tk)
		tks = append(tks, tk)
	}
	start(0, chain(12, 6, 1))
	if got := pins.Common(chain(12, 6, 1)); got != 0 {
		t.Errorf("one request in flight: common %d, want 0 (its own context is not common)", got)
	}
	start(1, chain(10, 6, 2))
	start(2, chain(40, 6, 3))
	start(3, chain(9, 3, 4)) // shares only the first 3
	if got := pins.Common(chain(50, 6, 5)); got != 6 {
		t.Errorf("three of four requests open with 6 shared marks: common %d, want 6", got)
	}
	if got := pins.Common(chain(50, 0, 5)); got != 0 {
		t.Errorf("a prompt sharing nothing: common %d, want 0", got)
	}
	tks[0].Done()
	tks[1].Done()
	if got := pins.Common(chain(50, 6, 5)); got != 3 {
		t.Errorf("two requests in flight sharing 3 marks: common %d, want 3", got)
	}
}

// A candidate needs room only for the part of the prompt not already pinned there: by this
// process's requests on it, or, when it runs requests, by the prefix most requests share.
func TestRoomLeavesOutWhatTheEnginePins(t *testing.T) {
	tb, loads, a, b, key := roomFleet(t)
	pins := NewPins(1 << 12)
	const markTokens = 1_000
	own := tb.Start(b, 40_000)
	defer own.Done()
	pins.Pin(tb, b, chain(40, 30, 1), &own)
	ta := tb.Start(a, 60_000)
	defer ta.Done()
	observeKV(loads, tb, a, 50_000, 100_000) // room for 50k
	observeKV(loads, tb, b, 70_000, 100_000) // room for 30k
	ask := Ask{Key: key, Work: 1_000, Home: -1, Prompt: 45_000, Marks: chain(45, 30, 2)}
	if got := tb.PickFor(&ask, nil).Order[0]; got != a {
		t.Fatalf("without pins: primary %d, want %d, the only one with room for 45k", got, a)
	}
	ask.Pins, ask.MarkTokens = pins, markTokens
	if got := tb.PickFor(&ask, nil).Order[0]; got != b {
		t.Errorf("with b running a request that holds the prompt's first 30k: primary %d, want %d (15k to place in its 30k of room, and less work than a)", got, b)
	}
	// A prompt that shares no prefix with what b runs needs all of its room.
	ask.Marks = chain(45, 0, 3)
	if got := tb.PickFor(&ask, nil).Order[0]; got != a {
		t.Errorf("a prompt b pins nothing of: primary %d, want %d", got, a)
	}
}

// An engine that runs requests (any router's) holds the prefix most of this process's
// requests in flight share, though none of them runs there; an engine that runs nothing
// holds none of it.
func TestRoomTakesTheCommonPrefixAsHeldWhereRequestsRun(t *testing.T) {
	tb, loads, a, b, key := roomFleet(t)
	pins := NewPins(1 << 12)
	for s := range uint64(2) { // two requests on a that open with 30 shared marks
		tk := tb.Start(a, 10_000)
		defer tk.Done()
		pins.Pin(tb, a, chain(40, 30, s+1), &tk)
	}
	observeKV(loads, tb, a, 70_000, 100_000) // room for 30k
	observeKV(loads, tb, b, 70_000, 100_000) // room for 30k; none of this process's requests
	ask := Ask{Key: key, Work: 1_000, Home: -1, Prompt: 45_000, Marks: chain(45, 30, 9), Pins: pins, MarkTokens: 1_000}
	if got := tb.PickFor(&ask, nil).Order[0]; got != b {
		t.Errorf("b runs requests and the prompt opens with the common 30k: primary %d, want %d (15k to place in 30k, less work)", got, b)
	}
	observeKV(loads, tb, a, 20_000, 100_000)
	observeKV(loads, tb, b, 0, 100_000)
	if got := pins.Common(ask.Marks); got != 28 {
		t.Fatalf("common %d, want 28 (30 shared marks, sampled at 28 and 32)", got)
	}
	ask.Prompt, ask.Marks = 101_000, chain(101, 30, 9) // past b's whole cache unless it held the prefix
	if got := tb.PickFor(&ask, nil).Order[0]; got != a {
		t.Errorf("b runs nothing, so holds none of the prefix: primary %d, want %d, which has room for the 71k it lacks", got, a)
	}
}

// The sampled depths are every one of the first 8, then four per doubling: a prompt's
// pinned prefix is known to within a quarter of its length, at a few dozen counts for the
// longest prompt the parser hashes.
func TestPinsSampleFourDepthsPerDoubling(t *testing.T) {
	want := []int{1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80}
	for e, d := range want {
		if got := pinDepth(e); got != d {
			t.Errorf("sample %d: depth %d, want %d", e, got, d)
		}
	}
	prev := 0
	for e := range 60 {
		d := pinDepth(e)
		if d <= prev || d-prev > max(1, d/4) {
			t.Fatalf("sample %d at depth %d after %d: want increasing, by at most a quarter", e, d, prev)
		}
		prev = d
	}
	for _, c := range []struct{ marks, samples int }{{0, 0}, {1, 1}, {8, 8}, {9, 8}, {31, 15}, {100, 22}, {256, 28}} {
		if got := pinSamples(c.marks); got != c.samples {
			t.Errorf("%d marks: %d samples, want %d", c.marks, got, c.samples)
		}
	}
}
