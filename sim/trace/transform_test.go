package trace

import (
	"errors"
	"math"
	"testing"
	"time"
)

// evenTrace has n requests one second apart, InputTokens = index.
func evenTrace(n int) []Request {
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Arrival: time.Duration(i) * time.Second, InputTokens: i, OutputTokens: 1}
	}
	return reqs
}

func TestWithRate(t *testing.T) {
	tests := []struct {
		name string
		reqs []Request
		rps  float64
	}{
		{"speed up", evenTrace(100), 10},
		{"slow down", evenTrace(100), 0.25},
		{"two requests", evenTrace(2), 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.reqs[len(tt.reqs)-1].Arrival
			out, err := WithRate(tt.reqs, tt.rps)
			if err != nil {
				t.Fatal(err)
			}
			if got := MeanRate(out); math.Abs(got-tt.rps)/tt.rps > 1e-6 {
				t.Errorf("mean rate = %v, want %v", got, tt.rps)
			}
			if tt.reqs[len(tt.reqs)-1].Arrival != before {
				t.Errorf("input was modified")
			}
		})
	}
	for _, bad := range [][]Request{nil, evenTrace(1), {{Arrival: 5}, {Arrival: 5}}} {
		if _, err := WithRate(bad, 1); !errors.Is(err, ErrNoSpan) {
			t.Errorf("WithRate(%d requests without span) err = %v, want ErrNoSpan", len(bad), err)
		}
	}
	for _, rps := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if _, err := WithRate(evenTrace(3), rps); err == nil {
			t.Errorf("WithRate(rate %v) accepted", rps)
		}
	}
}

func TestWithSpeed(t *testing.T) {
	out, err := WithSpeed(evenTrace(5), 4)
	if err != nil {
		t.Fatal(err)
	}
	if out[4].Arrival != time.Second {
		t.Errorf("arrival of 4s at speed 4 = %v, want 1s", out[4].Arrival)
	}
	if _, err := WithSpeed(evenTrace(5), 0); err == nil {
		t.Error("speed 0 accepted")
	}
	if _, err := WithSpeed([]Request{{Arrival: time.Duration(math.MaxInt64 / 2)}}, 0.25); err == nil {
		t.Error("an overflowing arrival was accepted")
	}
}

func TestFirstAndWindow(t *testing.T) {
	reqs := evenTrace(10)
	tests := []struct {
		name      string
		got       []Request
		wantFirst int // InputTokens of the first kept request
		wantLen   int
		wantStart time.Duration
	}{
		{"first 3", First(reqs, 3), 0, 3, 0},
		{"first 0 keeps all", First(reqs, 0), 0, 10, 0},
		{"first 99 keeps all", First(reqs, 99), 0, 10, 0},
		{"window 2s-5s", Window(reqs, 2*time.Second, 5*time.Second), 2, 3, 0},
		{"window from 7s open", Window(reqs, 7*time.Second, 0), 7, 3, 0},
		{"window past end", Window(reqs, 20*time.Second, 0), -1, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.got) != tt.wantLen {
				t.Fatalf("len = %d, want %d", len(tt.got), tt.wantLen)
			}
			if tt.wantLen > 0 && (tt.got[0].InputTokens != tt.wantFirst || tt.got[0].Arrival != tt.wantStart) {
				t.Fatalf("first = %+v, want tokens %d at %v", tt.got[0], tt.wantFirst, tt.wantStart)
			}
		})
	}
	first := First(reqs, 2)
	first[0].InputTokens = 99
	if reqs[0].InputTokens != 0 {
		t.Error("First shares its backing array with the input")
	}
}

