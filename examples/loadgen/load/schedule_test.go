package load

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

func TestOpenLoopArrivals(t *testing.T) {
	tests := []struct {
		name    string
		o       OpenLoop
		wantN   int
		maxCV   float64 // coefficient of variation of the gaps
		minCV   float64
		rateTol float64
	}{
		{"uniform", OpenLoop{Rate: 40, Uniform: true, Count: 200}, 200, 0.001, 0, 1e-9},
		{"poisson", OpenLoop{Rate: 40, Count: 5000, Seed: 3}, 5000, 1.1, 0.9, 0.05},
		{"poisson by duration", OpenLoop{Rate: 100, Duration: 30 * time.Second, Seed: 4}, -1, 1.1, 0.9, 0.05},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.o.PromptTokens, tt.o.OutputTokens = 1, 1
			if err := tt.o.Validate(); err != nil {
				t.Fatal(err)
			}
			reqs := slices.Collect(tt.o.Requests())
			if tt.wantN >= 0 && len(reqs) != tt.wantN {
				t.Fatalf("%d requests, want %d", len(reqs), tt.wantN)
			}
			if tt.o.Duration > 0 && reqs[len(reqs)-1].Arrival >= tt.o.Duration {
				t.Fatalf("last arrival %v is past the duration", reqs[len(reqs)-1].Arrival)
			}
			if got := trace.MeanRate(reqs); math.Abs(got-tt.o.Rate)/tt.o.Rate > tt.rateTol+0.001 {
				t.Errorf("mean rate %.3f, want %.1f", got, tt.o.Rate)
			}
			var sum, sq float64
			for i := 1; i < len(reqs); i++ {
				g := (reqs[i].Arrival - reqs[i-1].Arrival).Seconds()
				sum += g
				sq += g * g
			}
			n := float64(len(reqs) - 1)
			mean := sum / n
			cv := math.Sqrt(max(0, sq/n-mean*mean)) / mean
			if cv < tt.minCV || cv > tt.maxCV {
				t.Errorf("gap coefficient of variation %.3f, want within [%.2f, %.2f]", cv, tt.minCV, tt.maxCV)
			}
		})
	}
}

func TestOpenLoopSameSeedSameSchedule(t *testing.T) {
	o := OpenLoop{Rate: 10, Count: 50, Seed: 9, PromptTokens: 1, OutputTokens: 1, PrefixGroups: 3, PrefixBlocks: 1}
	a, b := slices.Collect(o.Requests()), slices.Collect(o.Requests())
	o.Seed = 10
	c := slices.Collect(o.Requests())
	if a[49].Arrival != b[49].Arrival || a[49].HashIDs[0] != b[49].HashIDs[0] {
		t.Error("same seed, different schedule")
	}
	if a[49].Arrival == c[49].Arrival {
		t.Error("different seeds, same arrivals")
	}
}

func TestOpenLoopPrefixGroups(t *testing.T) {
	o := OpenLoop{Rate: 10, Count: 300, PromptTokens: 4 * trace.BlockTokens, OutputTokens: 1, PrefixGroups: 3, PrefixBlocks: 2}
	reqs := slices.Collect(o.Requests())
	syn, err := trace.NewSynthesizer(64, 0)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[uint64]int{}
	for i, r := range reqs {
		if len(r.HashIDs) != 4 {
			t.Fatalf("request %d has %d blocks, want 4", i, len(r.HashIDs))
		}
		groups[r.HashIDs[0]]++
		for j := range i {
			other := reqs[j]
			p, q := syn.Prompt(r, uint64(i)), syn.Prompt(other, uint64(j))
			shared := commonPrefix(p, q) / 64
			want := 0
			if r.HashIDs[0] == other.HashIDs[0] {
				want = 2
			}
			if shared != want {
				t.Fatalf("requests %d and %d share %d blocks, want %d", i, j, shared, want)
			}
		}
	}
	if len(groups) != 3 {
		t.Fatalf("%d groups used, want 3", len(groups))
	}
	for g, n := range groups {
		if n < 60 {
			t.Errorf("group %x got %d of 300 requests", g, n)
		}
	}
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestOpenLoopValidate(t *testing.T) {
	base := OpenLoop{Rate: 1, Count: 1, PromptTokens: 1, OutputTokens: 1}
	tests := []struct {
		name   string
		mutate func(*OpenLoop)
		want   string
	}{
		{"rate", func(o *OpenLoop) { o.Rate = 0 }, "rate"},
		{"unbounded", func(o *OpenLoop) { o.Count = 0 }, "bounded"},
		{"negative duration", func(o *OpenLoop) { o.Duration = -time.Second }, "negative"},
		{"prompt", func(o *OpenLoop) { o.PromptTokens = 0 }, "prompt tokens"},
		{"groups", func(o *OpenLoop) { o.PrefixGroups = -1 }, "prefix groups"},
	}
	for _, tt := range tests {
		o := base
		tt.mutate(&o)
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tt.name, err, tt.want)
		}
		if n := len(slices.Collect(o.Requests())); n != 0 {
			t.Errorf("%s: invalid schedule yielded %d requests", tt.name, n)
		}
	}
}

func TestReplayKeepsArrivalsAndSharedPrefixes(t *testing.T) {
	reqs := []trace.Request{
		{Arrival: 0, InputTokens: 1500, OutputTokens: 2, HashIDs: []uint64{1, 2, 3}},
		{Arrival: 100 * time.Millisecond, InputTokens: 1500, OutputTokens: 2, HashIDs: []uint64{1, 2, 4}},
		{Arrival: 200 * time.Millisecond, InputTokens: 1000, OutputTokens: 2, HashIDs: []uint64{5, 2}},
	}
	eng := &fakeEngine{name: "e", tokens: 1}
	cfg := testConfig(t, eng.start(t))
	starts := map[int]time.Duration{}
	cfg.OnResult = func(r Result) { starts[r.Index] = r.Start }
	if s := run(t, cfg, slices.Values(reqs)); s.OK != 3 {
		t.Fatalf("summary %+v", s)
	}
	// Never early, and late by less than the 100 ms gap to the next one.
	for i, r := range reqs {
		if st := starts[i]; st < r.Arrival || st >= r.Arrival+100*time.Millisecond {
			t.Errorf("request %d sent at %v, scheduled at %v", i, st, r.Arrival)
		}
	}
	bodies, _, _ := eng.seen()
	onWire := map[string]bool{}
	for _, b := range bodies {
		onWire[b.Messages[0].Content] = true
	}
	p := func(i int) string {
		prompt := cfg.Synth.Prompt(reqs[i], uint64(i))
		if !onWire[prompt] {
			t.Fatalf("the server never received the prompt of request %d", i)
		}
		return prompt
	}
	bb := cfg.Synth.BlockBytes()
	if got := commonPrefix(p(0), p(1)); got/bb != 2 {
		t.Errorf("requests 0 and 1 share %d bytes, want 2 blocks of %d", got, bb)
	}
	if got := commonPrefix(p(0), p(2)); got >= bb {
		t.Errorf("requests 0 and 2 share %d bytes, want less than a block", got)
	}
	if len(p(0)) != 3*bb {
		t.Errorf("prompt of 3 blocks has %d bytes", len(p(0)))
	}
}
