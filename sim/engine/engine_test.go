package engine

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// testConfig has round numbers so expected times can be computed by hand.
func testConfig() Config {
	return Config{
		MaxNumSeqs:          4,
		MaxBatchedTokens:    4096,
		BlockTokens:         16,
		KVBlocks:            1000,
		PrefillTokensPerSec: 1000,
		ContextTokensPerSec: 1e6,
		StepBase:            10 * time.Millisecond,
		DecodeSeqCost:       time.Millisecond,
	}
}

func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

// chain returns n block hashes starting at first.
func chain(first uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = first + uint64(i)
	}
	return out
}

// drain runs steps back to back from now until the engine is idle and returns the time.
func drain(t *testing.T, e *Engine, now time.Duration) time.Duration {
	t.Helper()
	for i := 0; i < 100000; i++ {
		d, ok := e.StartStep(now)
		if !ok {
			return now
		}
		now += d
		e.EndStep(now, nil)
	}
	t.Fatal("engine did not drain")
	return now
}

func secs(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

func near(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond }

func enqueue(t *testing.T, e *Engine, now time.Duration, r *Request) *Request {
	t.Helper()
	if err := e.Enqueue(now, r); err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	return r
}

func TestTTFTColdVersusCachedPrompt(t *testing.T) {
	e := newEngine(t, testConfig())
	blocks := chain(100, 64) // 1024 tokens
	cold := enqueue(t, e, 0, &Request{ID: 1, PromptTokens: 1024, OutputTokens: 1, Blocks: blocks})
	end := drain(t, e, 0)
	// One step: 10 ms base + 1024 tokens at 1000 tokens/s.
	if want := secs(0.010 + 1.024); !near(cold.FirstToken, want) || cold.CachedTokens != 0 {
		t.Fatalf("cold: TTFT %v cached %d, want %v and 0", cold.FirstToken, cold.CachedTokens, want)
	}
	warm := enqueue(t, e, end, &Request{ID: 2, PromptTokens: 1024, OutputTokens: 1, Blocks: blocks})
	drain(t, e, end)
	// Every block hits, but the last token is recomputed: 10 ms + 1 token at 1000 tokens/s.
	if got, want := warm.FirstToken-warm.Arrived, secs(0.010+0.001); !near(got, want) || warm.CachedTokens != 1023 {
		t.Fatalf("warm: TTFT %v cached %d, want %v and 1023", got, warm.CachedTokens, want)
	}
	half := enqueue(t, e, end+time.Hour, &Request{ID: 3, PromptTokens: 1024, OutputTokens: 1,
		Blocks: append(chain(100, 32), chain(5000, 32)...)})
	drain(t, e, end+time.Hour)
	// The first 32 blocks (512 tokens) hit; the rest diverge.
	if got, want := half.FirstToken-half.Arrived, secs(0.010+0.512); !near(got, want) || half.CachedTokens != 512 {
		t.Fatalf("half: TTFT %v cached %d, want %v and 512", got, half.CachedTokens, want)
	}
	s := e.Stats()
	if s.PrefixQueries != 3*1024 || s.PrefixHits != 1023+512 {
		t.Fatalf("prefix counters %d/%d, want %d/%d", s.PrefixHits, s.PrefixQueries, 1023+512, 3*1024)
	}
}

func TestQueueingWhenBatchIsFull(t *testing.T) {
	// Two requests of 100 prompt tokens and 3 output tokens arrive together.
	// Prefill step: 10 ms + 100 ms per 100 tokens. Decode step with one request:
	// 10 ms + 1 ms + context/1e6 s.
	decode := func(context int) float64 { return 0.010 + 0.001 + float64(context)/1e6 }
	aFirst := 0.010 + 0.100
	aDone := aFirst + decode(101) + decode(102)
	tests := []struct {
		name         string
		maxNumSeqs   int
		wantTTFT     [2]float64
		wantWaitingB bool
	}{
		{name: "room for both", maxNumSeqs: 2, wantTTFT: [2]float64{0.010 + 0.200, 0.010 + 0.200}},
		{name: "max_num_seqs 1", maxNumSeqs: 1, wantTTFT: [2]float64{aFirst, aDone + 0.010 + 0.100}, wantWaitingB: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MaxNumSeqs = tc.maxNumSeqs
			e := newEngine(t, cfg)
			a := enqueue(t, e, 0, &Request{ID: 1, PromptTokens: 100, OutputTokens: 3})
			b := enqueue(t, e, 0, &Request{ID: 2, PromptTokens: 100, OutputTokens: 3})
			d, ok := e.StartStep(0)
			if !ok {
				t.Fatal("no step started")
			}
			if got := e.Waiting() == 1; got != tc.wantWaitingB {
				t.Fatalf("after first admission Waiting()=%d, running=%d", e.Waiting(), e.Running())
			}
			e.EndStep(d, nil)
			drain(t, e, d)
			for i, r := range []*Request{a, b} {
				if want := secs(tc.wantTTFT[i]); !near(r.FirstToken, want) {
					t.Errorf("request %d TTFT %v, want %v", r.ID, r.FirstToken, want)
				}
				if r.Generated != 3 || r.Finished == 0 {
					t.Errorf("request %d generated %d, finished at %v", r.ID, r.Generated, r.Finished)
				}
			}
		})
	}
}

