package trace

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Two sessions of AIPerf's format: a's second turn adds 600 tokens after a 1,000-token
// prompt and a 700-token answer, 2 s after that answer ends.
const twoSessions = `{"session_id":"a","input_length":1000,"output_length":700,"hash_ids":[0,1],"timestamp":0.0,"group_id":3}
{"session_id":"b","input_length":512,"output_length":10,"hash_ids":[0],"timestamp":0.0}
{"session_id":"a","input_length":600,"output_length":5,"hash_ids":[9,10],"delay":2000.0}
`

func TestReadSessionsBuildsEachTurnsWholePrompt(t *testing.T) {
	reqs, err := Read(strings.NewReader(twoSessions), "sessions", FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 {
		t.Fatalf("%d requests, want 3", len(reqs))
	}
	a1, b1, a2 := reqs[0], reqs[1], reqs[2]
	if a1.InputTokens != 1000 || b1.InputTokens != 512 {
		t.Fatalf("first turns: %d and %d tokens, want 1000 and 512", a1.InputTokens, b1.InputTokens)
	}
	// The second turn's prompt is the first prompt, its answer, then the new tokens.
	if a2.InputTokens != 1000+700+600 || a2.OutputTokens != 5 {
		t.Fatalf("second turn: %d in / %d out, want 2300 / 5", a2.InputTokens, a2.OutputTokens)
	}
	if want := (2300 + BlockTokens - 1) / BlockTokens; len(a2.HashIDs) != want {
		t.Fatalf("second turn: %d ids, want %d", len(a2.HashIDs), want)
	}
	if !slices.Equal(a2.HashIDs[:2], a1.HashIDs) {
		t.Errorf("second turn's ids %v do not start with the first's %v", a2.HashIDs, a1.HashIDs)
	}
	// The answer's two blocks take ids no turn names; the new tokens keep theirs.
	if got := a2.HashIDs[2:4]; got[0] <= 10 || got[1] <= 10 || got[0] == got[1] {
		t.Errorf("the answer's blocks have ids %v, want two fresh ones above the trace's", got)
	}
	if a2.HashIDs[4] != 9 {
		t.Errorf("the new tokens' first block is %d, want 9 (the trace's)", a2.HashIDs[4])
	}
	// Arrivals: both sessions start at once; a's second turn waits for the first answer
	// (1000 tokens at SessionPrefillTPS, 700 at SessionDecodeTPS), then the delay.
	want := time.Duration((1000.0/SessionPrefillTPS+700.0/SessionDecodeTPS)*float64(time.Second)) + 2*time.Second
	if a1.Arrival != 0 || b1.Arrival != 0 || a2.Arrival != want {
		t.Errorf("arrivals %v %v %v, want 0 0 %v", a1.Arrival, b1.Arrival, a2.Arrival, want)
	}
	if a1.Conversation == 0 || a1.Conversation != a2.Conversation || a1.Conversation == b1.Conversation {
		t.Errorf("conversations %x %x %x: want a's two turns alike, b's apart, none 0", a1.Conversation, a2.Conversation, b1.Conversation)
	}
}

func TestReadSessionsRunsAtMostSessionConcurrencyAtOnce(t *testing.T) {
	var b strings.Builder
	for i := range SessionConcurrency + 1 {
		fmt.Fprintf(&b, `{"session_id":"s%d","input_length":512,"output_length":200,"hash_ids":[%d],"timestamp":0}`+"\n", i, i)
	}
	reqs, err := Read(strings.NewReader(b.String()), "sessions", FormatSessions)
	if err != nil {
		t.Fatal(err)
	}
	// The last session starts when the first one's only turn has been answered.
	last := reqs[len(reqs)-1]
	want := time.Duration((512.0/SessionPrefillTPS + 200.0/SessionDecodeTPS) * float64(time.Second))
	if last.Arrival != want {
		t.Fatalf("session %d starts at %v, want %v (a slot frees then)", SessionConcurrency, last.Arrival, want)
	}
	for _, r := range reqs[:SessionConcurrency] {
		if r.Arrival != 0 {
			t.Fatalf("one of the first %d sessions starts at %v, want 0", SessionConcurrency, r.Arrival)
		}
	}
}

func TestReadSessionsErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"input_length":2,"output_length":3,"hash_ids":[1],"timestamp":0}` + "\n" + `{"session_id":"a"}`, "sessions:1: session_id: missing"},
		{`{"session_id":"a","input_length":2,"output_length":3,"hash_ids":[1,2],"timestamp":0}`, "hash_ids: 2 ids for 2 tokens: want 1"},
		{`{"session_id":"a","input_length":2,"output_length":3,"hash_ids":[1]}`, "timestamp: missing"},
		{`{"session_id":"a","input_length":2,"output_length":3,"hash_ids":[1],"timestamp":0}` + "\n" +
			`{"session_id":"a","input_length":2,"output_length":3,"hash_ids":[2]}`, "sessions:2: delay: missing"},
		{`{"session_id":"a","input_length":-2,"output_length":3,"hash_ids":[],"timestamp":0}`, "input_length"},
		{`{"session_id":"a","input_length":2,"output_length":3,"hash_ids":[1],"timestamp":-5}`, "timestamp: -5 ms"},
		// An answer of 2^31 tokens makes the next turn's prompt longer than any context.
		{`{"session_id":"a","input_length":2,"output_length":2147483647,"hash_ids":[1],"timestamp":0}` + "\n" +
			`{"session_id":"a","input_length":2,"output_length":3,"hash_ids":[2],"delay":0}`, "sessions: line 2: the turn's whole prompt is 2147483651 tokens, past 16777216"},
		{`{"session_id":"a","input_length":2,"output_length":3,"hash_ids":[1],"timestamp":5e12}` + "\n" +
			`{"session_id":"a","input_length":2,"output_length":3,"hash_ids":[2],"delay":5e12}`, "line 2: the session's turns and waits run past 292 years"},
	}
	for _, tt := range tests {
		_, err := Read(strings.NewReader(tt.in), "sessions", FormatSessions)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tt.in, err, tt.want)
		}
	}
}

func TestReadAgenticCodeSessionsTrace(t *testing.T) {
	reqs, err := ReadFile(repoTrace(t, "aiperf_agentic_code_sessions.jsonl"), FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(reqs)
	// Figures from traces/README.md.
	checks := []struct {
		name      string
		got, want int
	}{
		{"requests", s.Requests, 8771},
		{"input p50", int(s.Input.P50 + 0.5), 75739},
		{"output p50", int(s.Output.P50 + 0.5), 790},
		{"duration s", int(s.Duration.Seconds() + 0.5), 2043},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if got := int(s.HitRateUpperBound*10000 + 0.5); got != 9118 {
		t.Errorf("hit rate upper bound = %.4f, want 0.9118", s.HitRateUpperBound)
	}
	convs := map[uint64]bool{}
	for i, r := range reqs {
		if want := (r.InputTokens + BlockTokens - 1) / BlockTokens; len(r.HashIDs) != want {
			t.Fatalf("request %d: %d hash ids for %d tokens, want %d", i, len(r.HashIDs), r.InputTokens, want)
		}
		if r.InputTokens+r.OutputTokens > 131072 {
			t.Fatalf("request %d: %d + %d tokens, past Llama-3.1's 128k context", i, r.InputTokens, r.OutputTokens)
		}
		convs[r.Conversation] = true
	}
	if len(convs) < 1000 {
		t.Errorf("%d conversations, want one per session (over 1,000)", len(convs))
	}
}
