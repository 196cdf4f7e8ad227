package trace

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"slices"
	"time"
)

// Session traces are the JSON lines NVIDIA's AIPerf writes for multi-turn sessions
// (`aiperf synthesize agentic-code`, aiperf 0.13.0: aiperf/dataset/agentic_code_gen/writer.py).
// Each line is one turn of a session: session_id, input_length and hash_ids give the
// tokens the turn adds to the session's prompt (the first turn's are its whole prompt),
// output_length the turn's answer; the first turn carries timestamp (ms) and every later
// one delay (ms after the previous turn's answer ends). A turn's prompt is the session's
// previous prompt, the previous answer, then its own new tokens
// (session_synthesizer.py: input_length = prev_input + prev_output + new_tokens).
//
// The trace states no arrival times past each session's first turn, since a turn waits
// for the answer before it. The decoder replays the sessions as AIPerf's own simulation
// does (reporting/simulation_engine.py, SimulationConfig defaults): at most
// SessionConcurrency sessions at once, in file order, each starting when one ends, a
// turn's answer taking its uncached prompt tokens at SessionPrefillTPS (the new tokens
// and the previous answer) and its output at SessionDecodeTPS, served as if alone. The
// simulator then rescales those arrivals to the load it offers, like any trace's.
const (
	SessionConcurrency = 50
	SessionPrefillTPS  = 64000
	SessionDecodeTPS   = 200
)

// sessionRecord is one line of a session trace.
type sessionRecord struct {
	SessionID    string          `json:"session_id"`
	Timestamp    json.RawMessage `json:"timestamp"`
	Delay        json.RawMessage `json:"delay"`
	InputLength  json.RawMessage `json:"input_length"`
	OutputLength json.RawMessage `json:"output_length"`
	HashIDs      []uint64        `json:"hash_ids"`
}

// turn is one parsed line: the tokens it adds and the wait before it.
type turn struct {
	wait         time.Duration // timestamp for a first turn, delay for the others
	line         int
	in, out      int
	ids          []uint64
	conversation uint64
}

// sessionsDecoder reads the whole trace, then yields the turns as requests in arrival
// order.
type sessionsDecoder struct {
	reqs []Request
}

func newSessionsDecoder(r io.Reader, source string) (*sessionsDecoder, error) {
	lines := newJSONLines(r, source)
	var sessions [][]turn
	index := map[string]int{}
	var maxID uint64
	for {
		b, err := lines.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		line := lines.line
		var rec sessionRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, &ParseError{Source: source, Line: line, Err: fmt.Errorf("invalid JSON: %w", err)}
		}
		if rec.SessionID == "" {
			return nil, &ParseError{Source: source, Line: line, Field: "session_id", Err: errors.New("missing")}
		}
		t := turn{line: line}
		if t.in, err = requiredCount(rec.InputLength); err != nil {
			return nil, &ParseError{Source: source, Line: line, Field: "input_length", Err: err}
		}
		if t.out, err = requiredCount(rec.OutputLength); err != nil {
			return nil, &ParseError{Source: source, Line: line, Field: "output_length", Err: err}
		}
		if want := (t.in + BlockTokens - 1) / BlockTokens; len(rec.HashIDs) != want {
			return nil, &ParseError{Source: source, Line: line, Field: "hash_ids",
				Err: fmt.Errorf("%d ids for %d tokens: want %d (one per %d-token block)", len(rec.HashIDs), t.in, want, BlockTokens)}
		}
		t.ids = rec.HashIDs
		for _, id := range t.ids {
			maxID = max(maxID, id)
		}
		i, seen := index[rec.SessionID]
		field, raw := "delay", rec.Delay
		if !seen {
			field, raw = "timestamp", rec.Timestamp
			i = len(sessions)
			index[rec.SessionID] = i
			sessions = append(sessions, nil)
		}
		if t.wait, err = requiredMillis(raw); err != nil {
			return nil, &ParseError{Source: source, Line: line, Field: field, Err: err}
		}
		h := fnv.New64a()
		h.Write([]byte(rec.SessionID))
		t.conversation = h.Sum64() | 1 // never 0: 0 is "no conversation stated"
		sessions[i] = append(sessions[i], t)
	}
	reqs, err := replaySessions(sessions, maxID+1)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return &sessionsDecoder{reqs: reqs}, nil
}

func (d *sessionsDecoder) next() (Request, error) {
	if len(d.reqs) == 0 {
		return Request{}, io.EOF
	}
	r := d.reqs[0]
	d.reqs = d.reqs[1:]
	return r, nil
}

// maxSessionPrompt bounds a turn's whole prompt (every earlier turn's tokens and answers
// with its own), a hundred times the longest context any model serves: each turn holds an
// id per block of it.
const maxSessionPrompt = 1 << 24

// replaySessions builds each turn's whole prompt and its arrival (see SessionConcurrency).
// The previous answer's tokens take fresh block ids from next up: the trace names only
// the prompt's blocks.
func replaySessions(sessions [][]turn, next uint64) ([]Request, error) {
	var reqs []Request
	free := &endTimes{}
	for range min(SessionConcurrency, len(sessions)) {
		heap.Push(free, time.Duration(0))
	}
	for _, s := range sessions {
		start := heap.Pop(free).(time.Duration)
		at, err := later(start, s[0].wait)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", s[0].line, err)
		}
		var ids []uint64
		prompt, prevOut := 0, 0
		for k, t := range s {
			if k > 0 {
				if at, err = later(at, t.wait); err != nil {
					return nil, fmt.Errorf("line %d: %w", t.line, err)
				}
			}
			fresh := t.in
			if k == 0 {
				ids = slices.Clone(t.ids)
				prompt = t.in
			} else {
				prompt += prevOut + t.in
				if prompt > maxSessionPrompt {
					return nil, fmt.Errorf("line %d: the turn's whole prompt is %d tokens, past %d", t.line, prompt, maxSessionPrompt)
				}
				fresh += prevOut
				for range (prevOut + BlockTokens - 1) / BlockTokens {
					ids = append(ids, next)
					next++
				}
				ids = append(ids, t.ids...)
				want := (prompt + BlockTokens - 1) / BlockTokens
				for len(ids) < want {
					ids = append(ids, next)
					next++
				}
				ids = ids[:want]
			}
			reqs = append(reqs, Request{Arrival: at, InputTokens: prompt, OutputTokens: t.out,
				HashIDs: slices.Clip(slices.Clone(ids)), Conversation: t.conversation})
			if at, err = later(at, seconds(float64(fresh)/SessionPrefillTPS+float64(t.out)/SessionDecodeTPS)); err != nil {
				return nil, fmt.Errorf("line %d: %w", t.line, err)
			}
			prevOut = t.out
		}
		heap.Push(free, at)
	}
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmpDuration(a.Arrival, b.Arrival) })
	return reqs, nil
}

// later is at + d, or an error past the latest time a Duration holds.
func later(at, d time.Duration) (time.Duration, error) {
	if d > math.MaxInt64-at {
		return 0, errors.New("the session's turns and waits run past 292 years")
	}
	return at + d, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// endTimes is a min-heap of the times the session slots free up.
type endTimes []time.Duration

func (h endTimes) Len() int           { return len(h) }
func (h endTimes) Less(i, j int) bool { return h[i] < h[j] }
func (h endTimes) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *endTimes) Push(x any)        { *h = append(*h, x.(time.Duration)) }
func (h *endTimes) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