func TestDecodeStepGrowsWithBatch(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 8
	step := func(batch int) time.Duration {
		e := newEngine(t, cfg)
		for i := range batch {
			enqueue(t, e, 0, &Request{ID: uint64(i), PromptTokens: 10, OutputTokens: 5})
		}
		d, _ := e.StartStep(0) // the prefill step
		e.EndStep(d, nil)
		d, _ = e.StartStep(d) // the first decode step
		return d
	}
	one, eight := step(1), step(8)
	// 10 ms + n x (1 ms + 11 context tokens / 1e6).
	if want := secs(0.010 + 0.001 + 11e-6); !near(one, want) {
		t.Fatalf("batch 1 step %v, want %v", one, want)
	}
	if want := secs(0.010 + 8*(0.001+11e-6)); !near(eight, want) {
		t.Fatalf("batch 8 step %v, want %v", eight, want)
	}
}

func TestChunkedPrefillSharesTheBudget(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBatchedTokens = 1000
	e := newEngine(t, cfg)
	r := enqueue(t, e, 0, &Request{ID: 1, PromptTokens: 2500, OutputTokens: 2})
	end := drain(t, e, 0)
	// Three prefill steps (1000, 1000, 500 tokens), then one decode step.
	wantFirst := 3*0.010 + 2.5
	if !near(r.FirstToken, secs(wantFirst)) {
		t.Fatalf("TTFT %v, want %v", r.FirstToken, secs(wantFirst))
	}
	if want := secs(wantFirst + 0.010 + 0.001 + 2501e-6); !near(end, want) {
		t.Fatalf("finished at %v, want %v", end, want)
	}
}

func TestSimultaneousPromptsDoNotHitUncomputedBlocks(t *testing.T) {
	e := newEngine(t, testConfig())
	blocks := chain(1, 4)
	for i := range 2 {
		enqueue(t, e, 0, &Request{ID: uint64(i), PromptTokens: 64, OutputTokens: 1, Blocks: blocks})
	}
	drain(t, e, 0)
	if s := e.Stats(); s.PrefixHits != 0 || s.Finished != 2 {
		t.Fatalf("hits %d finished %d, want 0 and 2", s.PrefixHits, s.Finished)
	}
	if !e.Cached(1) || !e.Cached(4) || e.KVUsage() != 0 {
		t.Fatalf("blocks not cached once, or usage %v left after both finished", e.KVUsage())
	}
}

