package sim

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// TestHomeRetentionSeesTheCacheTurnOver sends one conversation's prompt to a single engine
// whose KV cache holds three such prompts, again at once, and again after four other
// prompts have passed through: the second request finds its whole prompt cached, the
// third finds none of it, with more than a cache written since.
func TestHomeRetentionSeesTheCacheTurnOver(t *testing.T) {
	var b strings.Builder
	for i, blocks := range [][2]int{{1, 2}, {1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}, {1, 2}} {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1000, "output_length": 1, "hash_ids": [%d, %d]}`+"\n",
			i*10000, blocks[0], blocks[1])
	}
	reqs, err := trace.Read(strings.NewReader(b.String()), "t.jsonl", trace.FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	ecfg := engine.Config{MaxNumSeqs: 8, MaxBatchedTokens: 8192, BlockTokens: trace.BlockTokens,
		KVBlocks: 6, PrefillTokensPerSec: 100000, ContextTokensPerSec: 1e9,
		StepBase: time.Millisecond, DecodeSeqCost: time.Millisecond}
	cfg := &Config{Trace: reqs, Regions: []string{"r0"}, EnginesPerRegion: 1, RTT: [][]time.Duration{{0}},
		Engine: ecfg, Load: 0.01, Scenario: Steady, Policies: []string{"round-robin"}, Seed: 1}
	results, _, err := Run(context.Background(), cfg, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	bands := results[0].HomeRetention
	if len(bands) != 2 || bands[0].Requests != 1 || bands[1].Requests != 1 {
		t.Fatalf("home retention %+v, want two bands of one request each (the two returns of [1 2])", bands)
	}
	if again := bands[0]; again.WritesTo > 0.5 || again.PromptCached != 1 || again.Returned != 1 {
		t.Errorf("the prompt sent again at once: %+v, want it all cached, under half a cache written since", again)
	}
	if late := bands[1]; late.WritesFrom < 1 || late.PromptCached != 0 || late.Returned != 1 {
		t.Errorf("the prompt after four others: %+v, want none of it cached, a cache or more written since", late)
	}
}
