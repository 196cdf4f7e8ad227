package engine

import (
	"reflect"
	"testing"
)

func TestKVEventsFollowTheCache(t *testing.T) {
	// The eviction scenario of TestEvictionOrder, with the events it must publish.
	cfg := testConfig()
	cfg.BlockTokens, cfg.KVBlocks = 10, 5
	e := newEngine(t, cfg)
	var got []KVEvent
	e.SetKVEvents(func(ev KVEvent) { got = append(got, ev) })
	now := drain(t, e, 0)
	for i, blocks := range [][]uint64{{1, 2, 3}, {1, 7, 8}, {20, 21, 22}} {
		enqueue(t, e, now, &Request{ID: uint64(i), PromptTokens: 30, OutputTokens: 2, Blocks: blocks})
		now = drain(t, e, now)
	}
	st := func(h uint64) KVEvent { return KVEvent{Kind: BlockStored, Hash: h} }
	rm := func(h uint64) KVEvent { return KVEvent{Kind: BlockRemoved, Hash: h} }
	want := []KVEvent{st(1), st(2), st(3), rm(3), st(7), st(8), rm(2), rm(8), rm(7), st(20), st(21), st(22)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("events\n got %v\nwant %v", got, want)
	}
	for _, ev := range got {
		if ev.Kind == BlockStored && !e.Cached(ev.Hash) && ev.Hash >= 20 {
			t.Errorf("stored %d but not cached", ev.Hash)
		}
	}
	e.SetKVEvents(nil)
	enqueue(t, e, now, &Request{ID: 9, PromptTokens: 30, OutputTokens: 2, Blocks: []uint64{30, 31, 32}})
	drain(t, e, now)
	if len(got) != len(want) {
		t.Errorf("events after SetKVEvents(nil): %v", got[len(want):])
	}
}

func TestCalibrations(t *testing.T) {
	a, err := Calibrated("a100-40gb", 16)
	if err != nil || a != A100Llama8B(16) {
		t.Fatalf("a100-40gb: %+v, %v", a, err)
	}
	h, err := Calibrated("h100-80gb", 16)
	if err != nil || h != H100Llama8B(16) || h.Validate() != nil {
		t.Fatalf("h100-80gb: %+v, %v", h, err)
	}
	// The datasheet ratios: 989/312 TFLOPS, 3.35/1.555 TB/s, 80/40 GB of memory.
	ratio := func(x, y float64) float64 { return x / y }
	for _, c := range []struct {
		what        string
		got, lo, hi float64
	}{
		{"prefill", ratio(h.PrefillTokensPerSec, a.PrefillTokensPerSec), 3.1, 3.25},
		{"context read", ratio(h.ContextTokensPerSec, a.ContextTokensPerSec), 2.1, 2.2},
		{"step base", ratio(a.StepBase.Seconds(), h.StepBase.Seconds()), 2.1, 2.2},
		{"KV blocks", ratio(float64(h.KVBlocks), float64(a.KVBlocks)), 2.8, 2.95},
	} {
		if c.got < c.lo || c.got > c.hi {
			t.Errorf("%s: H100/A100 ratio %.3f outside [%v, %v]", c.what, c.got, c.lo, c.hi)
		}
	}
	if _, err := Calibrated("tpu", 16); err == nil {
		t.Error("unknown GPU accepted")
	}
}