func TestEvictionOrder(t *testing.T) {
	// Blocks of 10 tokens, room for 5. Each request's prompt has 3 blocks and its output
	// needs one more.
	cfg := testConfig()
	cfg.BlockTokens, cfg.KVBlocks = 10, 5
	run := func(e *Engine, now time.Duration, id uint64, blocks []uint64) time.Duration {
		enqueue(t, e, now, &Request{ID: id, PromptTokens: 30, OutputTokens: 2, Blocks: blocks})
		return drain(t, e, now)
	}
	e := newEngine(t, cfg)
	now := run(e, 0, 1, []uint64{1, 2, 3})
	now = run(e, now, 2, []uint64{1, 7, 8}) // shares block 1, evicts A's tail (3) to fit
	tests := []struct {
		hash uint64
		want bool
	}{{1, true}, {2, true}, {3, false}, {7, true}, {8, true}}
	for _, tc := range tests {
		if got := e.Cached(tc.hash); got != tc.want {
			t.Errorf("after 2 requests: Cached(%d)=%v, want %v", tc.hash, got, tc.want)
		}
	}
	// The LRU list, oldest first, is now 2, 8, 7, 1. Four fresh blocks evict 2, 8 and 7.
	run(e, now, 3, []uint64{20, 21, 22})
	for _, tc := range []struct {
		hash uint64
		want bool
	}{{1, true}, {2, false}, {7, false}, {8, false}, {20, true}} {
		if got := e.Cached(tc.hash); got != tc.want {
			t.Errorf("after 3 requests: Cached(%d)=%v, want %v", tc.hash, got, tc.want)
		}
	}
}

func TestAdmissionWaitsForKVSpace(t *testing.T) {
	cfg := testConfig()
	cfg.BlockTokens, cfg.KVBlocks = 10, 5
	e := newEngine(t, cfg)
	a := enqueue(t, e, 0, &Request{ID: 1, PromptTokens: 30, OutputTokens: 5})
	b := enqueue(t, e, 0, &Request{ID: 2, PromptTokens: 20, OutputTokens: 5})
	d, _ := e.StartStep(0)
	if e.Running() != 1 || e.Waiting() != 1 {
		t.Fatalf("running %d waiting %d, want 1 and 1 (4 + 3 blocks exceed 5)", e.Running(), e.Waiting())
	}
	if got := e.KVUsage(); got != 4.0/5 {
		t.Fatalf("KV usage %v, want 0.8", got)
	}
	e.EndStep(d, nil)
	drain(t, e, d)
	if b.FirstToken <= a.Finished {
		t.Fatalf("b started before a freed its blocks: b TTFT %v, a finished %v", b.FirstToken, a.Finished)
	}
	err := e.Enqueue(0, &Request{ID: 3, PromptTokens: 50, OutputTokens: 1})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Enqueue of a 6-block request into 5 blocks: %v, want ErrTooLarge", err)
	}
}

// Admits says whether a request would start without waiting: not behind a waiting
// request, not into a full batch, and not without room for its KV blocks, where its
// cached prefix counts.
func TestAdmitsIsWhatAdmissionWouldDoNow(t *testing.T) {
	cfg := testConfig()
	cfg.BlockTokens, cfg.KVBlocks, cfg.MaxNumSeqs = 10, 8, 2
	e := newEngine(t, cfg)
	small := func(id uint64) *Request {
		return &Request{ID: id, PromptTokens: 20, OutputTokens: 5, Blocks: chain(100*id, 2)}
	}
	if !e.Admits(small(1)) {
		t.Fatal("an idle engine does not admit a 3-block request")
	}
	a := enqueue(t, e, 0, &Request{ID: 1, PromptTokens: 40, OutputTokens: 5, Blocks: chain(100, 4)})
	if e.Admits(small(2)) {
		t.Error("admits a request behind a waiting one")
	}
	d, _ := e.StartStep(0) // a runs, holding 5 of 8 blocks
	e.EndStep(d, nil)
	if !e.Admits(small(2)) {
		t.Error("does not admit 3 blocks beside 5 of 8")
	}
	if e.Admits(&Request{ID: 3, PromptTokens: 30, OutputTokens: 5}) {
		t.Error("admits 4 blocks beside 5 of 8")
	}
	// The same 4 blocks, 3 of them a's own prompt's blocks, which it holds: 1 new block.
	if !e.Admits(&Request{ID: 4, PromptTokens: 30, OutputTokens: 5, Blocks: chain(100, 3)}) {
		t.Error("does not count the cached prefix a running request holds")
	}
	enqueue(t, e, d, small(5))
	d2, _ := e.StartStep(d) // the batch is full: a and 5
	e.EndStep(d+d2, nil)
	if e.Running() != 2 || e.Admits(small(6)) {
		t.Errorf("running %d (want 2): admits a request into a full batch", e.Running())
	}
	drain(t, e, d+d2)
	if a.Finished == 0 || !e.Admits(&Request{ID: 7, PromptTokens: 70, OutputTokens: 5}) {
		t.Error("a drained engine does not admit a request of its whole cache")
	}
}

