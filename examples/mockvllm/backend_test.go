package main

import (
	"testing"

	"github.com/meridian-router/meridian/sim/engine"
)

// The engine reports a request's last token and then its end; a stream that looks between
// the two must already see the request done, or it sends the last token's chunk without
// the finish_reason and has nothing left to put it on (TestNChoicesEachGetTheirTokens
// failed that way now and then).
func TestTheLastTokenReportsTheRequestDone(t *testing.T) {
	for _, first := range []bool{true, false} {
		b := &modelBackend{streams: map[*engine.Request]*stream{}}
		r := &engine.Request{OutputTokens: 4, Generated: 3}
		if first {
			r.OutputTokens, r.Generated = 1, 1
		}
		s := newStream()
		b.streams[r] = s
		if first {
			b.FirstToken(r, 0)
		} else {
			b.Token(r, 0)
			if gen, _, done := s.snapshot(); gen != 3 || done {
				t.Fatalf("token 3 of 4: gen %d, done %v", gen, done)
			}
			r.Generated = 4
			b.Token(r, 0)
		}
		if gen, _, done := s.snapshot(); gen != r.OutputTokens || !done {
			t.Errorf("last token (first token too: %v): gen %d, done %v; want %d and done before Finished", first, gen, done, r.OutputTokens)
		}
	}
}