func TestSample(t *testing.T) {
	reqs := evenTrace(10000)
	a, err := Sample(reqs, 0.1, 42)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Sample(reqs, 0.1, 42)
	c, _ := Sample(reqs, 0.1, 43)
	if len(a) < 850 || len(a) > 1150 {
		t.Errorf("kept %d of 10000 at p=0.1", len(a))
	}
	if !sameTokens(a, b) {
		t.Error("same seed kept different requests")
	}
	if sameTokens(a, c) {
		t.Error("different seeds kept the same requests")
	}
	all, _ := Sample(reqs, 1, 1)
	if len(all) != len(reqs) {
		t.Errorf("p=1 kept %d of %d", len(all), len(reqs))
	}
	for _, p := range []float64{0, -0.5, 1.5, math.NaN()} {
		if _, err := Sample(reqs, p, 1); err == nil {
			t.Errorf("p=%v accepted", p)
		}
	}
}

func TestSummarize(t *testing.T) {
	reqs := []Request{
		{Arrival: 0, InputTokens: 10, OutputTokens: 1, HashIDs: []uint64{1, 2}},
		{Arrival: time.Second, InputTokens: 20, OutputTokens: 2, HashIDs: []uint64{1, 2, 3}},
		{Arrival: 2 * time.Second, InputTokens: 30, OutputTokens: 3, HashIDs: []uint64{4}},
		{Arrival: 4 * time.Second, InputTokens: 40, OutputTokens: 4},
	}
	s := Summarize(reqs)
	// 6 references, 4 unique: 2 hits.
	if s.BlockRefs != 6 || s.UniqueBlocks != 4 || math.Abs(s.HitRateUpperBound-2.0/6) > 1e-12 {
		t.Errorf("blocks = %d refs %d unique bound %v", s.BlockRefs, s.UniqueBlocks, s.HitRateUpperBound)
	}
	if s.Duration != 4*time.Second || s.MeanRate != 0.75 {
		t.Errorf("duration %v rate %v, want 4s and 0.75/s", s.Duration, s.MeanRate)
	}
	if s.Input.Mean != 25 || s.Input.P50 != 25 || s.Input.Max != 40 || s.Output.P90 != 3.7 {
		t.Errorf("input %+v output %+v", s.Input, s.Output)
	}
	if (Summarize(nil) != Stats{}) {
		t.Error("empty trace has non-zero stats")
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{1, 2, 3, 4}
	tests := []struct{ p, want float64 }{{0, 1}, {50, 2.5}, {100, 4}, {25, 1.75}, {-5, 1}, {150, 4}}
	for _, tt := range tests {
		if got := Percentile(v, tt.p); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("Percentile(%v) = %v, want %v", tt.p, got, tt.want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("percentile of nothing is not zero")
	}
}

// sameTokens compares the InputTokens sequences, which identify evenTrace rows.
func sameTokens(a, b []Request) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].InputTokens != b[i].InputTokens {
			return false
		}
	}
	return true
}

// Requests keep their order and sizes and take the other trace's arrivals from 0; past
// its end the arrivals repeat one span and one mean gap later.
func TestWithArrivalsOf(t *testing.T) {
	reqs := []Request{{InputTokens: 1}, {InputTokens: 2}, {InputTokens: 3}, {InputTokens: 4}, {InputTokens: 5}}
	times := []Request{{Arrival: 10 * time.Second}, {Arrival: 11 * time.Second}, {Arrival: 14 * time.Second}}
	got, err := WithArrivalsOf(reqs, times)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, time.Second, 4 * time.Second, 6 * time.Second, 7 * time.Second} // span 4 s, mean gap 2 s
	for i, r := range got {
		if r.Arrival != want[i] || r.InputTokens != i+1 {
			t.Errorf("request %d: arrival %v tokens %d, want %v and %d", i, r.Arrival, r.InputTokens, want[i], i+1)
		}
	}
	if reqs[1].Arrival != 0 {
		t.Error("the input was modified")
	}
	if _, err := WithArrivalsOf(reqs, times[:1]); !errors.Is(err, ErrNoSpan) {
		t.Errorf("one arrival: %v, want ErrNoSpan", err)
	}
}