func TestAbortFreesBlocks(t *testing.T) {
	e := newEngine(t, testConfig())
	r := enqueue(t, e, 0, &Request{ID: 1, PromptTokens: 160, OutputTokens: 100, Blocks: chain(1, 10)})
	d, _ := e.StartStep(0)
	if !e.Abort(r) {
		t.Fatal("Abort of a running request returned false")
	}
	e.EndStep(d, nil)
	if e.KVUsage() != 0 || e.Busy() || e.Cached(1) {
		t.Fatalf("after abort: usage %v busy %v cached %v", e.KVUsage(), e.Busy(), e.Cached(1))
	}
}

func TestSlowdownScalesSteps(t *testing.T) {
	e := newEngine(t, testConfig())
	if err := e.SetSlowdown(5); err != nil {
		t.Fatal(err)
	}
	enqueue(t, e, 0, &Request{ID: 1, PromptTokens: 90, OutputTokens: 1})
	d, _ := e.StartStep(0)
	if want := secs(5 * (0.010 + 0.090)); !near(d, want) {
		t.Fatalf("slowed step %v, want %v", d, want)
	}
}

func TestHistogramsRecordLatencies(t *testing.T) {
	e := newEngine(t, testConfig())
	enqueue(t, e, 0, &Request{ID: 1, PromptTokens: 90, OutputTokens: 3})
	drain(t, e, 0)
	s := e.Stats()
	if s.TTFT.Count != 1 || s.ITL.Count != 2 || s.E2E.Count != 1 {
		t.Fatalf("counts TTFT %d ITL %d E2E %d, want 1, 2, 1", s.TTFT.Count, s.ITL.Count, s.E2E.Count)
	}
	// TTFT is 0.1 s: the 0.1 bucket (index 7) and every later cumulative count hold it.
	if cum := s.TTFT.Cumulative(); cum[6] != 0 || cum[7] != 1 {
		t.Fatalf("TTFT cumulative %v, want the 0.1 s bucket to hold the observation", cum)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := A100Llama8B(512).Validate(); err != nil {
		t.Fatalf("calibrated defaults invalid: %v", err)
	}
	bad := A100Llama8B(0)
	bad.PrefillTokensPerSec = 0
	err := bad.Validate()
	if err == nil {
		t.Fatal("zero block size and prefill rate accepted")
	}
	for _, field := range []string{"BlockTokens", "KVBlocks", "PrefillTokensPerSec"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
}

func TestCalibrationReproducesTheMeasurement(t *testing.T) {
	// The cited A100 sweep: about 13.3 ms per decode step at concurrency 1 and 16.2 ms at
	// concurrency 8, with 1024-token prompts.
	cfg := A100Llama8B(16)
	for _, tc := range []struct {
		batch int
		want  time.Duration
	}{{1, 13300 * time.Microsecond}, {8, 16200 * time.Microsecond}} {
		e := newEngine(t, cfg)
		for i := range tc.batch {
			enqueue(t, e, 0, &Request{ID: uint64(i), PromptTokens: 1024, OutputTokens: 128})
		}
		d, _ := e.StartStep(0)
		e.EndStep(d, nil)
		d, _ = e.StartStep(d)
		if diff := (d - tc.want).Abs(); diff > 300*time.Microsecond {
			t.Errorf("batch %d: decode step %v, measured %v", tc.batch, d, tc.want)
		}
	}
}
